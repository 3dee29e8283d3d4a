// CPU op forwards against naive double-precision references on random data.
#include <gtest/gtest.h>

#include <ostream>

#include "dflash/ops.h"
#include "ops_test_util.h"

namespace dflash {
namespace {

using test::random_vec;
using test::rel_err;
using test::to_double;

const Ctx kCpu = cpu_ctx();

struct MatmulShape {
  int64_t N, I, O;
};
void PrintTo(const MatmulShape& c, std::ostream* os) { *os << c.N << "x" << c.I << "x" << c.O; }

class OpsMatmulForward : public ::testing::TestWithParam<MatmulShape> {};

TEST_P(OpsMatmulForward, MatchesReferenceAndAccumulates) {
  const auto [N, I, O] = GetParam();
  auto in = random_vec(N * I, 1), W = random_vec(O * I, 2), prior = random_vec(N * O, 3);
  std::vector<float> out(N * O, 123.0f);  // garbage that Accumulate::No must overwrite
  ops::matmul_forward(kCpu, cpu_view(out.data(), {N, O}), cpu_view(in.data(), {N, I}), cpu_view(W.data(), {O, I}));
  auto want = test::ref::matmul(to_double(in), to_double(W), N, I, O);
  EXPECT_LT(rel_err(out, want), 1e-6);

  std::vector<float> acc = prior;
  ops::matmul_forward(kCpu, cpu_view(acc.data(), {N, O}), cpu_view(in.data(), {N, I}), cpu_view(W.data(), {O, I}),
                      ops::Accumulate::Yes);
  for (size_t i = 0; i < want.size(); ++i) want[i] += prior[i];
  EXPECT_LT(rel_err(acc, want), 1e-6);
}

// Remainders in every dimension, several row/out/inner blocks, degenerate sizes.
INSTANTIATE_TEST_SUITE_P(Ops, OpsMatmulForward,
                         ::testing::Values(MatmulShape{1, 1, 1}, MatmulShape{3, 7, 5}, MatmulShape{4, 8, 4},
                                           MatmulShape{37, 67, 29}, MatmulShape{130, 600, 70},
                                           MatmulShape{66, 1100, 131}, MatmulShape{5, 1, 3}));

TEST(OpsForward, EmbeddingCopiesRows) {
  const int64_t V = 11, H = 6;
  auto table = random_vec(V * H, 4);
  std::vector<int32_t> tok = {3, 0, 10, 3};
  std::vector<float> out(tok.size() * H);
  ops::embedding_forward(kCpu, cpu_view(out.data(), {4, H}), cpu_view(tok.data(), {4}), cpu_view(table.data(), {V, H}));
  for (size_t t = 0; t < tok.size(); ++t)
    for (int64_t c = 0; c < H; ++c) EXPECT_EQ(out[t * H + c], table[tok[t] * H + c]);
}

TEST(OpsForward, EmbeddingRejectsTokenOutsideVocab) {
  const int64_t V = 11, H = 6;
  auto table = random_vec(V * H, 4);
  std::vector<int32_t> tok = {3, 11};
  std::vector<float> out(tok.size() * H);
  EXPECT_EXIT(ops::embedding_forward(kCpu, cpu_view(out.data(), {2, H}), cpu_view(tok.data(), {2}),
                                     cpu_view(table.data(), {V, H})),
              testing::ExitedWithCode(3), "token id 11 at position 1 is outside the vocabulary");
}

TEST(OpsForward, RmsnormMatchesReference) {
  const int64_t N = 9, C = 37;
  auto in = random_vec(N * C, 5, 3.0f), w = random_vec(C, 6, 0.2f, 1.0f);
  std::vector<float> out(N * C), rstd(N);
  ops::rmsnorm_forward(kCpu, cpu_view(out.data(), {N, C}), cpu_view(rstd.data(), {N}), cpu_view(in.data(), {N, C}),
                       cpu_view(w.data(), {C}), 1e-6f);
  EXPECT_LT(rel_err(out, test::ref::rmsnorm(to_double(in), to_double(w), N, C, 1e-6)), 1e-6);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(in[n * C + c]) * in[n * C + c];
    EXPECT_NEAR(rstd[n], 1.0 / std::sqrt(ss / C + 1e-6), 1e-6 * rstd[n]);
  }
}

// out = residual + in W^T, with residual a separate buffer (left unchanged) or out itself.
TEST(OpsForward, MatmulResidualAddsTheResidual) {
  const int64_t N = 37, I = 600, O = 29;  // two inner blocks: the add must survive the blocked accumulation
  auto in = random_vec(N * I, 7), W = random_vec(O * I, 8), residual = random_vec(N * O, 9);
  auto want = test::ref::matmul(to_double(in), to_double(W), N, I, O);
  for (size_t i = 0; i < want.size(); ++i) want[i] += residual[i];
  const std::vector<float> residual_before = residual;
  std::vector<float> out(N * O, 123.0f);  // garbage the op must overwrite
  ops::matmul_residual_forward(kCpu, cpu_view(out.data(), {N, O}), cpu_view(in.data(), {N, I}),
                               cpu_view(W.data(), {O, I}), cpu_view(residual.data(), {N, O}));
  EXPECT_LT(rel_err(out, want), 1e-6);
  EXPECT_EQ(residual, residual_before);
  ops::matmul_residual_forward(kCpu, cpu_view(residual.data(), {N, O}), cpu_view(in.data(), {N, I}),
                               cpu_view(W.data(), {O, I}), cpu_view(residual.data(), {N, O}));  // in place
  EXPECT_LT(rel_err(residual, want), 1e-6);
}

TEST(OpsForward, MatmulResidualRefusesAPartialOverlap) {
  std::vector<float> in(3 * 4), W(5 * 4), buf(3 * 5 + 5);
  EXPECT_EXIT(ops::matmul_residual_forward(kCpu, cpu_view(buf.data(), {3, 5}), cpu_view(in.data(), {3, 4}),
                                           cpu_view(W.data(), {5, 4}), cpu_view(buf.data() + 5, {3, 5})),
              testing::ExitedWithCode(9), "residual must be out itself or not overlap it");
}

struct RopeCase {
  int64_t nh, hd;
  int rot;  // 0 = full
  float theta;
};
void PrintTo(const RopeCase& c, std::ostream* os) { *os << "h" << c.nh << "_hd" << c.hd << "_rot" << c.rot << "_theta" << c.theta; }
class OpsHeadNormRopeForward : public ::testing::TestWithParam<RopeCase> {};

TEST_P(OpsHeadNormRopeForward, MatchesReference) {
  const auto [nh, hd, rot, theta] = GetParam();
  const int64_t N = 13;
  auto in = random_vec(N * nh * hd, 10, 2.0f), w = random_vec(hd, 11, 0.2f, 1.0f);
  std::vector<int32_t> pos(N);
  for (int64_t n = 0; n < N; ++n) pos[n] = static_cast<int32_t>((n * 7) % 50);
  std::vector<float> out(in.size()), rstd(N * nh);
  ops::RopeSpec spec{theta, rot};
  ops::head_norm_rope_forward(kCpu, cpu_view(out.data(), {N, nh, hd}), cpu_view(rstd.data(), {N, nh}),
                              cpu_view(in.data(), {N, nh, hd}), cpu_view(w.data(), {hd}), cpu_view(pos.data(), {N}),
                              spec, 1e-6f);
  auto want = test::ref::head_norm_rope(to_double(in), to_double(w), pos, N, nh, hd, rot ? rot : int(hd), theta, 1e-6);
  EXPECT_LT(rel_err(out, want), 2e-6);
  // In place (out aliases in) gives the same result.
  std::vector<float> inplace = in;
  ops::head_norm_rope_forward(kCpu, cpu_view(inplace.data(), {N, nh, hd}), Tensor(),
                              cpu_view(inplace.data(), {N, nh, hd}), cpu_view(w.data(), {hd}),
                              cpu_view(pos.data(), {N}), spec, 1e-6f);
  EXPECT_EQ(inplace, out);
}

INSTANTIATE_TEST_SUITE_P(Ops, OpsHeadNormRopeForward,
                         ::testing::Values(RopeCase{4, 24, 0, 1e6f}, RopeCase{2, 16, 0, 1e4f},
                                           RopeCase{3, 32, 8, 1e7f}, RopeCase{1, 64, 16, 1e6f},
                                           RopeCase{2, 10, 6, 1e4f}));

TEST(OpsForward, SwigluMatchesReference) {
  const int64_t N = 5, I = 19;
  auto gate = random_vec(N * I, 12, 3.0f), up = random_vec(N * I, 13);
  std::vector<float> out(N * I);
  ops::swiglu_forward(kCpu, cpu_view(out.data(), {N, I}), cpu_view(gate.data(), {N, I}), cpu_view(up.data(), {N, I}));
  EXPECT_LT(rel_err(out, test::ref::swiglu(to_double(gate), to_double(up))), 1e-6);
}

struct AttnCase {
  int64_t nh, nkv, hd;
};
void PrintTo(const AttnCase& c, std::ostream* os) { *os << "h" << c.nh << "kv" << c.nkv << "_hd" << c.hd; }
class OpsAttentionForward : public ::testing::TestWithParam<AttnCase> {};

TEST_P(OpsAttentionForward, CausalInsideEachSequence) {
  const auto [nh, nkv, hd] = GetParam();
  // Lengths cross the 64-key block and include a 1-token and an empty sequence.
  std::vector<int32_t> cu = {0, 1, 71, 71, 76, 206};
  const int64_t T = cu.back();
  auto q = random_vec(T * nh * hd, 14, 1.5f), k = random_vec(T * nkv * hd, 15, 1.5f), v = random_vec(T * nkv * hd, 16);
  std::vector<float> out(T * nh * hd);
  const float scale = 1.0f / std::sqrt(float(hd));
  ops::attention_varlen_causal_forward(kCpu, cpu_view(out.data(), {T, nh, hd}), cpu_view(q.data(), {T, nh, hd}),
                                       cpu_view(k.data(), {T, nkv, hd}), cpu_view(v.data(), {T, nkv, hd}),
                                       cpu_view(cu.data(), {int64_t(cu.size())}), scale);
  auto want = test::ref::attention(to_double(q), to_double(k), to_double(v), cu, nh, nkv, hd, scale);
  EXPECT_LT(rel_err(out, want), 1e-6);
}

// GQA ratios 1, 2, 3; head_dim not a multiple of 8.
INSTANTIATE_TEST_SUITE_P(Ops, OpsAttentionForward,
                         ::testing::Values(AttnCase{2, 2, 16}, AttnCase{4, 2, 24}, AttnCase{6, 2, 12},
                                           AttnCase{3, 1, 13}));

TEST(OpsForward, ShapeMismatchIsInternalError) {
  std::vector<float> a(12), b(12), c(12);
  EXPECT_EXIT(ops::matmul_forward(kCpu, cpu_view(c.data(), {3, 4}), cpu_view(a.data(), {3, 4}),
                                  cpu_view(b.data(), {3, 4})),
              testing::ExitedWithCode(9), "matmul_forward: argument 'out' has shape");
}

#ifndef DFLASH_HAVE_CUDA
// Without a CUDA build, a CUDA context is refused with a clear options error (not a crash).
TEST(OpsForward, CudaContextWithoutCudaBuildFailsClearly) {
  Ctx cuda;
  cuda.device = Device::CUDA;
  std::vector<float> g(4), u(4), o(4);
  Tensor gt(g.data(), DType::F32, Device::CUDA, {2, 2}), ut(u.data(), DType::F32, Device::CUDA, {2, 2}),
      ot(o.data(), DType::F32, Device::CUDA, {2, 2});
  EXPECT_EXIT(ops::swiglu_forward(cuda, ot, gt, ut), testing::ExitedWithCode(2), "swiglu_forward: this build has no CUDA backend");
}
#endif

}  // namespace
}  // namespace dflash
