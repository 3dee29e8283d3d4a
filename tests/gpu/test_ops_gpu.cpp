// Every CUDA op against its float32 CPU twin on random data (relative error <= 1e-2: tol::kOp).
// Inputs are rounded to bf16 first so both backends see the same numbers; the rest is bf16 storage.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <ostream>

#include <numeric>

#include "dflash/error.h"
#include "dflash/ops.h"
#include "gpu_test_util.h"
#include "matmul_plans.cuh"

namespace dflash {
namespace {

using test::gpu;
using test::random_bf16;
using test::rel_err;
using test::to_device;
using test::to_host;
const Ctx kCpu = cpu_ctx();

TEST(GpuOps, MatmulForwardAndAccumulate) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t N = 257, I = 192, O = 328;
  auto in = random_bf16(N * I, 1), W = random_bf16(O * I, 2), prior = random_bf16(N * O, 3);
  for (auto acc : {ops::Accumulate::No, ops::Accumulate::Yes}) {
    std::vector<float> want = prior;
    ops::matmul_forward(kCpu, cpu_view(want.data(), {N, O}), cpu_view(in.data(), {N, I}),
                        cpu_view(W.data(), {O, I}), acc);
    Buffer d_in = to_device(g, in, {N, I}), d_W = to_device(g, W, {O, I});
    Buffer d_out = to_device(g, acc == ops::Accumulate::Yes ? prior : std::vector<float>{}, {N, O});
    ops::matmul_forward(g, d_out, d_in, d_W, acc);
    EXPECT_LT(rel_err(to_host(g, d_out), want), test::tol::kOp) << "accumulate=" << int(acc);
  }
}

// The residual in cuBLASLt's C operand (C != D) and in place (C == D).
TEST(GpuOps, MatmulResidualMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t N = 257, I = 192, O = 328;
  auto in = random_bf16(N * I, 21), W = random_bf16(O * I, 22), residual = random_bf16(N * O, 23, 4.f);
  std::vector<float> want(N * O);
  ops::matmul_residual_forward(kCpu, cpu_view(want.data(), {N, O}), cpu_view(in.data(), {N, I}),
                               cpu_view(W.data(), {O, I}), cpu_view(residual.data(), {N, O}));
  Buffer d_in = to_device(g, in, {N, I}), d_W = to_device(g, W, {O, I}), d_res = to_device(g, residual, {N, O});
  Buffer d_out = to_device(g, {}, {N, O});
  ops::matmul_residual_forward(g, d_out, d_in, d_W, d_res);
  EXPECT_LT(rel_err(to_host(g, d_out), want), test::tol::kOp);
  EXPECT_EQ(to_host(g, d_res), residual);  // C is only read
  ops::matmul_residual_forward(g, d_res, d_in, d_W, d_res);
  EXPECT_LT(rel_err(to_host(g, d_res), want), test::tol::kOp);
}

// A job's token count changes with every batch (kernels/matmul.cu, tuning_class): the shapes of one class
// share one plan (its algorithm tuned once, at the first; m*n*k above the autotune floor here) and every
// one of them is still computed right; a shape of another class gets its own plan.
TEST(GpuOps, MatmulTokenCountsOfOneClassShareAPlan) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t I = 256, O = 640;
  auto W = random_bf16(O * I, 31);
  Buffer d_W = to_device(g, W, {O, I});
  auto check = [&](int64_t N, uint64_t seed) {
    auto in = random_bf16(N * I, seed);
    std::vector<float> want(static_cast<size_t>(N * O));
    ops::matmul_forward(kCpu, cpu_view(want.data(), {N, O}), cpu_view(in.data(), {N, I}), cpu_view(W.data(), {O, I}),
                        ops::Accumulate::No);
    Buffer d_in = to_device(g, in, {N, I}), d_out = to_device(g, {}, {N, O});
    ops::matmul_forward(g, d_out, d_in, d_W, ops::Accumulate::No);
    EXPECT_LT(rel_err(to_host(g, d_out), want), test::tol::kOp) << "N=" << N;
  };
  check(7200, 32);  // the class (7168, 8192]: its plan is made (and tuned) here
  const int plans = cuda::matmul_plan_count(g);
  for (int64_t N : {7777, 8192, 7169, 7200}) check(N, 33 + static_cast<uint64_t>(N));
  EXPECT_EQ(cuda::matmul_plan_count(g), plans) << "shapes of one tuning class made new plans";
  check(7168, 34);  // the class below
  EXPECT_EQ(cuda::matmul_plan_count(g), plans + 1);
}

TEST(GpuOps, MatmulBackward) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t N = 131, I = 96, O = 200;
  auto in = random_bf16(N * I, 4), W = random_bf16(O * I, 5), dout = random_bf16(N * O, 6),
       prior = random_bf16(O * I, 7);
  std::vector<float> din(N * I), dW = prior;
  ops::matmul_backward(kCpu, cpu_view(din.data(), {N, I}), cpu_view(dW.data(), {O, I}),
                       cpu_view(dout.data(), {N, O}), cpu_view(in.data(), {N, I}), cpu_view(W.data(), {O, I}));
  Buffer d_in = to_device(g, in, {N, I}), d_W = to_device(g, W, {O, I}), d_dout = to_device(g, dout, {N, O});
  Buffer d_din = to_device(g, {}, {N, I});
  Buffer d_dW(Device::CUDA, DType::F32, {O, I});  // fp32 gradient accumulation, as a trainer keeps it
  copy_tensor(g, d_dW, cpu_view(prior.data(), {O, I}));
  ops::matmul_backward(g, d_din, d_dW, d_dout, d_in, d_W);
  EXPECT_LT(rel_err(to_host(g, d_din), din), test::tol::kOp);
  EXPECT_LT(rel_err(to_host(g, d_dW), dW), test::tol::kOp);
}

TEST(GpuOps, Embedding) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t V = 1000, H = 136, T = 301;
  auto table = random_bf16(V * H, 8);
  std::vector<int32_t> tokens(T);
  std::mt19937 rng(9);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
  std::vector<float> want(T * H);
  ops::embedding_forward(kCpu, cpu_view(want.data(), {T, H}), cpu_view(tokens.data(), {T}),
                         cpu_view(table.data(), {V, H}));
  Buffer d_table = to_device(g, table, {V, H}), d_out = to_device(g, {}, {T, H});
  Buffer d_tok = test::to_device_i32(g, tokens);
  ops::embedding_forward(g, d_out, d_tok, d_table);
  EXPECT_EQ(rel_err(to_host(g, d_out), want), 0.0);  // a gather is exact
}

// Runs an embedding over a batch holding an id equal to the vocabulary size, then synchronizes.
void embed_bad_token() {
  Ctx g = gpu();
  Buffer d_table = to_device(g, random_bf16(64 * 8, 1), {64, 8}), d_out = to_device(g, {}, {3, 8});
  Buffer d_tok = test::to_device_i32(g, {1, 64, 2});
  ops::embedding_forward(g, d_out, d_tok, d_table);
  synchronize(g);
}

TEST(GpuOps, EmbeddingBadTokenIsBadInput) {
  SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a forked child cannot use the parent's CUDA context
  EXPECT_EXIT(embed_bad_token(), testing::ExitedWithCode(static_cast<int>(ExitCode::BadInput)), "token id outside");
}

class GpuRmsNorm : public testing::TestWithParam<int64_t> {};
TEST_P(GpuRmsNorm, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t N = 97, C = GetParam();
  const float eps = 1e-6f;
  auto in = random_bf16(N * C, 10, 3.f), w = random_bf16(C, 12);
  std::vector<float> out(N * C), rstd(N);
  ops::rmsnorm_forward(kCpu, cpu_view(out.data(), {N, C}), cpu_view(rstd.data(), {N}), cpu_view(in.data(), {N, C}),
                       cpu_view(w.data(), {C}), eps);
  Buffer d_in = to_device(g, in, {N, C}), d_w = to_device(g, w, {C}), d_out = to_device(g, {}, {N, C});
  Buffer d_rstd(Device::CUDA, DType::F32, {N});
  ops::rmsnorm_forward(g, d_out, d_rstd, d_in, d_w, eps);
  EXPECT_LT(rel_err(to_host(g, d_out), out), test::tol::kOp);
  EXPECT_LT(rel_err(to_host(g, d_rstd), rstd), test::tol::kF32Output);
  Buffer d_out2 = to_device(g, {}, {N, C});
  ops::rmsnorm_forward(g, d_out2, Tensor(), d_in, d_w, eps);  // rstd empty: inference
  EXPECT_LT(rel_err(to_host(g, d_out2), out), test::tol::kOp);
}
// 64: 8 lanes per row, 4 rows per warp; 2560: 80 chunks, ragged over a warp's 32 lanes; 4096, 5120, 8192:
// whole warps of 16, 20, 32 chunks per lane; 16384: one block per row.
INSTANTIATE_TEST_SUITE_P(Widths, GpuRmsNorm, testing::Values<int64_t>(64, 2560, 4096, 5120, 8192, 16384));

struct RopeCase {
  int64_t nh, hd;
  int rotary_dim;
};
void PrintTo(const RopeCase& c, std::ostream* os) { *os << "h" << c.nh << "_hd" << c.hd << "_rot" << c.rotary_dim; }
class GpuHeadNormRope : public testing::TestWithParam<RopeCase> {};
TEST_P(GpuHeadNormRope, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const RopeCase c = GetParam();
  const int64_t N = 77;
  ops::RopeSpec rope{1e6f, c.rotary_dim};
  auto in = random_bf16(N * c.nh * c.hd, 13, 2.f), w = random_bf16(c.hd, 14);
  std::vector<int32_t> pos(N);
  for (int64_t i = 0; i < N; ++i) pos[i] = static_cast<int32_t>((i * 53) % 4096);  // large angles too
  std::vector<float> out(in.size()), rstd(N * c.nh);
  ops::head_norm_rope_forward(kCpu, cpu_view(out.data(), {N, c.nh, c.hd}), cpu_view(rstd.data(), {N, c.nh}),
                              cpu_view(in.data(), {N, c.nh, c.hd}), cpu_view(w.data(), {c.hd}),
                              cpu_view(pos.data(), {N}), rope, 1e-6f);
  Buffer d_in = to_device(g, in, {N, c.nh, c.hd}), d_w = to_device(g, w, {c.hd});
  Buffer d_out = to_device(g, {}, {N, c.nh, c.hd}), d_pos = test::to_device_i32(g, pos);
  Buffer d_rstd(Device::CUDA, DType::F32, {N, c.nh});
  ops::head_norm_rope_forward(g, d_out, d_rstd, d_in, d_w, d_pos, rope, 1e-6f);
  EXPECT_LT(rel_err(to_host(g, d_out), out), test::tol::kOp);
  EXPECT_LT(rel_err(to_host(g, d_rstd), rstd), test::tol::kF32Output);
  ops::head_norm_rope_forward(g, d_in, Tensor(), d_in, d_w, d_pos, rope, 1e-6f);  // in place, as the target runs it
  EXPECT_LT(rel_err(to_host(g, d_in), out), test::tol::kOp);
}
INSTANTIATE_TEST_SUITE_P(Shapes, GpuHeadNormRope,
                         testing::Values(RopeCase{32, 128, 0}, RopeCase{4, 24, 0}, RopeCase{3, 128, 64},
                                         RopeCase{6, 64, 32},     // 8 lanes per head, 4 heads per warp slot
                                         RopeCase{5, 96, 48}));   // 12 chunks over 16 lanes

TEST(GpuOps, SwiGLU) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t N = 37, I = 1000;
  auto gate = random_bf16(N * I, 15, 3.f), up = random_bf16(N * I, 16);
  std::vector<float> out(N * I);
  ops::swiglu_forward(kCpu, cpu_view(out.data(), {N, I}), cpu_view(gate.data(), {N, I}), cpu_view(up.data(), {N, I}));
  Buffer d_g = to_device(g, gate, {N, I}), d_u = to_device(g, up, {N, I}), d_out = to_device(g, {}, {N, I});
  ops::swiglu_forward(g, d_out, d_g, d_u);
  EXPECT_LT(rel_err(to_host(g, d_out), out), test::tol::kOp);
}

struct AttnCase {
  std::vector<int32_t> seqlens;
  int64_t nh, nkv, hd;
};
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << "seqs" << c.seqlens.size() << "_T";
  int64_t T = 0;
  for (int32_t l : c.seqlens) T += l;
  *os << T << "_h" << c.nh << "kv" << c.nkv << "_hd" << c.hd;
}
class GpuAttention : public testing::TestWithParam<AttnCase> {};
TEST_P(GpuAttention, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const AttnCase c = GetParam();
  std::vector<int32_t> cu(1, 0);
  for (int32_t len : c.seqlens) cu.push_back(cu.back() + len);
  const int64_t T = cu.back();
  auto q = random_bf16(T * c.nh * c.hd, 17, 2.f), k = random_bf16(T * c.nkv * c.hd, 18, 2.f),
       v = random_bf16(T * c.nkv * c.hd, 19);
  const float scale = 1.f / std::sqrt(static_cast<float>(c.hd));
  std::vector<float> out(q.size());
  ops::attention_varlen_causal_forward(kCpu, cpu_view(out.data(), {T, c.nh, c.hd}), cpu_view(q.data(), {T, c.nh, c.hd}),
                                       cpu_view(k.data(), {T, c.nkv, c.hd}), cpu_view(v.data(), {T, c.nkv, c.hd}),
                                       cpu_view(cu.data(), {static_cast<int64_t>(cu.size())}), scale);
  Buffer d_q = to_device(g, q, {T, c.nh, c.hd}), d_k = to_device(g, k, {T, c.nkv, c.hd}),
         d_v = to_device(g, v, {T, c.nkv, c.hd}), d_out = to_device(g, {}, {T, c.nh, c.hd});
  Buffer d_cu = test::to_device_i32(g, cu);
  ops::attention_varlen_causal_forward(g, d_out, d_q, d_k, d_v, d_cu, scale);
  EXPECT_LT(rel_err(to_host(g, d_out), out), test::tol::kOp);
}
INSTANTIATE_TEST_SUITE_P(
    Packings, GpuAttention,
    testing::Values(AttnCase{{1, 37, 128, 129, 300, 64, 5}, 8, 2, 128},  // tile edges, a 1-token sequence
                    AttnCase{{37, 29, 53}, 4, 2, 24},                    // the golden tiny model's shape
                    AttnCase{{700}, 4, 4, 64},                           // MHA, one long sequence
                    AttnCase{std::vector<int32_t>(70, 9), 2, 1, 128}));  // more sequences than a warp scans at once

}  // namespace
}  // namespace dflash
