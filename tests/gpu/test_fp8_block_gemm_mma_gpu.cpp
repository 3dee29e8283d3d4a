// The hand-written block-scaled FP8 GEMM (kernels/fp8_block_gemm_mma.cu) against the CPU twin of
// ops::fp8_gemm_forward (src/ops/fp8_linear.cpp: the dequantized products summed in fp32) on random e4m3 codes
// (NaN codes avoided) and random positive scales per (128-block, row) on both operands.
//   Tolerance tol::kFp8BlockGemmMma (tests/gpu/tolerances.h): one rounding of the fp32 sums to bf16; a wrong
//   fragment layout, swizzle or scale index gives O(1).
//   Shapes: the tile edges (N, O not multiples of 128, O odd: the one-by-one stores), one k-block and many,
//   and the 8B target's gate|up and down at 512 tokens. Then Accumulate::Yes (out += the product over random
//   bf16 contents) and a residual (out = residual + the product, residual apart from out and out itself).
//   DFLASH_FP8_BLOCK_GEMM=mma routes ops::fp8_linear_forward through it (in a child process: the variable is
//   read once per process), and another value is refused.
// Every GPU of compute capability 8.9 or later runs it (an H100 tests what an RTX PRO 6000 would run);
// DFLASH_DEVICE_LIMITS=sm_120 (gpu.sm120_limits) runs it under that GPU's 99 KB per block.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <tuple>
#include <vector>

#include "dflash/ops.h"
#include "fp8_block_gemm_mma.cuh"
#include "fp8_test_util.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::compute_capability;
using test::gpu;
using test::RandomFp8Linear;
using test::random_bf16;
using test::rel_err;
using test::to_device;
using test::to_host;
const Ctx kCpu = cpu_ctx();

// The CPU twin: out [N, O] = the block-scaled product (fp32).
std::vector<float> twin(RandomFp8Linear& a, RandomFp8Linear& w) {
  std::vector<float> out(static_cast<size_t>(a.O * w.O));
  ops::fp8_gemm_forward(kCpu, cpu_view(out.data(), {a.O, w.O}), a.host_codes(), a.host_scales(),
                        w.host_codes(), w.host_scales());
  return out;
}

TEST(GpuFp8BlockGemmMma, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  if (compute_capability() < 89) GTEST_SKIP() << "FP8 mma.sync needs compute capability 8.9 or later";
  Ctx g = gpu();
  constexpr double kTol = test::tol::kFp8BlockGemmMma;
  for (const auto& [N, K, O] : {std::tuple<int64_t, int64_t, int64_t>{1, 128, 8}, {37, 384, 200}, {130, 256, 129},
                                {256, 1024, 384}, {512, 4096, 12288}, {512, 12288, 4096}}) {
    SCOPED_TRACE(testing::Message() << N << "x" << K << " -> " << O);
    RandomFp8Linear a(K, N, 51, 1e-3f, 3e-2f), w(K, O, 52);  // activations [N, K], weights [O, K]
    std::vector<float> want = twin(a, w);
    Buffer out = to_device(g, std::vector<float>(want.size(), 0.f), {N, O});
    cuda::fp8_block_gemm_mma(g, out, a.d_codes, a.d_scales, w.d_codes, w.d_scales, ops::Accumulate::No, Tensor());
    const std::vector<float> got = to_host(g, out);
    const double err = rel_err(got, want);
    std::printf("  fp8_block_gemm_mma %lldx%lld -> %lld vs the CPU twin: rel err %.3g\n", static_cast<long long>(N),
                static_cast<long long>(K), static_cast<long long>(O), err);
    EXPECT_LE(err, kTol);

    // Accumulate::Yes over random contents: out = init + the product.
    double ms = 0;
    for (float v : want) ms += double(v) * v;
    std::vector<float> init = random_bf16(want.size(), 53, 0.5f * static_cast<float>(std::sqrt(ms / want.size())));
    Buffer acc = to_device(g, init, {N, O});
    cuda::fp8_block_gemm_mma(g, acc, a.d_codes, a.d_scales, w.d_codes, w.d_scales, ops::Accumulate::Yes, Tensor());
    std::vector<float> want_acc(want.size());
    for (size_t i = 0; i < want.size(); ++i) want_acc[i] = init[i] + want[i];
    EXPECT_LE(rel_err(to_host(g, acc), want_acc), kTol) << "Accumulate::Yes";

    // A residual apart from out, then out itself as the residual.
    Buffer res = to_device(g, init, {N, O}), out2 = to_device(g, std::vector<float>(want.size(), 7.f), {N, O});
    cuda::fp8_block_gemm_mma(g, out2, a.d_codes, a.d_scales, w.d_codes, w.d_scales, ops::Accumulate::No, res);
    EXPECT_LE(rel_err(to_host(g, out2), want_acc), kTol) << "residual";
    cuda::fp8_block_gemm_mma(g, out2, a.d_codes, a.d_scales, w.d_codes, w.d_scales, ops::Accumulate::No, out2);
    for (size_t i = 0; i < want.size(); ++i) want_acc[i] += want[i];
    EXPECT_LE(rel_err(to_host(g, out2), want_acc), kTol) << "out as its own residual";
  }
}

// The op's shape checks: K not a multiple of 128 is refused (the format's blocks), not computed wrongly.
TEST(GpuFp8BlockGemmMmaDeathTest, RefusesKOffTheBlocks) {
  SKIP_WITHOUT_GPU();
  if (compute_capability() < 89) GTEST_SKIP() << "FP8 mma.sync needs compute capability 8.9 or later";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto off_the_blocks = [] {
    Ctx g = gpu();
    Buffer a(Device::CUDA, DType::F8E4M3, {16, 200}), as(Device::CUDA, DType::F32, {1, 16});
    Buffer w(Device::CUDA, DType::F8E4M3, {16, 200}), ws(Device::CUDA, DType::F32, {1, 16});
    Buffer out(Device::CUDA, DType::BF16, {16, 16});
    cuda::fp8_block_gemm_mma(g, out, a, as, w, ws, ops::Accumulate::No, Tensor());
  };
  EXPECT_DEATH(off_the_blocks(), "K % 128 == 0");
}

// DFLASH_FP8_BLOCK_GEMM (read once per process, so each case runs in a child of its own): mma makes the
// device report the block-scaled GEMM and routes ops::fp8_linear_forward (the activation quantization + the
// GEMM, as a target's Fp8Gemm linears run) through this kernel, still the CPU twin's product; another value
// is refused.
TEST(GpuFp8BlockGemmMmaDeathTest, TheVariableRoutesTheOpOrIsRefused) {
  SKIP_WITHOUT_GPU();
  if (compute_capability() < 89) GTEST_SKIP() << "FP8 mma.sync needs compute capability 8.9 or later";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto through_the_op = [] {
    setenv("DFLASH_FP8_BLOCK_GEMM", "mma", 1);
    Ctx g = gpu();
    if (!ops::fp8_block_gemm_available(g)) std::exit(2);
    const int64_t N = 48, K = 256, O = 136, KB = K / 128;
    std::vector<float> x = random_bf16(static_cast<size_t>(N * K), 61, 2.f);
    RandomFp8Linear w(K, O, 62);
    std::vector<float> want(static_cast<size_t>(N * O)), want_as(static_cast<size_t>(KB * N));
    std::vector<uint8_t> want_ac(static_cast<size_t>(N * K));
    ops::fp8_linear_forward(kCpu, cpu_view(want.data(), {N, O}), cpu_view(x.data(), {N, K}), w.host_codes(),
                            w.host_scales(), Tensor(want_ac.data(), DType::F8E4M3, Device::CPU, {N, K}),
                            cpu_view(want_as.data(), {KB, N}));
    Buffer in = to_device(g, x, {N, K}), out = to_device(g, {}, {N, O});
    Buffer ac(Device::CUDA, DType::F8E4M3, {N, K}), as(Device::CUDA, DType::F32, {KB, N});
    ops::fp8_linear_forward(g, out, in, w.d_codes, w.d_scales, ac, as);
    std::exit(rel_err(to_host(g, out), want) <= test::tol::kFp8BlockGemmMma ? 0 : 3);
  };
  EXPECT_EXIT(through_the_op(), testing::ExitedWithCode(0), "");
  auto unknown_value = [] {
    setenv("DFLASH_FP8_BLOCK_GEMM", "fast", 1);
    Ctx g = gpu();
    ops::fp8_block_gemm_available(g);
  };
  EXPECT_DEATH(unknown_value(), "DFLASH_FP8_BLOCK_GEMM=fast is not cublaslt or mma");
}

}  // namespace
}  // namespace dflash
