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

// ---- per record (--anchors-per-record) ----------------------------------------------------------------

// Records of the given lengths, loss_mask 1 except every 5th position (so validity has holes).
dflash::PackedBatch records(const std::vector<int>& lengths) {
  dflash::PackedBatch b;
  b.cu_seqlens = {0};
  for (int n : lengths) b.cu_seqlens.push_back(b.cu_seqlens.back() + n);
  b.tokens.assign(static_cast<size_t>(b.cu_seqlens.back()), 1);
  b.loss_mask.resize(b.tokens.size());
  for (size_t i = 0; i < b.loss_mask.size(); ++i) b.loss_mask[i] = i % 5 != 4;
  return b;
}

// Anchors of each record and the valid positions it has.
std::vector<std::pair<int, int>> per_record_counts(const dflash::PackedBatch& b, const std::vector<int64_t>& a) {
  std::vector<int64_t> valid;
  dflash::valid_anchor_positions(b, valid);
  std::vector<std::pair<int, int>> c(static_cast<size_t>(b.num_seqs()), {0, 0});
  for (int s = 0; s < b.num_seqs(); ++s) {
    for (int64_t v : valid) c[s].second += v >= b.cu_seqlens[s] && v < b.cu_seqlens[s + 1];
    for (int64_t x : a) c[s].first += x >= b.cu_seqlens[s] && x < b.cu_seqlens[s + 1];
  }
  return c;
}

TEST(AnchorsPerRecord, BoundPerRecordEveryRecordServedSortedValid) {
  const auto b = records({40, 3, 1, 25, 7, 60});
  std::vector<int64_t> valid;
  dflash::valid_anchor_positions(b, valid);
  dflash::AnchorSampler s(5);
  for (int rep = 0; rep < 50; ++rep) {
    const auto a = s.sample(b, 1000, 6);
    EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
    EXPECT_EQ(std::set<int64_t>(a.begin(), a.end()).size(), a.size());
    for (int64_t x : a) EXPECT_TRUE(std::binary_search(valid.begin(), valid.end(), x)) << x;
    size_t want = 0;
    for (const auto& [got, n] : per_record_counts(b, a)) {
      EXPECT_EQ(got, std::min(n, 6));  // up to 6, all of a record's valid positions when it has fewer
      want += static_cast<size_t>(std::min(n, 6));
    }
    EXPECT_EQ(a.size(), want);
  }
  // More anchors than the per-batch rule at the same N: 6 per record, not 6 per batch.
  EXPECT_GT(s.sample(b, 1000, 6).size(), s.sample(b, 6).size());
  EXPECT_EQ(s.sample(b, 1000, 1000), valid);  // a bound above every record's count: all of them
}

TEST(AnchorsPerRecord, UniformWithinARecord) {
  const auto b = records({12, 30});  // record 0: 12 tokens, valid 0,1,2,5,6,7,10 (7 positions)
  dflash::AnchorSampler s(11);
  std::vector<int> count(42, 0);
  const int reps = 8000;
  for (int rep = 0; rep < reps; ++rep)
    for (int64_t x : s.sample(b, 1000, 2)) ++count[x];
  for (int64_t p : {0, 1, 2, 5, 6, 7, 10}) EXPECT_NEAR(count[p] / double(reps), 2.0 / 7, 0.03) << p;
}

TEST(AnchorsPerRecord, CapSubsamplesUniformlyAmongTheDraws) {
  const auto b = records({40, 40, 40, 40});  // 4 records, each with more than 8 valid positions
  dflash::AnchorSampler s(3);
  std::vector<double> share(4, 0);
  const int reps = 4000;
  for (int rep = 0; rep < reps; ++rep) {
    const auto a = s.sample(b, 10, 8);  // 32 draws, 10 kept
    ASSERT_EQ(a.size(), 10u);
    EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
    const auto c = per_record_counts(b, a);
    for (size_t r = 0; r < c.size(); ++r) {
      EXPECT_LE(c[r].first, 8);
      share[r] += c[r].first;
    }
  }
  for (double x : share) EXPECT_NEAR(x / reps, 2.5, 0.1);  // each record's expected share: 10 x 8 / 32
}

TEST(AnchorsPerRecord, SeededAndResumableFromState) {
  const auto b = records({33, 17, 50});
  dflash::AnchorSampler a(77), c(77), d(78);
  EXPECT_EQ(a.sample(b, 20, 5), c.sample(b, 20, 5));
  const std::string st = a.state();
  const auto next1 = a.sample(b, 20, 5), next2 = a.sample(b, 12, 5);
  dflash::AnchorSampler r(1);
  r.set_state(st);
  EXPECT_EQ(r.sample(b, 20, 5), next1);
  EXPECT_EQ(r.sample(b, 12, 5), next2);
  EXPECT_EQ(r.state(), a.state());
  bool differs = false;
  for (int i = 0; i < 10 && !differs; ++i) differs = c.sample(b, 20, 5) != d.sample(b, 20, 5);
  EXPECT_TRUE(differs);
}

// per_record 0 is the per-batch rule, draw for draw: the sequence a sampler wrote before per-record anchors
// existed (seed 42, this batch), so a run without --anchors-per-record trains on the same anchors as before.
TEST(AnchorsPerRecord, ZeroIsThePerBatchRuleBitForBit) {
  const auto b = records({40, 3, 25, 60});
  dflash::AnchorSampler x(42), y(42);
  for (int rep = 0; rep < 20; ++rep) EXPECT_EQ(x.sample(b, 9), y.sample(b, 9, 0));
  EXPECT_EQ(x.state(), y.state());
  dflash::AnchorSampler z(42);
  EXPECT_EQ(z.sample(b, 5), (std::vector<int64_t>{10, 15, 46, 91, 126}));
}

TEST(AnchorsPerRecord, DefaultCapIsTheReferenceDensity) {
  EXPECT_EQ(dflash::default_max_anchors(512, 3072), 512);
  EXPECT_EQ(dflash::default_max_anchors(512, 32768), 512 * 11);
  EXPECT_EQ(dflash::default_max_anchors(512, 16384), 512 * 6);
  EXPECT_EQ(dflash::default_max_anchors(8, 512), 8);  // never below one record's worth
}

}  // namespace
