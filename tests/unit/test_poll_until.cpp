// mpi::poll_until / mpi::wait_until, the one deadline wait (include/dflash/mpi_typed.h). No MPI call.
#include <gtest/gtest.h>

#include "dflash/mpi_typed.h"

using namespace dflash;

TEST(PollUntil, RunsProgressBeforeEachTestUntilDone) {
  int progressed = 0, tested = 0;
  mpi::Polling polling;
  polling.progress = [&] { ++progressed; };
  EXPECT_TRUE(mpi::poll_until([&] { return ++tested == 5; }, 10.0, polling));
  EXPECT_EQ(tested, 5);
  EXPECT_EQ(progressed, 5);  // the caller's duties ran before every test, the last one included
}

TEST(PollUntil, FalseOnceTheDeadlinePassed) {
  const auto t0 = mpi::Clock::now();
  EXPECT_FALSE(mpi::poll_until([] { return false; }, 0.05));
  EXPECT_GE(mpi::seconds_since(t0), 0.05);
}

TEST(PollUntil, BusyPollsWithoutSleeping) {
  int polls = 0;
  mpi::Polling polling;
  polling.busy = [] { return true; };
  polling.max_sleep_us = 1000000;  // a sleep would show: 1 s
  const auto t0 = mpi::Clock::now();
  EXPECT_TRUE(mpi::poll_until([&] { return ++polls == 50; }, 10.0, polling));
  EXPECT_LT(mpi::seconds_since(t0), 0.5);
}

TEST(WaitUntilDeath, ExpiryIsLostPeerNamingTheWait) {
  EXPECT_EXIT(mpi::wait_until([] { return false; }, 0.05, [] { return std::string("lost peer: rank 3 said nothing"); }),
              testing::ExitedWithCode(7), "lost peer: rank 3 said nothing \\(waited 0 s\\)");
}
