// The FP8 linear on CUDA against its CPU twin (docs/fp8.md) on random data:
//   fp8_activation_qdq: BF16 inputs, groups of 128 and whole rows; the CPU twin sees the same bf16 values,
//     so after the one BF16 rounding of the output every element agrees to 2^-8 relative (tol below).
//   fp8_linear_forward: the activation codes and scales bit for bit (IEEE division on both sides, the
//     hardware's saturating RNE conversion = the host's), and the GEMM to a relative L2 error <= 1e-2 (the
//     CPU twin sums dequantized products in fp32; cuBLASLt scales per 128-block partial sums and rounds the
//     output to BF16). sm_90 only (cuBLASLt's VEC128_32F scales); skipped on other GPUs, which refuse it.
//   Shapes: 16 x 256 -> 128 and the 8B model's 512 x 4096 -> 12288 (gate|up) and 512 x 12288 -> 4096 (down).
//   Fp8Scaling::TokenChannel (compressed-tensors FP8-Dynamic): one activation scale per token, one weight
//     scale per output channel, cuBLASLt's OUTER_VEC_32F modes; the same checks (codes and scales bit for
//     bit, the GEMM within 1e-2, which it meets with room: one scale pair per output element), where the
//     device has that GEMM (ops::fp8_token_gemm_available), else skipped with the reason.
//   Plans: token counts of one tuning class share one FP8 GEMM plan (kernels/fp8_linear.cu, Fp8Plan; tuned at
//     the class's first count, reused by the others when cuBLASLt accepts its algorithm), and every output
//     still matches the CPU twin.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "dflash/fp8.h"
#include "dflash/ops.h"
#include "fp8_test_util.h"
#include "gpu_test_util.h"
#include "matmul_plans.cuh"

namespace dflash {
namespace {

using test::gpu;
using test::RandomFp8Linear;
using test::random_bf16;
using test::rel_err;
using test::to_device;
using test::to_host;
const Ctx kCpu = cpu_ctx();

bool is_sm90() { return test::compute_capability() == 90; }

TEST(GpuFp8, ActivationQdqMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  for (const auto& [N, K, group] : {std::tuple<int64_t, int64_t, int64_t>{7, 300, 128}, {33, 4096, 128}, {5, 1000, 1000}}) {
    SCOPED_TRACE(testing::Message() << N << "x" << K << " group " << group);
    auto x = random_bf16(static_cast<size_t>(N * K), 11, 3.f);
    for (int64_t c = 0; c < std::min<int64_t>(K, 128); ++c) x[c] = 0.f;  // an all-zero group: zeros, no NaN
    std::vector<float> want(x.size());
    ops::fp8_activation_qdq(kCpu, cpu_view(want.data(), {N, K}), cpu_view(x.data(), {N, K}), group);
    Buffer in = to_device(g, x, {N, K}), out = to_device(g, {}, {N, K});
    ops::fp8_activation_qdq(g, out, in, group);
    const std::vector<float> got = to_host(g, out);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::fabs(got[i] - want[i]), std::ldexp(std::fabs(want[i]), -8)) << i;  // one bf16 rounding
  }
}

Tensor f8_view(void* p, std::initializer_list<int64_t> d) { return Tensor(p, DType::F8E4M3, Device::CPU, d); }

// out [N, O] of the CPU twin for input x [N, K], and its activation codes and scales.
struct CpuTwin {
  std::vector<float> out, act_scales;
  std::vector<uint8_t> act_codes;
};
CpuTwin cpu_twin(std::vector<float>& x, RandomFp8Linear& w, int64_t N) {
  CpuTwin t{std::vector<float>(static_cast<size_t>(N * w.O)), std::vector<float>(static_cast<size_t>(w.KB * N)),
            std::vector<uint8_t>(static_cast<size_t>(N * w.K))};
  ops::fp8_linear_forward(kCpu, cpu_view(t.out.data(), {N, w.O}), cpu_view(x.data(), {N, w.K}),
                          f8_view(w.codes.data(), {w.O, w.K}), cpu_view(w.scales.data(), {w.KB, w.O}),
                          f8_view(t.act_codes.data(), {N, w.K}), cpu_view(t.act_scales.data(), {w.KB, N}));
  return t;
}

TEST(GpuFp8, LinearMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  if (!is_sm90()) GTEST_SKIP() << "cuBLASLt's 1x128 block-scaled FP8 GEMM runs on sm_90 only";
  Ctx g = gpu();
  for (const auto& [N, K, O] : {std::tuple<int64_t, int64_t, int64_t>{16, 256, 128}, {512, 4096, 12288}, {512, 12288, 4096}}) {
    SCOPED_TRACE(testing::Message() << N << "x" << K << " -> " << O);
    const int64_t KB = K / 128;
    auto x = random_bf16(static_cast<size_t>(N * K), 21, 2.f);
    RandomFp8Linear w(K, O, 22);
    CpuTwin want = cpu_twin(x, w, N);
    // CUDA.
    Buffer in = to_device(g, x, {N, K}), out = to_device(g, {}, {N, O});
    Buffer d_ac(Device::CUDA, DType::F8E4M3, {N, K}), d_as(Device::CUDA, DType::F32, {KB, N});
    ops::fp8_linear_forward(g, out, in, w.d_codes, w.d_scales, d_ac, d_as);
    std::vector<uint8_t> ac(want.act_codes.size());
    std::vector<float> as(want.act_scales.size());
    cudaDeviceSynchronize();
    cudaMemcpy(ac.data(), d_ac.t().data, ac.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(as.data(), d_as.t().data, as.size() * 4, cudaMemcpyDeviceToHost);
    EXPECT_EQ(as, want.act_scales);
    EXPECT_EQ(ac, want.act_codes);
    EXPECT_LE(rel_err(to_host(g, out), want.out), 1e-2);
    // Accumulate: out += the same product.
    ops::fp8_linear_forward(g, out, in, w.d_codes, w.d_scales, d_ac, d_as, ops::Accumulate::Yes);
    for (auto& v : want.out) v *= 2.f;
    EXPECT_LE(rel_err(to_host(g, out), want.out), 1e-2);
  }
}

TEST(GpuFp8, TokenChannelLinearMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  if (!ops::fp8_token_gemm_available(g))
    GTEST_SKIP() << "this GPU's cuBLASLt has no FP8 GEMM with OUTER_VEC_32F (per-row) scales";
  for (const auto& [N, K, O] : {std::tuple<int64_t, int64_t, int64_t>{16, 256, 128}, {512, 4096, 12288},
                                {512, 12288, 4096}, {48, 1040, 144}}) {
    SCOPED_TRACE(testing::Message() << N << "x" << K << " -> " << O);
    auto x = random_bf16(static_cast<size_t>(N * K), 31, 2.f);
    // One scale per output channel: the first row of a random linear's scales.
    RandomFp8Linear w((K + 127) / 128 * 128, O, 32);  // codes of K rounded up to whole groups; the first K used
    std::vector<uint8_t> codes(static_cast<size_t>(O * K));
    for (int64_t o = 0; o < O; ++o)
      for (int64_t k = 0; k < K; ++k) codes[o * K + k] = w.codes[o * w.K + k];
    std::vector<float> ch(w.scales.begin(), w.scales.begin() + O);
    std::vector<float> want(static_cast<size_t>(N * O)), want_as(static_cast<size_t>(N));
    std::vector<uint8_t> want_ac(static_cast<size_t>(N * K));
    ops::fp8_linear_forward(kCpu, cpu_view(want.data(), {N, O}), cpu_view(x.data(), {N, K}),
                            f8_view(codes.data(), {O, K}), cpu_view(ch.data(), {1, O}),
                            f8_view(want_ac.data(), {N, K}), cpu_view(want_as.data(), {1, N}), ops::Accumulate::No,
                            Tensor(), ops::Fp8Scaling::TokenChannel);
    Buffer d_codes(Device::CUDA, DType::F8E4M3, {O, K}), d_ch(Device::CUDA, DType::F32, {1, O});
    cudaMemcpy(d_codes.t().data, codes.data(), codes.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(d_ch.t().data, ch.data(), ch.size() * 4, cudaMemcpyHostToDevice);
    Buffer in = to_device(g, x, {N, K}), out = to_device(g, {}, {N, O});
    Buffer d_ac(Device::CUDA, DType::F8E4M3, {N, K}), d_as(Device::CUDA, DType::F32, {1, N});
    ops::fp8_linear_forward(g, out, in, d_codes, d_ch, d_ac, d_as, ops::Accumulate::No, Tensor(),
                            ops::Fp8Scaling::TokenChannel);
    std::vector<uint8_t> ac(want_ac.size());
    std::vector<float> as(want_as.size());
    cudaDeviceSynchronize();
    cudaMemcpy(ac.data(), d_ac.t().data, ac.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(as.data(), d_as.t().data, as.size() * 4, cudaMemcpyDeviceToHost);
    EXPECT_EQ(as, want_as);
    EXPECT_EQ(ac, want_ac);
    const double err = rel_err(to_host(g, out), want);
    // printed: the A/B of DFLASH_FP8_ACCUMULATION=exact|fast (kernels/fp8_linear.cu) reads it
    std::printf("  per-token FP8 GEMM %lldx%lld -> %lld vs the CPU twin: rel err %.3g\n", static_cast<long long>(N),
                static_cast<long long>(K), static_cast<long long>(O), err);
    EXPECT_LE(err, 1e-2);
    // A residual through C (beta = 1): out = out + the product.
    ops::fp8_linear_forward(g, out, in, d_codes, d_ch, d_ac, d_as, ops::Accumulate::No, out,
                            ops::Fp8Scaling::TokenChannel);
    for (auto& v : want) v *= 2.f;
    EXPECT_LE(rel_err(to_host(g, out), want), 1e-2);
  }
}

// Like GpuOps.MatmulTokenCountsOfOneClassShareAPlan (tests/gpu/test_ops_gpu.cpp) for the FP8 GEMM: the token
// counts of one class (multiples of 16, as the op takes them) share the plan made (and, at 7200 x 256 x 640
// >= 2^30 multiply-adds, autotuned) at the first, and the next class down makes its own.
TEST(GpuFp8, TokenCountsOfOneClassShareAPlan) {
  SKIP_WITHOUT_GPU();
  if (!is_sm90()) GTEST_SKIP() << "cuBLASLt's 1x128 block-scaled FP8 GEMM runs on sm_90 only";
  Ctx g = gpu();
  const int64_t K = 256, O = 640;
  RandomFp8Linear w(K, O, 41);
  auto check = [&](int64_t N, uint32_t seed) {
    auto x = random_bf16(static_cast<size_t>(N * K), seed, 2.f);
    const CpuTwin want = cpu_twin(x, w, N);
    Buffer in = to_device(g, x, {N, K}), out = to_device(g, {}, {N, O});
    Buffer d_ac(Device::CUDA, DType::F8E4M3, {N, K}), d_as(Device::CUDA, DType::F32, {w.KB, N});
    ops::fp8_linear_forward(g, out, in, w.d_codes, w.d_scales, d_ac, d_as);
    EXPECT_LE(rel_err(to_host(g, out), want.out), 1e-2) << "N=" << N;
  };
  check(7200, 42);  // the class (7168, 8192]: its plan is made (and tuned) here
  const int plans = cuda::fp8_plan_count(g);
  for (int64_t N : {7776, 8192, 7184, 7200}) check(N, 43 + static_cast<uint32_t>(N));
  EXPECT_EQ(cuda::fp8_plan_count(g), plans) << "token counts of one tuning class made new FP8 plans";
  check(7168, 44);  // the class below
  EXPECT_EQ(cuda::fp8_plan_count(g), plans + 1);
}

}  // namespace
}  // namespace dflash
