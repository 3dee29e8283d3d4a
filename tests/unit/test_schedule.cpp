// The lr schedule's length (include/dflash/schedule.h): count_epoch_batches must count exactly the batches
// the real Loader produces, for every shard and epoch, with records cut or skipped; plan_schedule turns
// them into drafter steps (floor over the drafters), capped by --max-steps, and the warmup ratio into steps.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "dflash/data.h"
#include "dflash/schedule.h"
#include "test_support.h"

using namespace dflash;
using namespace std::chrono_literals;

namespace {

// Records of uneven lengths 3..260 (some longer than the small budgets below).
std::shared_ptr<const TokenDataset> dataset() {
  static std::shared_ptr<const TokenDataset> ds = [] {
    const std::string dir = test::make_temp_dir("dflash-schedule-test-");
    TokenRecords rec;
    for (int r = 0; r < 157; ++r) {
      const int len = 3 + (r * 37) % 258;
      rec.add(std::vector<int32_t>(static_cast<size_t>(len), r % 100));
    }
    write_token_dataset(dir + "/d.h5", rec, 100, "synthetic");
    return std::make_shared<const TokenDataset>(dir + "/d.h5", 100);
  }();
  return ds;
}

int64_t loader_batches_per_epoch(const LoaderOptions& base, std::vector<int64_t>& per_epoch) {
  LoaderOptions o = base;
  o.prefetch_depth = 8;
  Loader loader(dataset(), o);
  LoadedBatch b;
  int64_t n = 0;
  per_epoch.assign(static_cast<size_t>(o.max_epochs), 0);
  while (loader.pop(b, 5000ms) == PopResult::Batch) {
    ++n;
    // the batch's epoch: the one its `next` position is in, unless it ended that epoch
    const int64_t e = b.next.cursor == 0 ? b.next.epoch - 1 : b.next.epoch;
    per_epoch[static_cast<size_t>(e)]++;
  }
  return n;
}

TEST(Schedule, CountsTheLoadersBatchesExactly) {
  for (int64_t budget : {int64_t(200), int64_t(512), int64_t(4096)})
    for (LongRecord lr : {LongRecord::Cut, LongRecord::Skip})
      for (int shards : {1, 3})
        for (int shard = 0; shard < shards; ++shard) {
          LoaderOptions o;
          o.token_budget = budget;
          o.long_record = lr;
          o.max_epochs = 3;
          o.seed = 11;
          o.shard_index = shard;
          o.num_shards = shards;
          std::vector<int64_t> per_epoch;
          const int64_t total = loader_batches_per_epoch(o, per_epoch);
          int64_t counted = 0;
          for (int e = 0; e < 3; ++e) {
            const int64_t c = count_epoch_batches(*dataset(), o, e);
            EXPECT_EQ(c, per_epoch[static_cast<size_t>(e)])
                << "budget " << budget << (lr == LongRecord::Cut ? " cut" : " skip") << " shard " << shard << "/"
                << shards << " epoch " << e;
            counted += c;
          }
          EXPECT_EQ(counted, total);
          EXPECT_GT(total, 0);
        }
}

TEST(Schedule, PlanSpreadsTheDataOverTheDrafters) {
  LoaderOptions o;
  o.token_budget = 512;
  o.seed = 3;
  int64_t batches = 0;
  for (int e = 0; e < 2; ++e)
    for (int t = 0; t < 2; ++t) {
      LoaderOptions s = o;
      s.shard_index = t;
      s.num_shards = 2;
      batches += count_epoch_batches(*dataset(), s, e);
    }
  const PlannedSchedule p = plan_schedule(*dataset(), o, 2, 3, 2, 0, 5, 0);
  EXPECT_EQ(p.data_batches, batches);
  EXPECT_EQ(p.total_steps, batches / 3);
  EXPECT_EQ(p.warmup_steps, 5);
  // --max-steps ends the run sooner: the cosine ends there
  EXPECT_EQ(plan_schedule(*dataset(), o, 2, 3, 2, 7, 0, 0).total_steps, 7);
  // ... but not later than the data
  EXPECT_EQ(plan_schedule(*dataset(), o, 2, 3, 2, 1000000, 0, 0).total_steps, batches / 3);
  // --epochs 0 without --max-steps: no end, no decay
  EXPECT_EQ(plan_schedule(*dataset(), o, 2, 3, 0, 0, 0, 0).total_steps, 0);
  EXPECT_EQ(plan_schedule(*dataset(), o, 2, 3, 0, 40, 0, 0).total_steps, 40);
  // the warmup ratio is a fraction of the planned steps
  EXPECT_EQ(plan_schedule(*dataset(), o, 1, 1, 1, 40, 0, 0.25).warmup_steps, 10);
  const PlannedSchedule w = plan_schedule(*dataset(), o, 1, 1, 1, 0, 0, 0.1);
  EXPECT_GT(w.total_steps, 20);
  EXPECT_EQ(w.warmup_steps, std::lround(0.1 * static_cast<double>(w.total_steps)));
}

// --grad-accum K: optimizer steps of K micro-batches, the partial last step counted (ceil); --max-steps
// counts optimizer steps; --global-batch-tokens picks K = ceil(T / (budget x drafters)).
TEST(Schedule, GradAccumCountsOptimizerSteps) {
  LoaderOptions o;
  o.token_budget = 512;
  o.seed = 3;
  const PlannedSchedule one = plan_schedule(*dataset(), o, 2, 3, 2, 0, 0, 0);
  const int64_t micro = one.data_batches / 3;
  for (int k : {2, 3, 7}) {
    const PlannedSchedule p = plan_schedule(*dataset(), o, 2, 3, 2, 0, 0, 0, k);
    EXPECT_EQ(p.total_steps, (micro + k - 1) / k) << "K " << k;
    EXPECT_NE(p.why.find(std::to_string(k) + " micro-batches per step"), std::string::npos) << p.why;
  }
  EXPECT_EQ(plan_schedule(*dataset(), o, 2, 3, 2, 2, 0, 0, 3).total_steps, 2);
  EXPECT_EQ(grad_accum_for(98304, 32768, 1), 3);
  EXPECT_EQ(grad_accum_for(98304, 32768, 2), 2);
  EXPECT_EQ(grad_accum_for(262144, 32768, 7), 2);
  EXPECT_EQ(grad_accum_for(1000, 32768, 7), 1);
}

}  // namespace
