// A resume on another number of targets (checkpoint.h, DataResume): real Loaders of the old split train
// some batches (a prefix per target plus later ones out of order, as several drafters do), the resume
// points are folded as the drafters fold them, plan_data_resume re-deals the rest over the new split, and
// real Loaders of the new split run to the end: every record of every epoch is read exactly once across
// the splits (records passed over as too long never), also over a second change of split, with --long-record
// cut and skip. Plus: the same split resumes as saved; the consumed sets survive a checkpoint and the
// bytes the first target sends every rank; the lr schedule's re-plan counts what the new loaders produce.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dflash/checkpoint.h"
#include "dflash/data.h"
#include "dflash/schedule.h"
#include "test_support.h"

using namespace dflash;
using namespace std::chrono_literals;

namespace {

// Records of lengths 1..max_len (cycling); token = record * 1000 + position tells a sequence's record.
std::shared_ptr<const TokenDataset> make_dataset(int num_records, int max_len) {
  const std::string dir = test::make_temp_dir("dflash-data-resume-test-");
  TokenRecords rec;
  for (int r = 0; r < num_records; ++r) {
    const int len = 1 + (r * 7) % max_len;
    std::vector<int32_t> ids(len);
    for (int p = 0; p < len; ++p) ids[p] = r * 1000 + p;
    rec.add(ids, std::vector<uint8_t>(len, 1));
  }
  write_token_dataset(dir + "/d.h5", rec, 1000000, "synthetic");
  return std::make_shared<const TokenDataset>(dir + "/d.h5", 1000000);
}

std::vector<LoadedBatch> drain(Loader& loader) {
  std::vector<LoadedBatch> out;
  LoadedBatch b;
  for (;;) {
    const PopResult r = loader.pop(b, 5000ms);
    if (r != PopResult::Batch) {
      EXPECT_EQ(r, PopResult::EndOfData);
      break;
    }
    out.push_back(b);
  }
  return out;
}

using Seen = std::map<int64_t, std::multiset<int64_t>>;  // epoch -> records read

// One segment of a run: `num_targets` loaders from `resume`; of each target's batches the first `prefix`
// (a share) are trained and some later ones (random), the rest not (they were in flight when the run
// stopped). Adds the trained records to `seen` and returns the checkpoint's points; with share 1 the
// segment runs to the end.
std::vector<DataResumePoint> run_segment(const std::shared_ptr<const TokenDataset>& ds, LoaderOptions base,
                                         const DataResume& resume, double share, std::mt19937& rng, Seen& seen) {
  const int n = static_cast<int>(resume.points.size());
  std::vector<DataResumePoint> points = resume.points;
  std::vector<ConsumedBatch> consumed;
  for (int t = 0; t < n; ++t) {
    LoaderOptions lo = base;
    lo.shard_index = t;
    lo.num_shards = n;
    lo.consumed = std::make_shared<const ConsumedRecords>(resume.consumed);
    Loader loader(ds, lo, resume.points[t].position);
    const std::vector<LoadedBatch> batches = drain(loader);
    const size_t prefix = share >= 1 ? batches.size() : static_cast<size_t>(share * static_cast<double>(batches.size()));
    for (size_t k = 0; k < batches.size(); ++k) {
      const bool trained = k < prefix || (k < prefix + 6 && rng() % 2 == 0);
      if (!trained || resume.points[t].already_trained(batches[k].index)) continue;
      for (int64_t r : batches[k].records) seen[batches[k].epoch].insert(r);
      consumed.push_back(ConsumedBatch{t, batches[k].index, batches[k].next});
    }
  }
  advance_resume_points(points, consumed);
  return points;
}

// The batches real loaders of d's split produce from d's points to the end, those listed as trained left out.
int64_t batches_to_train(const std::shared_ptr<const TokenDataset>& ds, const LoaderOptions& base, const DataResume& d) {
  const int n = static_cast<int>(d.points.size());
  int64_t count = 0;
  for (int t = 0; t < n; ++t) {
    LoaderOptions lo = base;
    lo.shard_index = t;
    lo.num_shards = n;
    lo.consumed = std::make_shared<const ConsumedRecords>(d.consumed);
    Loader probe(ds, lo, d.points[t].position);
    for (const LoadedBatch& b : drain(probe)) count += d.points[t].already_trained(b.index) ? 0 : 1;
  }
  return count;
}

void expect_each_record_once(const Seen& seen, const TokenDataset& ds, int64_t budget, LongRecord policy, int epochs) {
  std::set<int64_t> want;
  for (size_t r = 0; r < ds.num_records(); ++r)
    if (policy == LongRecord::Cut || ds.record_length(r) <= budget) want.insert(static_cast<int64_t>(r));
  ASSERT_EQ(static_cast<int>(seen.size()), epochs);
  for (const auto& [epoch, records] : seen) {
    EXPECT_EQ(records.size(), want.size()) << "epoch " << epoch << ": records read (with repeats)";
    EXPECT_EQ(std::set<int64_t>(records.begin(), records.end()), want) << "epoch " << epoch;
  }
}

struct Case {
  std::vector<int> splits;  // targets of each segment
  LongRecord policy;
  int epochs;
};

}  // namespace

TEST(DataResume, EveryRecordOnceAcrossChangesOfSplit) {
  const auto ds = make_dataset(203, 40);
  const std::vector<Case> cases = {
      {{2, 1}, LongRecord::Cut, 1},  {{1, 3}, LongRecord::Cut, 2},     {{3, 2}, LongRecord::Skip, 2},
      {{4, 1, 3}, LongRecord::Cut, 3}, {{2, 5, 2}, LongRecord::Skip, 3}, {{7, 2}, LongRecord::Cut, 2},
  };
  for (const Case& c : cases) {
    for (double share : {0.1, 0.45, 0.8}) {
      SCOPED_TRACE(::testing::Message() << "splits " << c.splits.front() << "->" << c.splits.back() << " ("
                                        << c.splits.size() << " segments), share " << share << ", epochs " << c.epochs);
      std::mt19937 rng(static_cast<unsigned>(share * 1000) + static_cast<unsigned>(c.splits.size()));
      LoaderOptions base;
      base.token_budget = 32;  // records up to 40 tokens: some are too long
      base.prefetch_depth = 1000;
      base.max_epochs = c.epochs;
      base.seed = 11;
      base.long_record = c.policy;
      Seen seen;
      DataResume d = fresh_data_resume(c.splits[0], base.seed);
      for (size_t s = 0; s < c.splits.size(); ++s) {
        const bool last = s + 1 == c.splits.size();
        // Stop inside the run: a share of the segment's data (later segments stop earlier in theirs).
        const std::vector<DataResumePoint> saved = run_segment(ds, base, d, last ? 1.0 : share, rng, seen);
        if (last) break;
        const ConsumedRecords saved_consumed = consumed_still_needed(d.consumed, saved);
        d = plan_data_resume(*ds, base, c.epochs, saved, saved_consumed, c.splits[s + 1]);
        EXPECT_TRUE(d.resplit);
        EXPECT_EQ(static_cast<int>(d.points.size()), c.splits[s + 1]);
        // The lr schedule's re-plan counts what the new split's loaders will produce.
        const int64_t will_produce = batches_to_train(ds, base, d);
        LoaderOptions counted = base;
        counted.consumed = std::make_shared<const ConsumedRecords>(d.consumed);
        const PlannedSchedule p = plan_schedule(*ds, counted, c.splits[s + 1], 1, c.epochs, 0, 0, 0, 1,
                                                ScheduleStart{d.first_epoch, 100});
        EXPECT_EQ(p.data_batches, will_produce);
        EXPECT_EQ(p.total_steps, 100 + will_produce);
        EXPECT_EQ(data_batches_left(*ds, base, c.epochs, d), will_produce);
      }
      expect_each_record_once(seen, *ds, base.token_budget, c.policy, c.epochs);
    }
  }
}

// The same targets (another number of drafters): the points go on as saved, and the batches left are those
// the loaders will still produce from them, less the ones listed as trained.
TEST(DataResume, BatchesLeftFromSavedPositions) {
  const auto ds = make_dataset(90, 20);
  LoaderOptions base;
  base.token_budget = 40;
  base.seed = 3;
  base.max_epochs = 2;
  base.prefetch_depth = 1000;
  std::mt19937 rng(4);
  Seen seen;
  const std::vector<DataResumePoint> saved = run_segment(ds, base, fresh_data_resume(2, 3), 0.4, rng, seen);
  const DataResume d = plan_data_resume(*ds, base, 2, saved, {}, 2);
  const int64_t will_train = batches_to_train(ds, base, d);
  EXPECT_GT(will_train, 0);
  EXPECT_EQ(data_batches_left(*ds, base, 2, d), will_train);
}

TEST(DataResume, SameSplitResumesAsSaved) {
  const auto ds = make_dataset(50, 20);
  LoaderOptions base;
  base.token_budget = 40;
  base.seed = 3;
  std::mt19937 rng(1);
  Seen seen;
  const std::vector<DataResumePoint> saved = run_segment(ds, base, fresh_data_resume(2, 3), 0.5, rng, seen);
  const DataResume d = plan_data_resume(*ds, base, 1, saved, {}, 2);
  EXPECT_FALSE(d.resplit);
  ASSERT_EQ(d.points.size(), 2u);
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(d.points[t].position, saved[t].position);
    EXPECT_EQ(d.points[t].done_after.size(), saved[t].done_after.size());
  }
}

TEST(DataResume, AnotherSeedIsRefused) {
  const auto ds = make_dataset(50, 20);
  LoaderOptions base;
  base.token_budget = 40;
  base.seed = 3;
  std::mt19937 rng(1);
  Seen seen;
  const std::vector<DataResumePoint> saved = run_segment(ds, base, fresh_data_resume(2, 3), 0.5, rng, seen);
  base.seed = 4;
  EXPECT_EXIT(plan_data_resume(*ds, base, 1, saved, {}, 1), ::testing::ExitedWithCode(3), "--seed");
}

TEST(DataResume, TravelsAsBytesAndInCheckpoints) {
  const auto ds = make_dataset(77, 30);
  LoaderOptions base;
  base.token_budget = 30;
  base.seed = 9;
  base.max_epochs = 2;
  std::mt19937 rng(2);
  Seen seen;
  const std::vector<DataResumePoint> saved = run_segment(ds, base, fresh_data_resume(3, 9), 0.6, rng, seen);
  const DataResume d = plan_data_resume(*ds, base, 2, saved, {}, 2);
  ASSERT_TRUE(d.resplit);
  ASSERT_FALSE(d.consumed.empty());
  const DataResume back = deserialize_data_resume(serialize_data_resume(d));
  EXPECT_EQ(back.resplit, d.resplit);
  EXPECT_EQ(back.first_epoch, d.first_epoch);
  EXPECT_EQ(back.summary, d.summary);
  EXPECT_EQ(back.consumed, d.consumed);
  ASSERT_EQ(back.points.size(), d.points.size());
  for (size_t i = 0; i < d.points.size(); ++i) EXPECT_EQ(back.points[i].position, d.points[i].position);

  // In a checkpoint: the consumed sets are tensors of state.safetensors, vouched for by the manifest.
  const std::string dir = test::make_temp_dir("dflash-data-resume-ckpt-");
  CheckpointState st;
  st.step = 7;
  st.data = d.points;
  st.consumed = d.consumed;
  st.rng_states = {"rng0"};
  st.options = {{"seed", "9"}};
  st.run_id = "00000000000000aa";
  std::vector<float> w(5, 1.0f);
  const CheckpointTensors t{cpu_view(w.data(), {5}), cpu_view(w.data(), {5}), cpu_view(w.data(), {5})};
  const std::string step_dir = save_checkpoint(dir, st, t, CheckpointSaveOptions{});
  const CheckpointState read = read_checkpoint_state(step_dir);
  EXPECT_EQ(read.consumed, d.consumed);
  EXPECT_EQ(RecordSet::from_bytes(10, {0xff, 0x03}).count(), 10u);
  EXPECT_EXIT(RecordSet::from_bytes(10, {0xff, 0x07}), ::testing::ExitedWithCode(3), "past the end");
}
