// Anchor sampler: valid positions only, without replacement, sorted, uniform, seeded, resumable.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "dflash/anchors.h"

namespace {

dflash::PackedBatch make_batch() {
  dflash::PackedBatch b;
  // three sequences: 6, 1 and 9 tokens
  b.cu_seqlens = {0, 6, 7, 16};
  b.tokens.assign(16, 1);
  b.loss_mask = {0, 1, 1, 1, 0, 1,  // valid: 1, 2   (5 is last of its sequence)
                 1,                 // a one-token sequence: none
                 1, 1, 1, 0, 1, 1, 1, 1, 1};  // valid: 7, 8, 11, 12, 13, 14
  return b;
}

TEST(Anchors, ValidPositionsRespectMaskAndSequenceEnds) {
  std::vector<int64_t> v;
  dflash::valid_anchor_positions(make_batch(), v);
  EXPECT_EQ(v, (std::vector<int64_t>{1, 2, 7, 8, 11, 12, 13, 14}));
}

TEST(Anchors, SampleIsSortedDistinctValidAndCapped) {
  dflash::AnchorSampler s(42);
  const auto b = make_batch();
  std::vector<int64_t> valid;
  dflash::valid_anchor_positions(b, valid);
  for (int rep = 0; rep < 50; ++rep) {
    const auto a = s.sample(b, 5);
    ASSERT_EQ(a.size(), 5u);
    EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
    EXPECT_EQ(std::set<int64_t>(a.begin(), a.end()).size(), a.size());
    for (int64_t x : a) EXPECT_TRUE(std::binary_search(valid.begin(), valid.end(), x)) << x;
  }
  EXPECT_EQ(s.sample(b, 100), valid);  // fewer valid positions than the cap: all of them
}

TEST(Anchors, RoughlyUniform) {
  dflash::AnchorSampler s(7);
  const auto b = make_batch();
  std::vector<int> count(16, 0);
  const int reps = 8000;
  for (int rep = 0; rep < reps; ++rep)
    for (int64_t x : s.sample(b, 2)) ++count[x];
  // each of the 8 valid positions is drawn with probability 2/8
  for (int64_t p : {1, 2, 7, 8, 11, 12, 13, 14}) EXPECT_NEAR(count[p] / double(reps), 0.25, 0.03) << p;
}

TEST(Anchors, SeededAndResumableFromState) {
  const auto b = make_batch();
  dflash::AnchorSampler a(123), c(123), d(124);
  EXPECT_EQ(a.sample(b, 3), c.sample(b, 3));
  const std::string st = a.state();
  const auto next1 = a.sample(b, 3);
  const auto next2 = a.sample(b, 3);
  dflash::AnchorSampler r(999);
  r.set_state(st);
  EXPECT_EQ(r.sample(b, 3), next1);
  EXPECT_EQ(r.sample(b, 3), next2);
  bool differs = false;
  for (int i = 0; i < 10 && !differs; ++i) differs = c.sample(b, 3) != d.sample(b, 3);
  EXPECT_TRUE(differs);
}

TEST(Anchors, MalformedStateIsBadInput) {
  dflash::AnchorSampler a(1);
  EXPECT_EXIT(a.set_state("not a state"), testing::ExitedWithCode(3), "random generator state");
}

}  // namespace
