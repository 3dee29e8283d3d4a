// The FP8 linear on CUDA against its CPU twin (docs/fp8.md) on random data:
//   fp8_activation_qdq: BF16 inputs, groups of 128 and whole rows; the CPU twin sees the same bf16 values,
//     so after the one BF16 rounding of the output every element agrees to 2^-8 relative (tol below).
//   fp8_linear_forward: the activation codes and scales bit for bit (IEEE division on both sides, the
//     hardware's saturating RNE conversion = the host's), and the GEMM to a relative L2 error <= 1e-2 (the
//     CPU twin sums dequantized products in fp32; cuBLASLt scales per 128-block partial sums and rounds the
//     output to BF16). sm_90 only (cuBLASLt's VEC128_32F scales); skipped on other GPUs, which refuse it.
//   Shapes: 16 x 256 -> 128 and the 8B model's 512 x 4096 -> 12288 (gate|up) and 512 x 12288 -> 4096 (down).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dflash/fp8.h"
#include "dflash/ops.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::gpu;
using test::random_bf16;
using test::rel_err;
using test::to_device;
using test::to_host;
const Ctx kCpu = cpu_ctx();

bool is_sm90() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}

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

TEST(GpuFp8, LinearMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  if (!is_sm90()) GTEST_SKIP() << "cuBLASLt's 1x128 block-scaled FP8 GEMM runs on sm_90 only";
  Ctx g = gpu();
  for (const auto& [N, K, O] : {std::tuple<int64_t, int64_t, int64_t>{16, 256, 128}, {512, 4096, 12288}, {512, 12288, 4096}}) {
    SCOPED_TRACE(testing::Message() << N << "x" << K << " -> " << O);
    const int64_t KB = K / 128;
    auto x = random_bf16(static_cast<size_t>(N * K), 21, 2.f);
    // Weights: random codes (NaN codes avoided) and positive scales per (kb, o).
    std::mt19937 rng(22);
    std::vector<uint8_t> wc(static_cast<size_t>(O * K));
    for (auto& c : wc) {
      c = static_cast<uint8_t>(rng() & 0xFF);
      if ((c & 0x7F) == 0x7F) c = 0x7E;
    }
    std::vector<float> ws(static_cast<size_t>(KB * O));
    std::uniform_real_distribution<float> u(1e-4f, 2e-3f);
    for (auto& s : ws) s = u(rng);
    // CPU twin.
    std::vector<float> want(static_cast<size_t>(N * O));
    std::vector<uint8_t> ac_cpu(static_cast<size_t>(N * K));
    std::vector<float> as_cpu(static_cast<size_t>(KB * N));
    auto f8 = [](void* p, std::initializer_list<int64_t> d) { return Tensor(p, DType::F8E4M3, Device::CPU, d); };
    ops::fp8_linear_forward(kCpu, cpu_view(want.data(), {N, O}), cpu_view(x.data(), {N, K}), f8(wc.data(), {O, K}),
                            cpu_view(ws.data(), {KB, O}), f8(ac_cpu.data(), {N, K}), cpu_view(as_cpu.data(), {KB, N}));
    // CUDA.
    Buffer in = to_device(g, x, {N, K}), out = to_device(g, {}, {N, O});
    Buffer d_wc(Device::CUDA, DType::F8E4M3, {O, K}), d_ac(Device::CUDA, DType::F8E4M3, {N, K});
    Buffer d_ws(Device::CUDA, DType::F32, {KB, O}), d_as(Device::CUDA, DType::F32, {KB, N});
    cudaMemcpy(d_wc.t().data, wc.data(), wc.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(d_ws.t().data, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice);
    ops::fp8_linear_forward(g, out, in, d_wc, d_ws, d_ac, d_as);
    std::vector<uint8_t> ac(ac_cpu.size());
    std::vector<float> as(as_cpu.size());
    cudaDeviceSynchronize();
    cudaMemcpy(ac.data(), d_ac.t().data, ac.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(as.data(), d_as.t().data, as.size() * 4, cudaMemcpyDeviceToHost);
    EXPECT_EQ(as, as_cpu);
    EXPECT_EQ(ac, ac_cpu);
    EXPECT_LE(rel_err(to_host(g, out), want), 1e-2);
    // Accumulate: out += the same product.
    ops::fp8_linear_forward(g, out, in, d_wc, d_ws, d_ac, d_as, ops::Accumulate::Yes);
    for (auto& v : want) v *= 2.f;
    EXPECT_LE(rel_err(to_host(g, out), want), 1e-2);
  }
}

}  // namespace
}  // namespace dflash
