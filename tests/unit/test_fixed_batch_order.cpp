// --batch-order fixed (FixedBatchOrder, flow_control.h): the batch each drafter step trains is a pure
// function of the topology, the end indices of the targets and (on a resume) what was trained before.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <utility>

#include "dflash/error.h"
#include "dflash/flow_control.h"
#include "dflash/options.h"

using namespace dflash;

namespace {

// Drains drafter d's sequence (at most `limit` batches), as (target, batch) pairs.
std::vector<std::pair<int, int64_t>> sequence(FixedBatchOrder order, size_t limit) {
  std::vector<std::pair<int, int64_t>> out;
  while (out.size() < limit) {
    auto e = order.expected();
    if (!e) break;
    out.emplace_back(e->target, e->batch);
    order.consumed();
  }
  return out;
}

}  // namespace

TEST(FixedBatchOrder, EveryTargetRunningFollowsGlobalIndex) {
  for (int T = 1; T <= 4; ++T)
    for (int D = 1; D <= 3; ++D)
      for (int d = 0; d < D; ++d) {
        auto seq = sequence(FixedBatchOrder(T, D, d), 12);
        ASSERT_EQ(seq.size(), 12u);
        for (size_t s = 0; s < seq.size(); ++s) {
          const int64_t g = static_cast<int64_t>(s) * D + d;  // step s of drafter d
          EXPECT_EQ(seq[s].first, g % T) << T << "-" << D << " drafter " << d << " step " << s;
          EXPECT_EQ(seq[s].second, g / T);
          EXPECT_EQ(FixedBatchOrder::drafter_of(T, D, seq[s].first, seq[s].second), d);
        }
      }
}

TEST(FixedBatchOrder, TargetSendsItsNthBatchToTheDrafterThatExpectsIt) {
  // 3 targets, 2 drafters: target i's batch n goes to drafter (n*3 + i) mod 2.
  EXPECT_EQ(FixedBatchOrder::drafter_of(3, 2, 0, 0), 0);
  EXPECT_EQ(FixedBatchOrder::drafter_of(3, 2, 1, 0), 1);
  EXPECT_EQ(FixedBatchOrder::drafter_of(3, 2, 2, 0), 0);
  EXPECT_EQ(FixedBatchOrder::drafter_of(3, 2, 0, 1), 1);
  EXPECT_EQ(FixedBatchOrder::drafter_of(3, 2, 2, 5), 1);  // g = 17
}

TEST(FixedBatchOrder, SequenceEndsAtTheFirstBatchThatDoesNotExist) {
  // 3-2, target 1 has batches 0..1: g = 7 (target 1, batch 2) is drafter 1's step 3; drafter 0 goes on
  // to its own first missing batch. The drafters stop together at the shorter sequence (lockstep).
  const int T = 3, D = 2;
  const int64_t ends[T] = {5, 2, 4};
  std::vector<size_t> lengths;
  std::set<std::pair<int, int64_t>> seen;
  for (int d = 0; d < D; ++d) {
    FixedBatchOrder order(T, D, d);
    for (int i = 0; i < T; ++i) order.target_ended(i, ends[i]);
    auto seq = sequence(order, 100);
    lengths.push_back(seq.size());
    for (size_t s = 0; s < seq.size(); ++s) {
      const int64_t g = static_cast<int64_t>(s) * D + d;  // no gaps before the end
      EXPECT_EQ(seq[s], std::make_pair(static_cast<int>(g % T), g / T));
      EXPECT_LT(seq[s].second, ends[seq[s].first]);
      EXPECT_TRUE(seen.insert(seq[s]).second) << "batch trained twice";
    }
  }
  EXPECT_EQ(lengths[1], 3u);  // g = 1, 3, 5; g = 7 is missing
  EXPECT_EQ(lengths[0], 5u);  // g = 0, 2, 4, 6, 8; g = 10 (target 1, batch 3) is missing
}

TEST(FixedBatchOrder, EndLearnedLateGivesTheSameSequence) {
  FixedBatchOrder upfront(3, 1, 0), late(3, 1, 0);
  upfront.target_ended(1, 2);
  auto want = sequence(upfront, 20);
  ASSERT_EQ(want.size(), 7u);  // g = 0..6; g = 7 is target 1's batch 2
  std::vector<std::pair<int, int64_t>> got;
  for (int k = 0; k < 20; ++k) {
    if (k == 4) late.target_ended(1, 2);  // g = 4 is batch 1 of target 1: still before its end
    auto e = late.expected();
    if (!e) break;
    got.emplace_back(e->target, e->batch);
    late.consumed();
  }
  EXPECT_EQ(got, want);
}

TEST(FixedBatchOrder, TargetsOfOtherDraftersDoNotKeepItWaiting) {
  // 2-2: drafter 0 only ever gets target 0's batches; it is dry once target 0 ended.
  FixedBatchOrder order(2, 2, 0);
  order.target_ended(0, 3);
  auto seq = sequence(order, 100);
  ASSERT_EQ(seq.size(), 3u);
  for (auto [i, n] : seq) EXPECT_EQ(i, 0);
  FixedBatchOrder other(2, 2, 1);
  other.target_ended(0, 3);
  EXPECT_EQ(sequence(other, 50).size(), 50u);  // target 1 has not ended
}

TEST(FixedBatchOrder, ResumeContinuesTheSameSequence) {
  const int T = 3, D = 2;
  const int64_t ends[T] = {9, 4, 7};
  const size_t S = 5;  // steps before the checkpoint
  std::vector<std::vector<std::pair<int, int64_t>>> straight(D);
  std::map<int, std::set<int64_t>> trained;
  for (int d = 0; d < D; ++d) {
    FixedBatchOrder o(T, D, d);
    for (int i = 0; i < T; ++i) o.target_ended(i, ends[i]);
    straight[d] = sequence(o, 100);
    for (size_t s = 0; s < S && s < straight[d].size(); ++s) trained[straight[d][s].first].insert(straight[d][s].second);
  }
  for (int d = 0; d < D; ++d) {
    FixedBatchOrder resumed(T, D, d);
    for (int i = 0; i < T; ++i) {
      int64_t first = 0;  // the checkpoint's data point: consecutive run, then the later ones listed
      while (trained[i].count(first)) ++first;
      std::vector<int64_t> later;
      for (int64_t n : trained[i])
        if (n > first) later.push_back(n);
      resumed.trained_before(i, first, later);
      resumed.target_ended(i, ends[i]);
    }
    auto rest = sequence(resumed, 100);
    std::vector<std::pair<int, int64_t>> want(straight[d].begin() + S, straight[d].end());
    EXPECT_EQ(rest, want) << "drafter " << d;
  }
}

TEST(FixedBatchOrder, CreditsAreGrantedInTrainingOrder) {
  FixedBatchOrder order(3, 2, 1);
  std::vector<int64_t> granted;
  for (int k = 0; k < 4; ++k) {
    auto r = order.next_to_grant();
    ASSERT_TRUE(r.has_value());
    granted.push_back(r->g);
    order.granted();
  }
  EXPECT_EQ(granted, (std::vector<int64_t>{1, 3, 5, 7}));
  order.consumed();  // g = 1 trained
  auto next = order.next_to_grant();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->g, 9);
  EXPECT_EQ(order.expected()->g, 3);
}

TEST(FixedBatchOrderDeath, BadBatchOrderValueIsRefused) {
  const char* argv[] = {"dflash-train", "--batch-order", "random", "--target", "t", "--data", "d", "--out", "o"};
  EXPECT_EXIT(parse_options(9, argv), testing::ExitedWithCode(static_cast<int>(ExitCode::BadOptions)), "--batch-order");
}

TEST(FixedBatchOrder, OptionParsesAndIsAResumeInvariant) {
  const char* argv[] = {"dflash-train", "--batch-order", "fixed", "--target", "t", "--data", "d", "--out", "o"};
  const Options o = parse_options(9, argv).options;
  EXPECT_EQ(o.batch_order, BatchOrder::Fixed);
  bool listed = false;
  for (const auto& [name, value] : o.resolved) listed |= name == "batch-order" && value == "fixed";
  EXPECT_TRUE(listed);
}
