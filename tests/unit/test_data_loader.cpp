// Loader: determinism, sharding, packing, long records, save/restore, bounded prefetch, clean stop.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dflash/data.h"
#include "dflash/metrics.h"
#include "test_support.h"

using namespace dflash;
using namespace std::chrono_literals;

namespace {

std::string make_temp_dir() { return test::make_temp_dir("dflash-loader-test-"); }

// Records of lengths 1..max_len (cycling), each token encoding (record, position) so a test can tell
// which record a packed sequence came from: token = record * 1000 + position (vocab 1e6).
std::shared_ptr<const TokenDataset> make_dataset(int num_records, int max_len, const std::string& name,
                                                 std::vector<int>* lengths = nullptr) {
  std::string dir = make_temp_dir();
  TokenRecords rec;
  for (int r = 0; r < num_records; ++r) {
    const int len = 1 + (r * 7) % max_len;
    std::vector<int32_t> ids(len);
    std::vector<uint8_t> mask(len);
    for (int p = 0; p < len; ++p) {
      ids[p] = r * 1000 + p;
      mask[p] = static_cast<uint8_t>(p % 2);
    }
    rec.add(ids, mask);
    if (lengths) lengths->push_back(len);
  }
  write_token_dataset(dir + "/" + name, rec, 1000000, "synthetic");
  return std::make_shared<const TokenDataset>(dir + "/" + name, 1000000);
}

std::vector<LoadedBatch> drain(Loader& loader, size_t max_batches = 1000000) {
  std::vector<LoadedBatch> out;
  LoadedBatch b;
  while (out.size() < max_batches) {
    PopResult r = loader.pop(b, 5000ms);
    if (r == PopResult::EndOfData) break;
    EXPECT_EQ(r, PopResult::Batch);
    if (r != PopResult::Batch) break;
    out.push_back(b);
  }
  return out;
}

int record_of(const PackedBatch& b, int s) { return b.tokens[static_cast<size_t>(b.cu_seqlens[s])] / 1000; }

bool same_batches(const std::vector<LoadedBatch>& a, const std::vector<LoadedBatch>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].batch.tokens != b[i].batch.tokens || a[i].batch.cu_seqlens != b[i].batch.cu_seqlens ||
        a[i].batch.loss_mask != b[i].batch.loss_mask || a[i].index != b[i].index)
      return false;
  }
  return true;
}

}  // namespace

TEST(Loader, DeterministicForASeedAndDifferentAcrossSeeds) {
  auto ds = make_dataset(200, 40, "d.h5");
  LoaderOptions o;
  o.token_budget = 64;
  o.max_epochs = 2;
  o.seed = 7;
  Loader a(ds, o), b(ds, o);
  auto ba = drain(a), bb = drain(b);
  ASSERT_GT(ba.size(), 10u);
  EXPECT_TRUE(same_batches(ba, bb));
  o.seed = 8;
  Loader c(ds, o);
  EXPECT_FALSE(same_batches(ba, drain(c)));
}

TEST(Loader, ShardsAreDisjointAndCompleteEveryEpoch) {
  std::vector<int> lengths;
  auto ds = make_dataset(101, 30, "d.h5", &lengths);
  const int n = 3;
  LoaderOptions o;
  o.token_budget = 50;
  o.max_epochs = 2;
  o.seed = 3;
  o.num_shards = n;
  std::map<int64_t, std::vector<int>> seen;  // epoch -> records
  for (int i = 0; i < n; ++i) {
    o.shard_index = i;
    Loader l(ds, o);
    int64_t epoch = 0;
    for (const LoadedBatch& b : drain(l)) {
      for (int s = 0; s < b.batch.num_seqs(); ++s) seen[epoch].push_back(record_of(b.batch, s));
      epoch = b.next.epoch;  // the next batch belongs to this epoch
    }
    EXPECT_EQ(l.shard_records(0), (101 - i + n - 1) / n);
  }
  ASSERT_EQ(seen.size(), 2u);
  for (auto& [epoch, recs] : seen) {
    std::sort(recs.begin(), recs.end());
    std::vector<int> all(101);
    for (int r = 0; r < 101; ++r) all[r] = r;
    EXPECT_EQ(recs, all) << "epoch " << epoch;  // every record exactly once across the shards
  }
  // The shuffle differs between epochs.
  EXPECT_NE(Loader::shard_order(101, 3, 0, 0, 1), Loader::shard_order(101, 3, 1, 0, 1));
}

TEST(Loader, PackingRespectsBudgetAndKeepsSequencesWhole) {
  std::vector<int> lengths;
  auto ds = make_dataset(150, 48, "d.h5", &lengths);
  LoaderOptions o;
  o.token_budget = 100;
  o.seed = 11;
  Loader l(ds, o);
  auto batches = drain(l);
  int64_t total = 0;
  for (const LoadedBatch& lb : batches) {
    const PackedBatch& b = lb.batch;
    EXPECT_LE(b.num_tokens(), 100);
    ASSERT_GE(b.num_seqs(), 1);
    EXPECT_EQ(b.cu_seqlens.front(), 0);
    EXPECT_EQ(b.cu_seqlens.back(), b.num_tokens());
    EXPECT_EQ(b.loss_mask.size(), b.tokens.size());
    for (int s = 0; s < b.num_seqs(); ++s) {
      const int r = record_of(b, s);
      EXPECT_EQ(b.cu_seqlens[s + 1] - b.cu_seqlens[s], lengths[r]);  // whole record
      for (int p = 0; p < lengths[r]; ++p) {
        EXPECT_EQ(b.tokens[b.cu_seqlens[s] + p], r * 1000 + p);
        EXPECT_EQ(b.loss_mask[b.cu_seqlens[s] + p], p % 2);
      }
    }
    total += b.num_tokens();
  }
  int64_t expected = 0;
  for (int len : lengths) expected += len;
  EXPECT_EQ(total, expected);
  // Greedy packing: a batch is closed only because the next record did not fit.
  for (size_t i = 0; i + 1 < batches.size(); ++i) {
    const PackedBatch& next = batches[i + 1].batch;
    if (batches[i + 1].next.epoch != batches[i].next.epoch) continue;
    EXPECT_GT(batches[i].batch.num_tokens() + (next.cu_seqlens[1] - next.cu_seqlens[0]), 100);
  }
  EXPECT_EQ(l.stats().records, 150);
  EXPECT_EQ(l.stats().records_cut, 0);
}

TEST(Loader, LongRecordsCutOrSkippedAndCounted) {
  std::vector<int> lengths;
  auto ds = make_dataset(60, 40, "d.h5", &lengths);
  const int budget = 20;
  int64_t n_long = 0, long_excess = 0, long_tokens = 0;
  for (int len : lengths)
    if (len > budget) {
      n_long++;
      long_excess += len - budget;
      long_tokens += len;
    }
  ASSERT_GT(n_long, 0);
  LoaderOptions o;
  o.token_budget = budget;
  o.long_record = LongRecord::Cut;
  Loader cut(ds, o);
  auto cb = drain(cut);
  int64_t cut_seen = 0;
  for (const auto& b : cb) {
    EXPECT_LE(b.batch.num_tokens(), budget);
    for (int s = 0; s < b.batch.num_seqs(); ++s)
      if (lengths[record_of(b.batch, s)] > budget) {
        cut_seen++;
        EXPECT_EQ(b.batch.cu_seqlens[s + 1] - b.batch.cu_seqlens[s], budget);
      }
  }
  EXPECT_EQ(cut_seen, n_long);
  EXPECT_EQ(cut.stats().records_cut, n_long);
  EXPECT_EQ(cut.stats().records_skipped, 0);
  EXPECT_EQ(cut.stats().tokens_dropped, long_excess);
  EXPECT_EQ(cut.stats().records, 60);

  o.long_record = LongRecord::Skip;
  Loader skip(ds, o);
  int64_t seqs = 0;
  for (const auto& b : drain(skip)) {
    for (int s = 0; s < b.batch.num_seqs(); ++s) EXPECT_LE(lengths[record_of(b.batch, s)], budget);
    seqs += b.batch.num_seqs();
  }
  EXPECT_EQ(seqs, 60 - n_long);
  EXPECT_EQ(skip.stats().records_skipped, n_long);
  EXPECT_EQ(skip.stats().records_cut, 0);
  EXPECT_EQ(skip.stats().tokens_dropped, long_tokens);
}

TEST(Loader, SavedPositionReproducesTheRemainingBatches) {
  auto ds = make_dataset(90, 30, "d.h5");
  LoaderOptions o;
  o.token_budget = 45;
  o.max_epochs = 3;
  o.seed = 5;
  o.num_shards = 2;
  o.shard_index = 1;
  Loader full(ds, o);
  auto all = drain(full);
  ASSERT_GT(all.size(), 20u);
  // Stop mid-run (also right at an epoch boundary), save, restore, compare the rest.
  std::vector<size_t> cuts = {0, 7, all.size() / 2};
  for (size_t i = 0; i + 1 < all.size(); ++i)
    if (all[i].next.cursor == 0) {  // batch i ended an epoch
      cuts.push_back(i + 1);
      break;
    }
  for (size_t cut : cuts) {
    Loader first(ds, o);
    auto head = drain(first, cut);
    ASSERT_EQ(head.size(), cut);
    const std::string saved = first.position().to_string();
    first.stop();
    DataPosition pos = DataPosition::parse(saved);
    EXPECT_EQ(pos.to_string(), saved);
    Loader resumed(ds, o, pos);
    auto tail = drain(resumed);
    std::vector<LoadedBatch> expected(all.begin() + static_cast<long>(cut), all.end());
    EXPECT_TRUE(same_batches(tail, expected)) << "resumed after " << cut << " batches from " << saved;
  }
}

TEST(Loader, PrefetchQueueIsBoundedAndStopIsClean) {
  auto ds = make_dataset(300, 20, "d.h5");
  LoaderOptions o;
  o.token_budget = 30;
  o.prefetch_depth = 3;
  o.max_epochs = 0;  // forever: only stop() ends it
  Loader l(ds, o);
  for (int i = 0; i < 200 && l.queue_depth() < 3; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(l.queue_depth(), 3);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(l.queue_depth(), 3);  // the producer waits instead of growing the queue
  EXPECT_EQ(l.stats().batches, 3);
  LoadedBatch b;
  ASSERT_EQ(l.pop(b, 1000ms), PopResult::Batch);
  EXPECT_EQ(b.index, 0);
  EXPECT_EQ(l.position(), b.next);
  auto t0 = std::chrono::steady_clock::now();
  l.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(l.pop(b, 10ms), PopResult::EndOfData);
}

TEST(Loader, EndOfDataAfterLastEpochAndProgress) {
  auto ds = make_dataset(10, 5, "d.h5");
  LoaderOptions o;
  o.token_budget = 1000;  // the whole epoch fits in one batch
  o.max_epochs = 2;
  Loader l(ds, o);
  LoadedBatch b;
  ASSERT_EQ(l.pop(b, 2000ms), PopResult::Batch);
  EXPECT_EQ(b.batch.num_seqs(), 10);
  EXPECT_DOUBLE_EQ(b.epoch_progress, 1.0);
  ASSERT_EQ(l.pop(b, 2000ms), PopResult::Batch);
  EXPECT_EQ(b.index, 1);
  EXPECT_DOUBLE_EQ(b.epoch_progress, 2.0);
  EXPECT_EQ(l.pop(b, 2000ms), PopResult::EndOfData);
}

TEST(LoaderDeathTest, PositionFromAnotherSetupIsRefused) {
  auto ds = make_dataset(20, 5, "d.h5");
  LoaderOptions o;
  o.seed = 1;
  DataPosition p;
  p.seed = 2;
  EXPECT_EXIT(Loader(ds, o, p), testing::ExitedWithCode(3), "resume with the same --seed");
  EXPECT_EXIT(DataPosition::parse("epoch=1"), testing::ExitedWithCode(3), "malformed data position");
}

TEST(LoaderDeathTest, ZeroBudgetIsAnOptionError) {
  auto ds = make_dataset(5, 5, "d.h5");
  LoaderOptions o;
  o.token_budget = 0;
  EXPECT_EXIT(Loader(ds, o), testing::ExitedWithCode(2), "--token-budget must be positive");
}

TEST(LoaderDeathTest, SkippingEveryRecordIsAnError) {
  std::string path = make_temp_dir() + "/long.h5";
  TokenRecords rec;
  for (int r = 0; r < 4; ++r) rec.add(std::vector<int32_t>(10, r));
  write_token_dataset(path, rec, 10, "t");
  auto ds = std::make_shared<const TokenDataset>(path, 10);
  LoaderOptions o;
  o.token_budget = 5;
  o.long_record = LongRecord::Skip;
  o.max_epochs = 0;  // without the check this would spin forever
  EXPECT_EXIT(
      {
        Loader l(ds, o);
        LoadedBatch b;
        l.pop(b, 5000ms);
      },
      testing::ExitedWithCode(3), "--long-record skip drops them all");
}

// The loader thread reads the dataset while the main thread writes metrics (both HDF5, one lock).
TEST(Loader, ReadsWhileMetricsAreWritten) {
  std::vector<int> lengths;
  auto ds = make_dataset(120, 30, "d.h5", &lengths);
  LoaderOptions o;
  o.token_budget = 40;
  o.prefetch_depth = 2;
  o.max_epochs = 3;
  Loader l(ds, o);
  MetricsLayout layout;
  layout.num_targets = 1;
  layout.num_drafters = 1;
  layout.flush_every = 1;
  MetricsWriter w(make_temp_dir() + "/metrics.h5", layout);
  int64_t seqs = 0, steps = 0;
  LoadedBatch b;
  while (l.pop(b, 5000ms) == PopResult::Batch) {
    for (int s = 0; s < b.batch.num_seqs(); ++s) {
      const int r = record_of(b.batch, s);
      ASSERT_EQ(b.batch.cu_seqlens[s + 1] - b.batch.cu_seqlens[s], lengths[r]);
      ASSERT_EQ(b.batch.tokens[b.batch.cu_seqlens[s + 1] - 1], r * 1000 + lengths[r] - 1);
    }
    seqs += b.batch.num_seqs();
    StepMetrics m;
    m.step = steps++;
    w.append_step(m);
    w.append_queues(0.0, {l.queue_depth()}, {0});
  }
  EXPECT_EQ(seqs, 3 * 120);
  EXPECT_EQ(w.num_steps(), steps);
}
