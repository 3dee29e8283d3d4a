// Helpers of the multi-rank gradient-reducer tests (tests/mpi/, tests/gpu_mpi/): ranks, a bounded wait
// for a reducer, seeded per-rank inputs (nccl-tests style: every rank regenerates every rank's data) and
// the comparison with the expected sum.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dflash/grad_reducer.h"
#include "dflash/mpi_typed.h"

namespace dflash::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Polls done() (never blocks); false after 60 s.
inline bool wait_done(GradientReducer& r) {
  mpi::Deadline deadline(60);
  mpi::Backoff backoff(200);
  while (!r.done()) {
    if (deadline.expired()) return false;
    backoff.idle();
  }
  return true;
}

inline std::vector<GradRange> ranges_of(const std::vector<size_t>& sizes) {
  std::vector<GradRange> r;
  size_t at = 0;
  for (size_t n : sizes) {
    r.push_back({at, at + n});
    at += n;
  }
  return r;
}

// Compares got with the expected sum: bit for bit with 1 or 2 ranks (no addition, or one), else within
// 1e-6 of the sum of magnitudes. Returns the number of mismatches (and reports the first few).
inline size_t compare_sum(const float* got, const std::vector<float>& want, const std::vector<float>& magnitude,
                          const std::string& what) {
  const bool exact = world_size() <= 2;
  size_t bad = 0, inexact = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    inexact += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
    const bool ok = exact ? std::memcmp(&got[i], &want[i], sizeof(float)) == 0
                          : std::fabs(double(got[i]) - double(want[i])) <= 1e-6 * double(magnitude[i]) + 1e-30;
    if (!ok && ++bad <= 3)
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i]
                    << (exact ? " (bit for bit)" : " (1e-6 relative)");
  }
  if (world_rank() == 0 && inexact > 0)
    std::printf("# %s: %zu of %zu elements differ in the last bits from the local left-to-right sum\n", what.c_str(),
                inexact, want.size());
  return bad;
}

// Rank `rank`'s gradient at step `step`, uniform in [-1, 1), and its prescale (stands for Σw_local).
inline std::vector<float> seeded(size_t n, int rank, int step) {
  std::mt19937 rng(1000u + 17u * static_cast<uint32_t>(rank) + 7919u * static_cast<uint32_t>(step));
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}
inline float prescale_of(int rank, int step) {
  return 0.75f + 1.5f * static_cast<float>(rank) + 0.125f * static_cast<float>(step);
}

}  // namespace dflash::test
