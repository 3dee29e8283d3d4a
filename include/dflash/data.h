// Token datasets (HDF5, docs/data.md) and the loader thread that feeds a target rank.
//
// File layout (format_version 1):
//   /tokens    int32 [N]         every record's token ids, concatenated
//   /offsets   int64 [nseq + 1]  record r is tokens[offsets[r] .. offsets[r+1]); offsets[0] = 0, offsets[nseq] = N
//   /loss_mask uint8 [N]         1 where the token may be a training position, 0 for prompts
//   attributes on /: vocab_size (int), tokenizer (string), format_version (int)
//
// The loader: one std::thread per target rank. Target i of n takes, in every epoch, the records at
// positions j % n == i of that epoch's seeded shuffle, packs whole records into batches of at most
// token_budget tokens and pushes them into a bounded queue (depth = prefetch_depth; its current depth is
// the q_pre of the status line). Same seed and position -> same batches, bit for bit.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dflash/data_position.h"
#include "dflash/packed_batch.h"

namespace dflash {

constexpr int kTokenDatasetFormatVersion = 1;

// Every HDF5 call in dflash (datasets, metrics) holds this lock: the library on the GPU machines is not
// guaranteed to be built thread-safe, and the loader thread reads while the main thread may write metrics.
std::mutex& hdf5_mutex();

// ---- the dataset -------------------------------------------------------------------------------------

// Records built in memory (by dflash-prep, dflash-make-tiny and tests), then written in one go.
struct TokenRecords {
  std::vector<int32_t> tokens;        // [N]
  std::vector<int64_t> offsets{0};    // [nseq + 1]
  std::vector<uint8_t> loss_mask;     // [N]
  // Appends one record; mask may be empty (= all 1), else it must have ids.size() entries.
  void add(const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask = {});
  size_t num_records() const { return offsets.size() - 1; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

// Writes records to path atomically (temp file in the same directory, then rename), so an existing
// dataset is never left half-written. Fatal BadInput if records is empty or has an empty record.
void write_token_dataset(const std::string& path, const TokenRecords& records, int vocab_size,
                         const std::string& tokenizer);

// JSONL -> dataset conversion (dflash-prep). Each non-blank line is one pre-tokenized record:
//   {"input_ids": [int, ...], "loss_mask": [0|1, ...]}      (loss_mask optional = all 1)
// A bad line (not JSON, no/empty input_ids, an id outside [0, vocab_size), a mask of the wrong length or
// with values other than 0/1) is a fatal BadInput "IN:LINE: what". progress: prints a progress line to
// stderr about once a second while reading large inputs.
enum class Progress { Quiet, Stderr };
struct PrepResult {
  int64_t records = 0;
  int64_t tokens = 0;
  int64_t loss_tokens = 0;  // tokens with loss_mask = 1
};
TokenRecords read_jsonl_records(const std::string& jsonl_path, int vocab_size, Progress progress);
PrepResult convert_jsonl_to_dataset(const std::string& jsonl_path, const std::string& out_path, int vocab_size,
                                    const std::string& tokenizer, Progress progress);

// What the loader, the packing (pack_extent), the lr plan and the resume read: records by id, [0,
// num_records()). A TokenDataset (one file), or a DatasetMix (several files, weighted: data_mix.h), whose
// "records" are the mix's slots.
class RecordSource {
 public:
  virtual ~RecordSource() = default;
  virtual size_t num_records() const = 0;
  virtual int64_t record_length(size_t r) const = 0;
  // Appends the first min(record_length(r), max_tokens) tokens and mask entries of record r (max_tokens < 0:
  // all); then, unless check_file is false, check_unchanged(). Thread-safe.
  virtual void read_record(size_t r, std::vector<int32_t>& tokens, std::vector<uint8_t>& loss_mask,
                           int64_t max_tokens = -1, bool check_file = true) const = 0;
  // Fatal BadInput when a file read from changed since it was opened.
  virtual void check_unchanged() const = 0;
  virtual const std::string& path() const = 0;  // for messages: the file (a mix: its files, "a.h5 + b.h5")
};

// Fatal BadInput naming the file when a dataset tokenized for a vocabulary of dataset_vocab ids cannot be
// the target's (target_vocab embedding rows: the same, or a few padding rows more). TokenDataset and the dry
// run (which reads only the attribute) ask it.
void check_dataset_vocabulary(const std::string& path, int dataset_vocab, int target_vocab);

// An open, validated dataset. Offsets live in memory (8 bytes per record); tokens and masks are read
// per record (hyperslabs), so a dataset of billions of tokens does not have to fit in every rank's RAM.
class TokenDataset : public RecordSource {
 public:
  // Opens and validates: the three datasets exist with the right types and ranks, offsets[0] = 0,
  // offsets monotone with no empty record, offsets[nseq] = N = len(loss_mask), at least one record,
  // every id in [0, target_vocab_size). Each violation: fatal BadInput naming the file (and the record
  // where there is one). target_vocab_size <= 0 means "use the file's vocab_size attribute".
  TokenDataset(const std::string& path, int target_vocab_size);
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  const std::string& path() const override { return path_; }
  size_t num_records() const override { return offsets_.size() - 1; }
  int64_t num_tokens() const { return offsets_.back(); }
  int64_t record_length(size_t r) const override { return offsets_[r + 1] - offsets_[r]; }
  int vocab_size() const { return vocab_size_; }            // the file's attribute
  int64_t file_bytes() const { return stamp_.size; }        // the file's size when it was opened
  // Tokens with loss_mask 1, and anchor positions: p with loss_mask[p] and loss_mask[p + 1] inside one
  // record (anchors.h). A dataset without an anchor position trains nothing.
  int64_t loss_tokens() const { return loss_tokens_; }
  int64_t anchor_positions() const { return anchor_positions_; }
  const std::string& tokenizer() const { return tokenizer_; }
  int format_version() const { return format_version_; }

  // Appends the first min(record_length(r), max_tokens) tokens and mask entries of record r
  // (max_tokens < 0: the whole record). Thread-safe (takes hdf5_mutex()). Then, unless check_file is
  // false (the loader checks once per batch instead: a stat per record is costly on network filesystems),
  // check_unchanged().
  void read_record(size_t r, std::vector<int32_t>& tokens, std::vector<uint8_t>& loss_mask,
                   int64_t max_tokens = -1, bool check_file = true) const override;
  // A file truncated, rewritten or replaced since it was opened (its size, modification time or inode
  // changed) is a fatal BadInput: HDF5 would read zeros past the end, and the drafter would train on
  // them. Call after reading and before using what was read.
  void check_unchanged() const override;
  // Identity, size and modification time of the file when it was opened: two --data naming one file are
  // found by it (dev, ino).
  uint64_t file_device() const { return stamp_.dev; }
  uint64_t file_inode() const { return stamp_.ino; }
  // Reads everything into memory (tests, small tools).
  TokenRecords read_all() const;

 private:
  std::string path_;
  int64_t file_ = -1, tokens_ds_ = -1, mask_ds_ = -1;  // hid_t
  std::vector<int64_t> offsets_;
  int vocab_size_ = 0;
  std::string tokenizer_;
  int format_version_ = 0;
  int64_t loss_tokens_ = 0, anchor_positions_ = 0;
  // The file as opened: what read_record compares against.
  struct FileStamp {
    uint64_t dev = 0, ino = 0;
    int64_t size = 0, mtime_ns = 0;
  } stamp_;
};

// ---- the loader --------------------------------------------------------------------------------------

// What happens to a record longer than the token budget (--long-record).
enum class LongRecord { Cut, Skip };  // Cut: keep its first token_budget tokens; Skip: drop it

// What happens to a record longer than --token-budget. Error (the default) refuses to start, naming the
// record, so nothing is silently cut or dropped; Cut and Skip map onto the loader's LongRecord.
enum class LongRecordPolicy : uint8_t { Error, Cut, Skip };
const char* long_record_name(LongRecordPolicy p);

// ---- epochs begun under another split -----------------------------------------------------------------
// A run resumed on another number of targets (docs/checkpoint.md "Changing the split") finishes the epochs
// its earlier split had begun: each such epoch keeps the set of records the earlier split consumed (trained
// on, or passed over as too long), and this run's shards deal out the epoch's OTHER records in the epoch's
// shuffled order (the j-th of the rest -> target j % n). An epoch without an entry is whole.
class RecordSet {  // a set of record ids [0, n), one bit each
 public:
  RecordSet() = default;
  explicit RecordSet(size_t n) : n_(n), bits_((n + 7) / 8, 0) {}
  size_t size() const { return n_; }  // n: the dataset's records
  bool test(size_t r) const { return (bits_[r >> 3] >> (r & 7)) & 1u; }
  void set(size_t r) { bits_[r >> 3] = static_cast<uint8_t>(bits_[r >> 3] | (1u << (r & 7))); }
  size_t count() const;                                   // records in the set
  const std::vector<uint8_t>& bytes() const { return bits_; }  // ceil(n / 8) bytes, record r = bit r % 8 of byte r / 8
  // Fatal BadInput when bytes is not ceil(n / 8) long or sets bits past n.
  static RecordSet from_bytes(size_t n, std::vector<uint8_t> bytes);
  bool operator==(const RecordSet& o) const { return n_ == o.n_ && bits_ == o.bits_; }

 private:
  size_t n_ = 0;
  std::vector<uint8_t> bits_;
};
using ConsumedRecords = std::map<int64_t, RecordSet>;  // epoch -> records an earlier split consumed

struct LoaderOptions {
  int64_t token_budget = 32768;  // max tokens per packed batch (--token-budget)
  int prefetch_depth = 4;        // max batches waiting in the queue (--prefetch-depth)
  int max_epochs = 1;            // 0 = repeat forever (--epochs)
  uint64_t seed = 0;             // shuffle seed (--seed)
  LongRecord long_record = LongRecord::Cut;
  int shard_index = 0;           // this target's index among the targets feeding from the dataset
  int num_shards = 1;            // number of targets
  // Epochs begun under an earlier split: their consumed records are left out (null: every epoch whole).
  std::shared_ptr<const ConsumedRecords> consumed;
};

// The loader's packing rule, in one place (Loader::run, count_epoch_batches and the resume's replay of a
// split's batches use it): from `cursor` in an epoch's record order, whole records while they fit
// token_budget; a record longer than the budget is cut to its first token_budget tokens (it then fills a
// batch of its own) or, with LongRecord::Skip, passed over.
struct BatchExtent {
  int64_t end = 0;                                 // the cursor after this batch
  std::vector<std::pair<int64_t, int64_t>> taken;  // (record, tokens taken) in order; empty: only skipped ones were left
  int64_t records_skipped = 0, tokens_skipped = 0; // passed over (Skip)
  int64_t records_cut = 0, tokens_cut = 0;         // cut to the budget (Cut): tokens dropped
};
BatchExtent pack_extent(const RecordSource& ds, const std::vector<int64_t>& order, int64_t cursor, int64_t token_budget,
                        LongRecord long_record);

struct LoadedBatch {
  PackedBatch batch;
  int64_t index = 0;         // 0-based batch number since epoch 0 (continues across a resume)
  int64_t epoch = 0;         // the epoch its records belong to
  std::vector<int64_t> records;  // their record ids, in order
  DataPosition next;         // position right after this batch (save it to resume after this batch)
  double epoch_progress = 0; // epochs completed at `next`, fractional (the status line's epoch~)
};

// Counts since the loader started (they follow production, which runs ahead of consumption).
struct LoaderStats {
  int64_t batches = 0;
  int64_t records = 0;          // records packed (cut ones included)
  int64_t records_cut = 0;      // longer than the budget, cut to it (LongRecord::Cut)
  int64_t records_skipped = 0;  // longer than the budget, dropped (LongRecord::Skip)
  int64_t tokens = 0;           // tokens packed
  int64_t tokens_dropped = 0;   // tokens lost to cutting or skipping
};

enum class PopResult { Batch, EndOfData, Timeout };

class Loader {
 public:
  // Starts the thread at `start` (default: epoch 0, cursor 0). A start position whose seed or sharding
  // differs from opts is a fatal BadInput (the batches would not be the ones the saved run would see).
  Loader(std::shared_ptr<const RecordSource> dataset, const LoaderOptions& opts);
  Loader(std::shared_ptr<const RecordSource> dataset, const LoaderOptions& opts, const DataPosition& start);
  ~Loader();  // stop()
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Waits up to `timeout` for the next batch. Batch: `out` holds it. EndOfData: max_epochs done and the
  // queue drained (also after stop()). Timeout: nothing arrived in time (the caller decides).
  PopResult pop(LoadedBatch& out, std::chrono::milliseconds timeout);
  // Current queue depth (q_pre).
  int queue_depth() const;
  // Position after the last popped batch (the start position before the first pop).
  DataPosition position() const;
  LoaderStats stats() const;
  // Records in this shard in `epoch` (the same every epoch, but for epochs begun under an earlier split).
  int64_t shard_records(int64_t epoch) const;
  // Stops and joins the thread; queued batches are dropped. Idempotent; never blocks for long.
  void stop();

  // The record order of `epoch` for this shard (exposed for tests and tools): the epoch's seeded shuffle,
  // less the records `consumed` holds for the epoch, dealt out j % num_shards == shard_index.
  static std::vector<int64_t> shard_order(size_t num_records, uint64_t seed, int64_t epoch, int shard_index,
                                          int num_shards, const ConsumedRecords* consumed = nullptr);

 private:
  void run();
  void init(const DataPosition& start);
  double epoch_progress(const DataPosition& at, size_t shard_size) const;
  std::map<int64_t, double> consumed_share_;  // epochs an earlier split began: the share it consumed

  std::shared_ptr<const RecordSource> dataset_;
  LoaderOptions opts_;
  DataPosition start_;
  mutable std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<LoadedBatch> queue_;
  bool producer_done_ = false;
  std::atomic<bool> stop_{false};
  DataPosition consumed_;
  LoaderStats stats_;
  std::thread thread_;
};

}  // namespace dflash
