// Chunked lm_head loss (CE and KL) against a float64 reference and its finite differences; loss rows,
// weights, metrics and D-PACE factors of the objective.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "dflash/drafter_ops.h"
#include "drafter/objective.h"

namespace {

using dflash::cpu_ctx;
using dflash::cpu_view;
using dflash::Tensor;
namespace ops = dflash::ops;

struct Problem {
  int64_t R = 7, H = 6, V = 11;
  std::vector<double> h, t, W;  // [R,H], [R,H], [V,H] (float-representable)
  std::vector<int32_t> labels;
  std::vector<double> w;  // row weights
};

Problem make_problem(uint32_t seed) {
  Problem p;
  std::mt19937 gen(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto fill = [&](std::vector<double>& v, size_t n) {
    v.resize(n);
    for (double& x : v) x = static_cast<float>(nd(gen));
  };
  fill(p.h, p.R * p.H);
  fill(p.t, p.R * p.H);
  fill(p.W, p.V * p.H);
  for (int64_t r = 0; r < p.R; ++r) {
    p.labels.push_back(static_cast<int32_t>((r * 5 + 3) % p.V));
    p.w.push_back(static_cast<float>(0.1 + 0.13 * r));
  }
  return p;
}

// Per-row CE and KL in float64.
void reference(const Problem& p, std::vector<double>& ce, std::vector<double>& kl, std::vector<int>& am_q,
               std::vector<int>& am_p) {
  ce.assign(p.R, 0);
  kl.assign(p.R, 0);
  am_q.assign(p.R, 0);
  am_p.assign(p.R, 0);
  for (int64_t r = 0; r < p.R; ++r) {
    std::vector<double> lq(p.V), lp(p.V);
    for (int64_t v = 0; v < p.V; ++v)
      for (int64_t i = 0; i < p.H; ++i) {
        lq[v] += p.h[r * p.H + i] * p.W[v * p.H + i];
        lp[v] += p.t[r * p.H + i] * p.W[v * p.H + i];
      }
    auto lse = [&](const std::vector<double>& x) {
      double m = *std::max_element(x.begin(), x.end()), s = 0;
      for (double y : x) s += std::exp(y - m);
      return m + std::log(s);
    };
    const double zq = lse(lq), zp = lse(lp);
    ce[r] = zq - lq[p.labels[r]];
    for (int64_t v = 0; v < p.V; ++v) kl[r] += std::exp(lp[v] - zp) * ((lp[v] - zp) - (lq[v] - zq));
    am_q[r] = static_cast<int>(std::max_element(lq.begin(), lq.end()) - lq.begin());
    am_p[r] = static_cast<int>(std::max_element(lp.begin(), lp.end()) - lp.begin());
  }
}

struct LossRun {
  std::vector<float> h, t, W, ce, kl, w, dh, ws;
  std::vector<int32_t> am_q, am_p, labels;
};

LossRun prepare(const Problem& p, int64_t chunk) {
  LossRun x;
  x.h.assign(p.h.begin(), p.h.end());
  x.t.assign(p.t.begin(), p.t.end());
  x.W.assign(p.W.begin(), p.W.end());
  x.w.assign(p.w.begin(), p.w.end());
  x.labels = p.labels;
  x.ce.resize(p.R);
  x.kl.resize(p.R);
  x.am_q.resize(p.R);
  x.am_p.resize(p.R);
  x.dh.resize(p.R * p.H);
  x.ws.resize(ops::lm_loss_workspace_floats(chunk, p.V, true));
  return x;
}

double rel_err(const std::vector<float>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(LossChunked, ForwardMatchesReferenceForEveryChunking) {
  const Problem p = make_problem(11);
  std::vector<double> ce, kl;
  std::vector<int> am_q, am_p;
  reference(p, ce, kl, am_q, am_p);
  for (int64_t chunk : {1, 3, 7, 64}) {
    LossRun x = prepare(p, chunk);
    ops::LmLossRowsOut out{cpu_view(x.ce.data(), {p.R}), cpu_view(x.kl.data(), {p.R}), cpu_view(x.am_q.data(), {p.R}),
                           cpu_view(x.am_p.data(), {p.R})};
    ops::lm_loss_forward(cpu_ctx(), out, cpu_view(x.h.data(), {p.R, p.H}), cpu_view(x.W.data(), {p.V, p.H}),
                         cpu_view(x.labels.data(), {p.R}), cpu_view(x.t.data(), {p.R, p.H}),
                         cpu_view(x.ws.data(), {static_cast<int64_t>(x.ws.size())}), chunk);
    EXPECT_LT(rel_err(x.ce, ce), 1e-6) << "chunk " << chunk;
    EXPECT_LT(rel_err(x.kl, kl), 1e-5) << "chunk " << chunk;
    for (int64_t r = 0; r < p.R; ++r) {
      EXPECT_EQ(x.am_q[r], am_q[r]);
      EXPECT_EQ(x.am_p[r], am_p[r]);
    }
  }
}

void check_grad(ops::LossObjective obj) {
  Problem p = make_problem(obj == ops::LossObjective::CE ? 21 : 22);
  // finite differences of sum_r w_r loss_r with respect to h, on the float64 reference
  auto total = [&]() {
    std::vector<double> ce, kl;
    std::vector<int> a, b;
    reference(p, ce, kl, a, b);
    double s = 0;
    for (int64_t r = 0; r < p.R; ++r) s += p.w[r] * (obj == ops::LossObjective::CE ? ce[r] : kl[r]);
    return s;
  };
  std::vector<double> fd(p.h.size());
  for (size_t i = 0; i < p.h.size(); ++i) {
    const double keep = p.h[i], eps = 1e-6;
    p.h[i] = keep + eps;
    const double lp = total();
    p.h[i] = keep - eps;
    const double lm = total();
    p.h[i] = keep;
    fd[i] = (lp - lm) / (2 * eps);
  }
  const int64_t chunk = 3;
  LossRun x = prepare(p, chunk);
  const Tensor ws = cpu_view(x.ws.data(), {static_cast<int64_t>(x.ws.size())});
  ops::lm_loss_backward(cpu_ctx(), cpu_view(x.dh.data(), {p.R, p.H}), cpu_view(x.w.data(), {p.R}), obj,
                        cpu_view(x.h.data(), {p.R, p.H}), cpu_view(x.W.data(), {p.V, p.H}),
                        cpu_view(x.labels.data(), {p.R}), cpu_view(x.t.data(), {p.R, p.H}), ws, chunk);
  EXPECT_LT(rel_err(x.dh, fd), 1e-5) << "backward (recompute)";
  // the fused forward produces the same gradient in one pass
  std::vector<float> dh2(x.dh.size(), 123.f);
  ops::LmLossRowsOut out{cpu_view(x.ce.data(), {p.R}), Tensor(), cpu_view(x.am_q.data(), {p.R}), Tensor()};
  ops::lm_loss_forward(cpu_ctx(), out, cpu_view(x.h.data(), {p.R, p.H}), cpu_view(x.W.data(), {p.V, p.H}),
                       cpu_view(x.labels.data(), {p.R}), cpu_view(x.t.data(), {p.R, p.H}), ws, chunk,
                       cpu_view(dh2.data(), {p.R, p.H}), cpu_view(x.w.data(), {p.R}), obj);
  EXPECT_LT(rel_err(dh2, fd), 1e-5) << "fused forward";
}

TEST(LossChunked, CeGradientMatchesFiniteDifferences) { check_grad(ops::LossObjective::CE); }
TEST(LossChunked, KlGradientMatchesFiniteDifferences) { check_grad(ops::LossObjective::KL); }

TEST(LossRows, WeightsMaskAndSequenceEnd) {
  dflash::PackedBatch b;
  b.tokens = {10, 11, 12, 13, 14, 20, 21, 22, 23};
  b.cu_seqlens = {0, 5, 9};
  b.loss_mask = {0, 1, 1, 0, 1, 1, 1, 1, 1};
  dflash::train::LossRows rows;
  // block of 4 at anchor 1 (seq 0): k=1 -> 2 (mask 1), k=2 -> 3 (mask 0), k=3 -> 4 (mask 1)
  // block at anchor 7 (seq 1, ends at 9): k=1 -> 8, k=2 -> 9 is past the end
  dflash::train::build_loss_rows(b, {1, 7}, {5, 9}, 4, 7.0f, rows);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows.label, (std::vector<int32_t>{12, 14, 23}));
  EXPECT_EQ(rows.block_row, (std::vector<int32_t>{1, 3, 5}));
  EXPECT_EQ(rows.teacher_at, (std::vector<int32_t>{1, 3, 7}));
  EXPECT_FLOAT_EQ(rows.weight[0], 1.0f);
  EXPECT_FLOAT_EQ(rows.weight[1], std::exp(-2.0f / 7.0f));
  EXPECT_FLOAT_EQ(rows.weight[2], 1.0f);
}

TEST(LossMetrics, StreakSkipsMissingPositionsAndStopsAtFirstMiss) {
  dflash::train::LossRows rows;
  // block 0: k=1 ok, k=3 ok (k=2 has no row) -> 2;  block 1: k=1 miss, k=2 ok -> 0;  block 2: no rows -> 0
  rows.block = {0, 0, 1, 1};
  rows.offset = {1, 3, 1, 2};
  rows.label = {5, 6, 7, 8};
  rows.block_row = {1, 3, 5, 6};
  rows.teacher_at = {0, 0, 0, 0};
  rows.weight = {1, 1, 1, 1};
  const std::vector<int32_t> am_q = {5, 6, 0, 8}, am_p = {5, 0, 0, 8};
  dflash::StepStats st;
  dflash::train::fill_metrics(rows, am_q.data(), am_p.data(), 3, 4, st);
  EXPECT_DOUBLE_EQ(st.acc, 0.75);
  EXPECT_DOUBLE_EQ(st.agree, 0.75);
  EXPECT_DOUBLE_EQ(st.streak, 2.0 / 3.0);
  EXPECT_EQ(st.per_pos_acc, (std::vector<double>{0.0, 0.5, 1.0, 1.0}));
  dflash::train::fill_metrics(rows, am_q.data(), nullptr, 3, 4, st);
  EXPECT_TRUE(std::isnan(st.agree));
}

TEST(LossDpace, FactorsAreSuffixSumsOfAcceptanceProducts) {
  dflash::train::LossRows rows;
  rows.block = {0, 0, 0, 1};
  rows.offset = {1, 2, 3, 1};
  rows.label = rows.block_row = rows.teacher_at = {0, 0, 0, 0};
  rows.weight = {1, 1, 1, 1};
  const std::vector<float> c = {0.5f, 0.25f, 0.8f, 0.9f};
  std::vector<float> ce;
  for (float x : c) ce.push_back(-std::log(x));
  std::vector<double> d;
  dflash::train::dpace_factors(rows, ce.data(), 4, d);
  const double p1 = 0.5, p2 = 0.5 * 0.25, p3 = 0.5 * 0.25 * 0.8;
  EXPECT_NEAR(d[0], p1 + p2 + p3, 1e-6);
  EXPECT_NEAR(d[1], p2 + p3, 1e-6);
  EXPECT_NEAR(d[2], p3, 1e-6);
  EXPECT_NEAR(d[3], 0.9, 1e-6);
}

}  // namespace
