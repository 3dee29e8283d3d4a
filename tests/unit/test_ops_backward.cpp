// CPU op backwards against central finite differences of the double-precision reference forwards.
//
// Loss L = sum(out * G) for a random G; the op's backward gets dout = G and must return dL/d(input).
#include <gtest/gtest.h>

#include <ostream>

#include <functional>

#include "dflash/ops.h"
#include "ops_test_util.h"

namespace dflash {
namespace {

using test::random_vec;
using test::rel_err;
using test::to_double;

const Ctx kCpu = cpu_ctx();

double dot(const std::vector<double>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of f at x, in double.
std::vector<double> numeric_grad(const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
                                 double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

constexpr double kTol = 1e-4;

TEST(OpsBackward, MatmulInputAndAccumulatedWeightGrad) {
  const int64_t N = 5, I = 11, O = 6;
  auto in = random_vec(N * I, 1), W = random_vec(O * I, 2), G = random_vec(N * O, 3), prior = random_vec(O * I, 4);
  std::vector<float> din(N * I, 7.0f), dW = prior;
  ops::matmul_backward(kCpu, cpu_view(din.data(), {N, I}), cpu_view(dW.data(), {O, I}), cpu_view(G.data(), {N, O}),
                       cpu_view(in.data(), {N, I}), cpu_view(W.data(), {O, I}));
  auto want_din = numeric_grad([&](const std::vector<double>& x) {
    return dot(test::ref::matmul(x, to_double(W), N, I, O), G);
  }, to_double(in));
  auto want_dW = numeric_grad([&](const std::vector<double>& w) {
    return dot(test::ref::matmul(to_double(in), w, N, I, O), G);
  }, to_double(W));
  for (size_t i = 0; i < want_dW.size(); ++i) want_dW[i] += prior[i];  // accumulated, not overwritten
  EXPECT_LT(rel_err(din, want_din), kTol);
  EXPECT_LT(rel_err(dW, want_dW), kTol);

  // Empty outputs are skipped.
  std::vector<float> din2(N * I);
  ops::matmul_backward(kCpu, cpu_view(din2.data(), {N, I}), Tensor(), cpu_view(G.data(), {N, O}),
                       cpu_view(in.data(), {N, I}), cpu_view(W.data(), {O, I}));
  EXPECT_EQ(din2, din);
}

TEST(OpsBackward, MatmulLargerThanOneBlock) {
  // Crosses the inner (512) block and has remainders; checked against the exact double gradient
  // (finite differences would be slow here, and the product rule is exact for a linear map).
  const int64_t N = 7, I = 530, O = 9;
  auto in = random_vec(N * I, 5), W = random_vec(O * I, 6), G = random_vec(N * O, 7);
  std::vector<float> din(N * I), dW(O * I, 0.0f);
  ops::matmul_backward(kCpu, cpu_view(din.data(), {N, I}), cpu_view(dW.data(), {O, I}), cpu_view(G.data(), {N, O}),
                       cpu_view(in.data(), {N, I}), cpu_view(W.data(), {O, I}));
  std::vector<double> want_din(N * I, 0.0), want_dW(O * I, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < I; ++i) {
        want_din[n * I + i] += double(G[n * O + o]) * W[o * I + i];
        want_dW[o * I + i] += double(G[n * O + o]) * in[n * I + i];
      }
  EXPECT_LT(rel_err(din, want_din), 1e-6);
  EXPECT_LT(rel_err(dW, want_dW), 1e-6);
}

TEST(OpsBackward, Rmsnorm) {
  const int64_t N = 4, C = 9;
  auto in = random_vec(N * C, 8, 2.0f), w = random_vec(C, 9, 0.2f, 1.0f), G = random_vec(N * C, 10);
  std::vector<float> out(N * C), rstd(N), din(N * C), dw(C, 0.5f);
  ops::rmsnorm_forward(kCpu, cpu_view(out.data(), {N, C}), cpu_view(rstd.data(), {N}), cpu_view(in.data(), {N, C}),
                       cpu_view(w.data(), {C}), 1e-6f);
  ops::rmsnorm_backward(kCpu, cpu_view(din.data(), {N, C}), cpu_view(dw.data(), {C}), cpu_view(G.data(), {N, C}),
                        cpu_view(in.data(), {N, C}), cpu_view(w.data(), {C}), cpu_view(rstd.data(), {N}));
  auto want_din = numeric_grad([&](const std::vector<double>& x) {
    return dot(test::ref::rmsnorm(x, to_double(w), N, C, 1e-6), G);
  }, to_double(in));
  auto want_dw = numeric_grad([&](const std::vector<double>& ww) {
    return dot(test::ref::rmsnorm(to_double(in), ww, N, C, 1e-6), G);
  }, to_double(w));
  for (auto& x : want_dw) x += 0.5;
  EXPECT_LT(rel_err(din, want_din), kTol);
  EXPECT_LT(rel_err(dw, want_dw), kTol);
}

struct RopeCase {
  int64_t nh, hd;
  int rot;
  bool saved_rstd;
};
void PrintTo(const RopeCase& c, std::ostream* os) {
  *os << "h" << c.nh << "_hd" << c.hd << "_rot" << c.rot << (c.saved_rstd ? "_saved_rstd" : "");
}
class OpsHeadNormRopeBackward : public ::testing::TestWithParam<RopeCase> {};

TEST_P(OpsHeadNormRopeBackward, MatchesFiniteDifferences) {
  const auto [nh, hd, rot, saved_rstd] = GetParam();
  const int64_t N = 5;
  const float theta = 1e4f, eps = 1e-6f;
  auto in = random_vec(N * nh * hd, 11, 2.0f), w = random_vec(hd, 12, 0.2f, 1.0f), G = random_vec(N * nh * hd, 13);
  std::vector<int32_t> pos = {0, 3, 1, 17, 40};
  std::vector<float> out(in.size()), rstd(N * nh), din(in.size()), dw(hd, 0.0f);
  const ops::RopeSpec spec{theta, rot};
  ops::head_norm_rope_forward(kCpu, cpu_view(out.data(), {N, nh, hd}), cpu_view(rstd.data(), {N, nh}),
                              cpu_view(in.data(), {N, nh, hd}), cpu_view(w.data(), {hd}), cpu_view(pos.data(), {N}),
                              spec, eps);
  ops::head_norm_rope_backward(kCpu, cpu_view(din.data(), {N, nh, hd}), cpu_view(dw.data(), {hd}),
                               cpu_view(G.data(), {N, nh, hd}), cpu_view(in.data(), {N, nh, hd}),
                               cpu_view(w.data(), {hd}), saved_rstd ? cpu_view(rstd.data(), {N, nh}) : Tensor(),
                               cpu_view(pos.data(), {N}), spec, eps);
  const int r = rot ? rot : int(hd);
  auto want_din = numeric_grad([&](const std::vector<double>& x) {
    return dot(test::ref::head_norm_rope(x, to_double(w), pos, N, nh, hd, r, theta, eps), G);
  }, to_double(in));
  auto want_dw = numeric_grad([&](const std::vector<double>& ww) {
    return dot(test::ref::head_norm_rope(to_double(in), ww, pos, N, nh, hd, r, theta, eps), G);
  }, to_double(w));
  EXPECT_LT(rel_err(din, want_din), kTol);
  EXPECT_LT(rel_err(dw, want_dw), kTol);
}

// Full and partial rotary, with the forward's rstd and recomputed.
INSTANTIATE_TEST_SUITE_P(Ops, OpsHeadNormRopeBackward,
                         ::testing::Values(RopeCase{3, 12, 0, true}, RopeCase{2, 16, 8, true},
                                           RopeCase{2, 12, 4, false}, RopeCase{1, 8, 0, false}));

TEST(OpsBackward, Swiglu) {
  const int64_t N = 3, I = 7;
  auto gate = random_vec(N * I, 14, 2.0f), up = random_vec(N * I, 15), G = random_vec(N * I, 16);
  std::vector<float> dgate(N * I), dup(N * I);
  ops::swiglu_backward(kCpu, cpu_view(dgate.data(), {N, I}), cpu_view(dup.data(), {N, I}), cpu_view(G.data(), {N, I}),
                       cpu_view(gate.data(), {N, I}), cpu_view(up.data(), {N, I}));
  auto want_dgate = numeric_grad([&](const std::vector<double>& g) {
    return dot(test::ref::swiglu(g, to_double(up)), G);
  }, to_double(gate));
  auto want_dup = numeric_grad([&](const std::vector<double>& u) {
    return dot(test::ref::swiglu(to_double(gate), u), G);
  }, to_double(up));
  EXPECT_LT(rel_err(dgate, want_dgate), kTol);
  EXPECT_LT(rel_err(dup, want_dup), kTol);
}

}  // namespace
}  // namespace dflash
