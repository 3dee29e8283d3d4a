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
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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

// An open, validated dataset. Offsets live in memory (8 bytes per record); tokens and masks are read
// per record (hyperslabs), so a dataset of billions of tokens does not have to fit in every rank's RAM.
class TokenDataset {
 public:
  // Opens and validates: the three datasets exist with the right types and ranks, offsets[0] = 0,
  // offsets monotone with no empty record, offsets[nseq] = N = len(loss_mask), at least one record,
  // every id in [0, target_vocab_size). Each violation: fatal BadInput naming the file (and the record
  // where there is one). target_vocab_size <= 0 means "use the file's vocab_size attribute".
  TokenDataset(const std::string& path, int target_vocab_size);
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  const std::string& path() const { return path_; }
  size_t num_records() const { return offsets_.size() - 1; }
  int64_t num_tokens() const { return offsets_.back(); }
  int64_t record_length(size_t r) const { return offsets_[r + 1] - offsets_[r]; }
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
                   int64_t max_tokens = -1, bool check_file = true) const;
  // A file truncated, rewritten or replaced since it was opened (its size, modification time or inode
  // changed) is a fatal BadInput: HDF5 would read zeros past the end, and the drafter would train on
  // them. Call after reading and before using what was read.
  void check_unchanged() const;
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

struct LoaderOptions {
  int64_t token_budget = 32768;  // max tokens per packed batch (--token-budget)
  int prefetch_depth = 4;        // max batches waiting in the queue (--prefetch-depth)
  int max_epochs = 1;            // 0 = repeat forever (--epochs)
  uint64_t seed = 0;             // shuffle seed (--seed)
  LongRecord long_record = LongRecord::Cut;
  int shard_index = 0;           // this target's index among the targets feeding from the dataset
  int num_shards = 1;            // number of targets
};

// Where the next batch starts: enough to restart the loader so it produces exactly the batches a
// run that never stopped would have produced. The shuffle of epoch e is a pure function of
// (seed, e), so (epoch, cursor) is the whole RNG state; seed and sharding are kept to refuse a
// position from a different setup.
struct DataPosition {
  int64_t epoch = 0;     // 0-based
  int64_t cursor = 0;    // index into this shard's record order of the epoch
  int64_t batches = 0;   // batches produced before this position (LoadedBatch::index continues from it)
  uint64_t seed = 0;
  int shard_index = 0;
  int num_shards = 1;
  std::string to_string() const;                        // "dflash-data-pos v1 epoch=.. cursor=.. ..."
  static DataPosition parse(const std::string& text);   // fatal BadInput on a malformed string
  bool operator==(const DataPosition& o) const;
};

struct LoadedBatch {
  PackedBatch batch;
  int64_t index = 0;         // 0-based batch number since epoch 0 (continues across a resume)
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
  Loader(std::shared_ptr<const TokenDataset> dataset, const LoaderOptions& opts);
  Loader(std::shared_ptr<const TokenDataset> dataset, const LoaderOptions& opts, const DataPosition& start);
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
  // Records in this shard per epoch (the same every epoch).
  int64_t shard_records_per_epoch() const;
  // Stops and joins the thread; queued batches are dropped. Idempotent; never blocks for long.
  void stop();

  // The record order of `epoch` for this shard (exposed for tests and tools).
  static std::vector<int64_t> shard_order(size_t num_records, uint64_t seed, int64_t epoch, int shard_index,
                                          int num_shards);

 private:
  void run();
  void init(const DataPosition& start);

  std::shared_ptr<const TokenDataset> dataset_;
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
