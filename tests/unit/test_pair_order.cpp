// PairOrder: a drafter issues its NCCL receives from one target in the target's send order, whatever
// order it notices the slots' headers in.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "dflash/pair_order.h"

using dflash::PairOrder;

#define EXPECT_INTERNAL_ERROR(stmt, what) \
  EXPECT_EXIT(stmt, testing::ExitedWithCode(static_cast<int>(dflash::ExitCode::Internal)), what)

TEST(PairOrder, InOrderArrivalsPassStraightThrough) {
  PairOrder o;
  for (int seq = 0; seq < 5; ++seq) {
    o.arrived(seq, seq % 3);
    EXPECT_EQ(o.take_next(), seq % 3);
    EXPECT_EQ(o.take_next(), -1);
  }
  EXPECT_EQ(o.next_seq(), 5);
}

TEST(PairOrder, AheadOfTurnWaitsForTheGap) {
  PairOrder o;
  o.arrived(2, 7);
  o.arrived(1, 5);
  EXPECT_EQ(o.take_next(), -1);  // seq 0 not here yet: nothing may be issued
  EXPECT_EQ(o.waiting(), 2u);
  o.arrived(0, 3);
  EXPECT_EQ(o.take_next(), 3);
  EXPECT_EQ(o.take_next(), 5);
  EXPECT_EQ(o.take_next(), 7);
  EXPECT_EQ(o.take_next(), -1);
  EXPECT_EQ(o.waiting(), 0u);
}

TEST(PairOrder, RandomArrivalOrderIssuesSeqOrder) {
  std::mt19937 rng(7);
  std::vector<int> seqs(64);
  for (int i = 0; i < 64; ++i) seqs[i] = i;
  std::shuffle(seqs.begin(), seqs.end(), rng);
  PairOrder o;
  std::vector<int> issued;
  for (int s : seqs) {
    o.arrived(s, 100 + s);  // slot = 100 + seq, to read the order back
    for (int slot; (slot = o.take_next()) >= 0;) issued.push_back(slot - 100);
  }
  ASSERT_EQ(issued.size(), 64u);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(issued[i], i);
}

TEST(PairOrder, DuplicateOrStaleSeqIsAnInternalError) {
  PairOrder o;
  o.arrived(1, 0);
  EXPECT_INTERNAL_ERROR(o.arrived(1, 2), "arrived twice");
  o.arrived(0, 1);
  EXPECT_EQ(o.take_next(), 1);
  EXPECT_EQ(o.take_next(), 0);
  EXPECT_INTERNAL_ERROR(o.arrived(0, 3), "after its turn");
}
