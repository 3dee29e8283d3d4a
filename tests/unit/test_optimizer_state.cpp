// --optimizer-state bf16 on the CPU: the stochastic rounding of include/dflash/stochastic_round.h (unbiased,
// a pure function of seed, step, index and slot) and ops::adamw_step_bf16state (every value a bf16 after a
// step, one of the two bf16 neighbours of the fp32 AdamW update, small updates not lost). The CUDA twin
// against this op: tests/gpu/test_drafter_adamw.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "dflash/optim.h"
#include "dflash/stochastic_round.h"

namespace dflash {
namespace {

float bf16_value(uint16_t h) { return bf16_to_f32(h); }
bool is_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)) == x; }
// The bf16 value next to x (a bf16 value) away from zero.
float next_away(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return bf16_value(static_cast<uint16_t>((u >> 16) + 1));
}
// x truncated to bf16 (toward zero).
float trunc_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return bf16_value(static_cast<uint16_t>(u >> 16));
}

// The mean of many roundings of one value is the value: each rounding goes to one of its two bf16
// neighbours, away from zero with probability (the dropped fraction of an ulp). 2^16 draws over the
// element index: the standard error of the mean is ulp * sqrt(f (1-f) / 2^16) <= ulp / 512; we allow 5x.
TEST(StochasticRound, UnbiasedOverManyDraws) {
  for (const float x : {1.0f + 0.3f * 0.0078125f, -3.14159f, 0.02f + 1.1e-5f, 6.1e-5f, -1e-30f, 12345.678f}) {
    const float lo = trunc_bf16(x), hi = next_away(lo), ulp = std::fabs(hi - lo);
    const int n = 1 << 16;
    double sum = 0;
    int up = 0;
    for (int i = 0; i < n; ++i) {
      const float r = bf16_value(sr::round_bf16(x, sr::random16(7, 3, static_cast<uint64_t>(i), sr::Slot::Param)));
      ASSERT_TRUE(r == lo || r == hi) << x << " rounded to " << r;
      sum += r;
      up += r == hi;
    }
    EXPECT_NEAR(sum / n, x, 5.0 * ulp / 512) << x;
    EXPECT_NEAR(static_cast<double>(up) / n, std::fabs(x - lo) / ulp, 5.0 / 512) << x;
  }
  // A bf16 value has nothing to drop: it stays, whatever the bits.
  for (uint32_t r : {0u, 1u, 0x8000u, 0xffffu}) EXPECT_EQ(bf16_value(sr::round_bf16(0.5f, r)), 0.5f);
}

// Round-to-nearest would never move 1.0 by an update of 1e-4 (an eighth of half an ulp); stochastic
// rounding moves it by the right amount on average.
TEST(StochasticRound, TruncationOrNearestWouldBeBiased) {
  const float x = 1.0f + 1e-4f;
  double sum = 0;
  const int n = 1 << 16;
  for (int i = 0; i < n; ++i) sum += bf16_value(sr::round_bf16(x, sr::random16(1, 1, static_cast<uint64_t>(i), sr::Slot::M)));
  EXPECT_GT(sum / n, 1.0 + 0.5e-4);
  EXPECT_LT(sum / n, 1.0 + 1.5e-4);
  EXPECT_EQ(bf16_value(sr::round_bf16(x, 0)), 1.0f);  // r = 0 is truncation
}

// The bits are a pure function of (seed, step, index, slot): the same call draws the same bits (a resumed
// run, the CUDA kernel), and changing any one argument draws others.
TEST(StochasticRound, DeterministicPerSeedStepIndexSlot) {
  EXPECT_EQ(sr::random16(5, 10, 123, sr::Slot::V), sr::random16(5, 10, 123, sr::Slot::V));
  int same_seed = 0, same_step = 0, same_index = 0, same_slot = 0;
  for (uint64_t i = 0; i < 4096; ++i) {
    const uint32_t r = sr::random16(5, 10, i, sr::Slot::Param);
    EXPECT_LT(r, 65536u);
    same_seed += r == sr::random16(6, 10, i, sr::Slot::Param);
    same_step += r == sr::random16(5, 11, i, sr::Slot::Param);
    same_index += r == sr::random16(5, 10, i + 4096, sr::Slot::Param);
    same_slot += r == sr::random16(5, 10, i, sr::Slot::M);
  }
  // Independent 16-bit draws agree 4096 / 65536 = 0.06 times on average.
  for (int same : {same_seed, same_step, same_index, same_slot}) EXPECT_LE(same, 3);
}

TEST(StochasticRound, NonFiniteRoundsToNearest) {
  const float inf = std::numeric_limits<float>::infinity();
  for (uint32_t r : {0u, 0xffffu}) {
    EXPECT_EQ(bf16_value(sr::round_bf16(inf, r)), inf);
    EXPECT_EQ(bf16_value(sr::round_bf16(-inf, r)), -inf);
    EXPECT_TRUE(std::isnan(bf16_value(sr::round_bf16(std::nanf(""), r))));
    EXPECT_TRUE(std::isnan(bf16_value(sr::round_bf16(-std::nanf("0x7fffff"), r))));
  }
}

std::vector<float> bf16_normal(size_t n, uint32_t seed, float sigma, bool positive = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(positive ? std::fabs(d(rng)) : d(rng)));
  return v;
}

// One step from bf16 state: each new p, m, v is one of the two bf16 neighbours of the fp32 AdamW update
// from the same state (ops::adamw_step, the same fp32 arithmetic), F32 storage and BF16 storage give the
// same bits, and the same (seed, step) gives the same state again (a resume).
TEST(AdamWBf16State, EachValueIsANeighbourOfTheFp32Update) {
  const int64_t n = 10007;
  ops::AdamWHyper hp;
  hp.lr = 1e-3f;
  hp.weight_decay = 0.1f;
  auto p = bf16_normal(n, 1, 0.02f), m = bf16_normal(n, 2, 1e-3f), v = bf16_normal(n, 3, 1e-6f, true);
  for (int64_t step = 1; step <= 3; ++step) {
    const auto g = bf16_normal(n, 10 + step, 0.01f);
    std::vector<float> rp = p, rm = m, rv = v, gg = g;  // the fp32 reference
    ops::adamw_step(cpu_ctx(), cpu_view(rp.data(), {n}), cpu_view(gg.data(), {n}), cpu_view(rm.data(), {n}),
                    cpu_view(rv.data(), {n}), hp, step);
    std::vector<uint16_t> bp(n), bm(n), bv(n);  // the same state in BF16 storage
    for (int64_t i = 0; i < n; ++i) bp[i] = f32_to_bf16(p[i]), bm[i] = f32_to_bf16(m[i]), bv[i] = f32_to_bf16(v[i]);
    const std::vector<float> p0 = p, m0 = m, v0 = v;
    ops::adamw_step_bf16state(cpu_ctx(), cpu_view(p.data(), {n}), cpu_view(g.data(), {n}), cpu_view(m.data(), {n}),
                              cpu_view(v.data(), {n}), hp, step, 42);
    auto bf = [&](std::vector<uint16_t>& x) { return Tensor(x.data(), DType::BF16, Device::CPU, {n}); };
    ops::adamw_step_bf16state(cpu_ctx(), bf(bp), cpu_view(g.data(), {n}), bf(bm), bf(bv), hp, step, 42);
    int moved_up = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (auto [got, want, what] : {std::tuple{p[i], rp[i], "p"}, std::tuple{m[i], rm[i], "m"}, std::tuple{v[i], rv[i], "v"}}) {
        ASSERT_TRUE(is_bf16(got)) << what << "[" << i << "] = " << got << " is no bf16 value";
        const float lo = trunc_bf16(want);
        ASSERT_TRUE(got == lo || got == next_away(lo)) << what << "[" << i << "] step " << step << ": " << got
                                                       << " is not a bf16 neighbour of " << want;
      }
      moved_up += p[i] != trunc_bf16(rp[i]);
      ASSERT_EQ(bp[i], f32_to_bf16(p[i]));
      ASSERT_EQ(bm[i], f32_to_bf16(m[i]));
      ASSERT_EQ(bv[i], f32_to_bf16(v[i]));
    }
    EXPECT_GT(moved_up, n / 10) << "stochastic rounding never rounded away from zero";
    std::vector<float> again_p = p0, again_m = m0, again_v = v0;  // the same step again: the same bits
    ops::adamw_step_bf16state(cpu_ctx(), cpu_view(again_p.data(), {n}), cpu_view(g.data(), {n}),
                              cpu_view(again_m.data(), {n}), cpu_view(again_v.data(), {n}), hp, step, 42);
    EXPECT_EQ(again_p, p);
    EXPECT_EQ(again_m, m);
    EXPECT_EQ(again_v, v);
  }
}

// Many small updates: the weights follow the fp32 run on average, where round-to-nearest would freeze
// them (an update of 1e-4 on weights near 1 is an eighth of half an ulp). 300 steps of a constant
// gradient on 4096 weights at 1.0: fp32 moves each by about 300 x lr = 0.03.
TEST(AdamWBf16State, SmallUpdatesAddUpOnAverage) {
  const int64_t n = 4096;
  ops::AdamWHyper hp;
  hp.lr = 1e-4f;
  std::vector<float> p(n, 1.0f), m(n, 0.f), v(n, 0.f), rp = p, rm = m, rv = v;
  std::vector<float> g(n, 0.5f);
  for (int64_t step = 1; step <= 300; ++step) {
    std::vector<float> g1 = g, g2 = g;
    ops::adamw_step(cpu_ctx(), cpu_view(rp.data(), {n}), cpu_view(g1.data(), {n}), cpu_view(rm.data(), {n}),
                    cpu_view(rv.data(), {n}), hp, step);
    ops::adamw_step_bf16state(cpu_ctx(), cpu_view(p.data(), {n}), cpu_view(g2.data(), {n}), cpu_view(m.data(), {n}),
                              cpu_view(v.data(), {n}), hp, step, 3);
  }
  double mean = 0;
  for (float x : p) mean += x;
  mean /= n;
  const double moved_fp32 = 1.0 - rp[0];
  EXPECT_NEAR(moved_fp32, 0.03, 0.002);
  EXPECT_NEAR(1.0 - mean, moved_fp32, 0.05 * moved_fp32) << "bf16 state mean " << mean << ", fp32 " << rp[0];
}

TEST(AdamWBf16State, RoundToBf16InPlaceIsRoundToNearest) {
  std::vector<float> x = {1.0f + 0.3f * 0.0078125f, 1.0f + 0.7f * 0.0078125f, -2.5f, 0.f};
  ops::round_to_bf16_inplace(cpu_view(x.data(), {4}));
  EXPECT_EQ(x, (std::vector<float>{1.0f, 1.0078125f, -2.5f, 0.f}));
}

TEST(AdamWBf16State, BytesPerParameter) {
  EXPECT_EQ(optimizer_state_bytes_per_param(OptimizerState::Fp32, Device::CUDA), 18);
  EXPECT_EQ(optimizer_state_bytes_per_param(OptimizerState::Bf16, Device::CUDA), 10);
  EXPECT_EQ(optimizer_state_bytes_per_param(OptimizerState::Fp32, Device::CPU), 16);
  EXPECT_EQ(optimizer_state_bytes_per_param(OptimizerState::Bf16, Device::CPU), 16);
}

}  // namespace
}  // namespace dflash
