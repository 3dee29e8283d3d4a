// The loader thread: per-epoch seeded shuffle, sharding by target, packing to the token budget, bounded
// prefetch queue. See include/dflash/data.h.
#include <cinttypes>
#include <cstdio>
#include <sstream>

#include "dflash/data.h"
#include "dflash/error.h"

namespace dflash {

const char* long_record_name(LongRecordPolicy p) {
  switch (p) {
    case LongRecordPolicy::Error: return "error";
    case LongRecordPolicy::Cut: return "cut";
    case LongRecordPolicy::Skip: return "skip";
  }
  return "?";
}

// ---- deterministic shuffle -------------------------------------------------------------------------
// Our own generator and Fisher-Yates: std::shuffle's algorithm differs between standard libraries, and
// a resumed job (maybe built elsewhere) must see the same order.
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (Lemire's multiply-shift with rejection).
uint64_t bounded(uint64_t& state, uint64_t bound) {
  uint64_t x = splitmix64(state);
  unsigned __int128 m = static_cast<unsigned __int128>(x) * bound;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < bound) {
    const uint64_t threshold = -bound % bound;
    while (low < threshold) {
      x = splitmix64(state);
      m = static_cast<unsigned __int128>(x) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

}  // namespace

std::vector<int64_t> Loader::shard_order(size_t num_records, uint64_t seed, int64_t epoch, int shard_index,
                                         int num_shards, const ConsumedRecords* consumed) {
  std::vector<int64_t> perm(num_records);
  for (size_t i = 0; i < num_records; ++i) perm[i] = static_cast<int64_t>(i);
  uint64_t state = seed ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(epoch + 1));
  splitmix64(state);
  for (size_t i = num_records; i > 1; --i) {
    size_t j = static_cast<size_t>(bounded(state, i));
    std::swap(perm[i - 1], perm[j]);
  }
  // An epoch an earlier split began: its consumed records leave the order, the rest keep theirs.
  if (consumed) {
    const auto it = consumed->find(epoch);
    if (it != consumed->end()) {
      DF_CHECK(it->second.size() == num_records, Internal,
               "consumed records of epoch " << epoch << " cover " << it->second.size() << " records, the data has " << num_records);
      size_t k = 0;
      for (size_t j = 0; j < num_records; ++j)
        if (!it->second.test(static_cast<size_t>(perm[j]))) perm[k++] = perm[j];
      perm.resize(k);
    }
  }
  std::vector<int64_t> mine;
  mine.reserve(perm.size() / static_cast<size_t>(num_shards) + 1);
  for (size_t j = static_cast<size_t>(shard_index); j < perm.size(); j += static_cast<size_t>(num_shards))
    mine.push_back(perm[j]);
  return mine;
}

// ---- record sets -----------------------------------------------------------------------------------

size_t RecordSet::count() const {
  size_t c = 0;
  for (uint8_t b : bits_) c += static_cast<size_t>(__builtin_popcount(b));
  return c;
}

RecordSet RecordSet::from_bytes(size_t n, std::vector<uint8_t> bytes) {
  DF_CHECK(bytes.size() == (n + 7) / 8, BadInput,
           "a record set of " << n << " records needs " << (n + 7) / 8 << " bytes, got " << bytes.size());
  DF_CHECK(n % 8 == 0 || bytes.empty() || (bytes.back() >> (n % 8)) == 0, BadInput,
           "a record set of " << n << " records names records past the end");
  RecordSet s;
  s.n_ = n;
  s.bits_ = std::move(bytes);
  return s;
}

// ---- packing ---------------------------------------------------------------------------------------

BatchExtent pack_extent(const RecordSource& ds, const std::vector<int64_t>& order, int64_t cursor, int64_t budget,
                        LongRecord long_record) {
  BatchExtent e;
  int64_t tokens = 0;
  while (cursor < static_cast<int64_t>(order.size())) {
    const int64_t r = order[static_cast<size_t>(cursor)];
    const int64_t len = ds.record_length(static_cast<size_t>(r));
    const bool too_long = len > budget;
    if (too_long && long_record == LongRecord::Skip) {
      e.records_skipped++;
      e.tokens_skipped += len;
      cursor++;
      continue;
    }
    const int64_t take = too_long ? budget : len;
    if (tokens + take > budget) break;  // whole records only: this one starts the next batch
    e.taken.emplace_back(r, take);
    tokens += take;
    if (too_long) {
      e.records_cut++;
      e.tokens_cut += len - take;
    }
    cursor++;
  }
  e.end = cursor;
  return e;
}

// ---- data position ---------------------------------------------------------------------------------

std::string DataPosition::to_string() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "dflash-data-pos v1 epoch=%" PRId64 " cursor=%" PRId64 " batches=%" PRId64 " seed=%" PRIu64
                " shard=%d/%d",
                epoch, cursor, batches, seed, shard_index, num_shards);
  return buf;
}

DataPosition DataPosition::parse(const std::string& text) {
  DataPosition p;
  int consumed = 0;
  int n = std::sscanf(text.c_str(),
                      "dflash-data-pos v1 epoch=%" SCNd64 " cursor=%" SCNd64 " batches=%" SCNd64 " seed=%" SCNu64
                      " shard=%d/%d%n",
                      &p.epoch, &p.cursor, &p.batches, &p.seed, &p.shard_index, &p.num_shards, &consumed);
  DF_CHECK(n == 6 && static_cast<size_t>(consumed) == text.size() && p.epoch >= 0 && p.cursor >= 0 &&
               p.batches >= 0 && p.num_shards >= 1 && p.shard_index >= 0 && p.shard_index < p.num_shards,
           BadInput, "malformed data position '" << text << "'");
  return p;
}

bool DataPosition::operator==(const DataPosition& o) const {
  return epoch == o.epoch && cursor == o.cursor && batches == o.batches && seed == o.seed &&
         shard_index == o.shard_index && num_shards == o.num_shards;
}

// ---- the loader ------------------------------------------------------------------------------------

Loader::Loader(std::shared_ptr<const RecordSource> dataset, const LoaderOptions& opts)
    : dataset_(std::move(dataset)), opts_(opts) {
  DataPosition start;
  start.seed = opts.seed;
  start.shard_index = opts.shard_index;
  start.num_shards = opts.num_shards;
  init(start);
}

Loader::Loader(std::shared_ptr<const RecordSource> dataset, const LoaderOptions& opts, const DataPosition& start)
    : dataset_(std::move(dataset)), opts_(opts) {
  init(start);
}

int64_t Loader::shard_records(int64_t epoch) const {
  const ConsumedRecords* consumed = opts_.consumed.get();
  if (consumed && consumed->count(epoch))
    return static_cast<int64_t>(
        shard_order(dataset_->num_records(), opts_.seed, epoch, opts_.shard_index, opts_.num_shards, consumed).size());
  const int64_t n = static_cast<int64_t>(dataset_->num_records());
  return n > opts_.shard_index ? (n - opts_.shard_index + opts_.num_shards - 1) / opts_.num_shards : 0;
}

// Fractional epochs done at `at` (the status line's epoch~): an epoch an earlier split began counts what it
// consumed, and this shard's cursor stands for its share of the rest.
double Loader::epoch_progress(const DataPosition& at, size_t shard_size) const {
  double frac = shard_size > 0 ? static_cast<double>(at.cursor) / static_cast<double>(shard_size) : 0.0;
  const auto it = consumed_share_.find(at.epoch);
  if (it != consumed_share_.end()) frac = it->second + (1.0 - it->second) * frac;
  return static_cast<double>(at.epoch) + frac;
}

void Loader::init(const DataPosition& start) {
  DF_ASSERT(dataset_ != nullptr);
  DF_CHECK(opts_.token_budget > 0, BadOptions, "--token-budget must be positive (got " << opts_.token_budget << ")");
  DF_CHECK(opts_.prefetch_depth > 0, BadOptions,
           "--prefetch-depth must be positive (got " << opts_.prefetch_depth << ")");
  DF_CHECK(opts_.max_epochs >= 0, BadOptions, "--epochs must be >= 0 (0 = forever), got " << opts_.max_epochs);
  DF_ASSERT(opts_.num_shards >= 1 && opts_.shard_index >= 0 && opts_.shard_index < opts_.num_shards);
  DF_CHECK_HINT(dataset_->num_records() >= static_cast<size_t>(opts_.num_shards), BadInput,
                "dataset " << dataset_->path() << " has " << dataset_->num_records() << " records, fewer than the "
                           << opts_.num_shards << " targets that share it",
                "use more data or fewer target ranks");
  DF_CHECK_HINT(start.seed == opts_.seed && start.shard_index == opts_.shard_index &&
                    start.num_shards == opts_.num_shards,
                BadInput,
                "saved data position (" << start.to_string() << ") was made with seed " << start.seed << " and shard "
                                        << start.shard_index << "/" << start.num_shards << ", this run has seed "
                                        << opts_.seed << " and shard " << opts_.shard_index << "/" << opts_.num_shards,
                "resume with the same --seed and the same number of target ranks");
  const int64_t in_epoch = shard_records(start.epoch);
  DF_CHECK(start.cursor <= in_epoch, BadInput,
           "saved data position (" << start.to_string() << ") is past the end of this shard (" << in_epoch
                                   << " records in epoch " << start.epoch << ")");
  start_ = start;
  if (start_.cursor == in_epoch) {  // the end of an epoch is the start of the next
    start_.epoch++;
    start_.cursor = 0;
  }
  consumed_ = start_;
  if (opts_.consumed)  // counted once here, not per batch (a bit count over the whole dataset)
    for (const auto& [epoch, set] : *opts_.consumed)
      if (set.size() > 0) consumed_share_[epoch] = static_cast<double>(set.count()) / static_cast<double>(set.size());
  thread_ = std::thread([this] { run(); });
}

Loader::~Loader() { stop(); }

void Loader::stop() {
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    not_full_.notify_all();
    not_empty_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();
}

void Loader::run() {
  const int64_t budget = opts_.token_budget;
  DataPosition pos = start_;
  int64_t order_epoch = -1;
  std::vector<int64_t> order;
  int64_t epoch_batches = 0;  // batches produced in pos.epoch (to catch an epoch where everything is skipped)
  bool whole_epoch = pos.cursor == 0;  // pos.epoch is being read from its first record
  while (!stop_.load()) {
    if (opts_.max_epochs > 0 && pos.epoch >= opts_.max_epochs) break;
    if (order_epoch != pos.epoch) {
      order = shard_order(dataset_->num_records(), opts_.seed, pos.epoch, opts_.shard_index, opts_.num_shards,
                          opts_.consumed.get());
      order_epoch = pos.epoch;
    }
    LoadedBatch item;
    PackedBatch& b = item.batch;
    b.cu_seqlens.push_back(0);
    const BatchExtent ext = pack_extent(*dataset_, order, pos.cursor, budget, opts_.long_record);
    for (const auto& [r, take] : ext.taken) {
      dataset_->read_record(static_cast<size_t>(r), b.tokens, b.loss_mask, take, /*check_file=*/false);  // checked per batch below
      b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
      item.records.push_back(r);
    }
    item.epoch = pos.epoch;
    LoaderStats delta;
    delta.records_skipped = ext.records_skipped;
    delta.records_cut = ext.records_cut;
    delta.records = static_cast<int64_t>(ext.taken.size());
    delta.tokens = static_cast<int64_t>(b.tokens.size());
    delta.tokens_dropped = ext.tokens_skipped + ext.tokens_cut;
    const int64_t cursor = ext.end;
    // The file as it was opened, or the batch is not used (one stat per batch, not per record).
    if (b.num_seqs() > 0) dataset_->check_unchanged();
    DataPosition next = pos;
    next.cursor = cursor;
    if (cursor >= static_cast<int64_t>(order.size())) {
      next.epoch = pos.epoch + 1;
      next.cursor = 0;
    }
    if (b.num_seqs() > 0) {
      item.index = pos.batches;
      next.batches = pos.batches + 1;
      epoch_batches++;
    }
    if (next.epoch != pos.epoch) {
      // (An epoch an earlier split finished, or nearly, may leave this shard nothing: not an error.)
      DF_CHECK_HINT(epoch_batches > 0 || !whole_epoch || order.empty(), BadInput,
                    "every record of shard " << opts_.shard_index << "/" << opts_.num_shards << " of "
                                             << dataset_->path() << " is longer than --token-budget " << budget
                                             << " and --long-record skip drops them all",
                    "raise --token-budget or use --long-record cut");
      epoch_batches = 0;
      whole_epoch = true;
    }
    item.next = next;
    item.epoch_progress = epoch_progress(next, order.size());

    std::unique_lock<std::mutex> lock(mu_);
    stats_.records_skipped += delta.records_skipped;
    stats_.records_cut += delta.records_cut;
    stats_.records += delta.records;
    stats_.tokens += delta.tokens;
    stats_.tokens_dropped += delta.tokens_dropped;
    pos = next;
    if (b.num_seqs() == 0) continue;  // only skipped records left in the epoch
    // Wait for room; a stop request ends the wait at once.
    not_full_.wait(lock, [&] {
      return stop_.load() || static_cast<int>(queue_.size()) < opts_.prefetch_depth;
    });
    if (stop_.load()) break;
    stats_.batches++;
    queue_.push_back(std::move(item));
    not_empty_.notify_one();
  }
  std::lock_guard<std::mutex> lock(mu_);
  producer_done_ = true;
  not_empty_.notify_all();
}

PopResult Loader::pop(LoadedBatch& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  not_empty_.wait_for(lock, timeout, [&] { return !queue_.empty() || producer_done_ || stop_.load(); });
  if (!queue_.empty()) {
    out = std::move(queue_.front());
    queue_.pop_front();
    consumed_ = out.next;
    not_full_.notify_one();
    return PopResult::Batch;
  }
  if (producer_done_ || stop_.load()) return PopResult::EndOfData;
  return PopResult::Timeout;
}

int Loader::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

DataPosition Loader::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return consumed_;
}

LoaderStats Loader::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace dflash
