// The per-token FP8 GEMM's input quantized once (docs/fp8.md "Per-token activations, quantized once") on
// CUDA, on random BF16 data:
//   RowsQuantize: the one-block-per-row quantizer (16-byte loads, the row held in registers) and its
//     one-warp-per-row fallback (H % 8 != 0) against the CPU twin: codes and scales bit for bit (the
//     arithmetic of fp8.h: IEEE division, the hardware's saturating RNE conversion = the host's).
//   RmsNormFp8 / SwigluFp8: the fused producer against the unfused CUDA ops (rmsnorm_forward or
//     swiglu_fused_forward, then fp8_rows_quantize of their bf16 output): the bf16 output, the codes and the
//     scales bit for bit, with and without the bf16 output; rows past a warp's last row (N not a multiple of
//     the rows a block takes), row widths of the warp kernel's full and partial forms and of the two-kernel
//     fallback (C > 8192). Against the float32 CPU twin (which does not round the normed row to bf16): the
//     dequantized rows within tol::kFp8Requantized (relative L2).
//   GemmOverQuantizedRows: fp8_gemm_forward over fp8_rows_quantize's codes = fp8_linear_forward of the same
//     input, bit for bit (the same codes, the same planned GEMM), TokenChannel, where the device has that GEMM.
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

template <class T>
std::vector<T> host_bytes(const Buffer& b) {
  std::vector<T> h(b.t().nbytes() / sizeof(T));
  cudaDeviceSynchronize();
  cudaMemcpy(h.data(), b.t().data, h.size() * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

// Codes [N, K] (poisoned with 0xAA) and scales [N] (NaN) on the device.
struct DeviceRows {
  Buffer codes, scales;
  DeviceRows(int64_t N, int64_t K)
      : codes(Device::CUDA, DType::F8E4M3, {N, K}), scales(Device::CUDA, DType::F32, {N}) {
    cudaMemset(codes.t().data, 0xAA, codes.t().nbytes());
    cudaMemset(scales.t().data, 0xff, scales.t().nbytes());
  }
};

// Rows of very different magnitudes, row 0 all zero (scale 0, codes 0).
std::vector<float> test_rows(int64_t N, int64_t H, uint32_t seed) {
  std::vector<float> x = random_bf16(static_cast<size_t>(N * H), seed, 2.f);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < H; ++c) x[r * H + c] = bf16_to_f32(f32_to_bf16(x[r * H + c] * std::exp2(float(r % 7) - 3.f)));
  for (int64_t c = 0; c < H; ++c) x[c] = 0.f;
  return x;
}

// e4m3_to_f32(codes) * scales[row] on the host.
std::vector<float> dequantize(const std::vector<uint8_t>& codes, const std::vector<float>& scales, int64_t H) {
  std::vector<float> v(codes.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = fp8::e4m3_to_f32(codes[i]) * scales[i / static_cast<size_t>(H)];
  return v;
}

TEST(GpuFp8Fused, RowsQuantizeMatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  for (const auto& [N, H] : {std::pair<int64_t, int64_t>{5, 8}, {33, 24}, {300, 4096}, {40, 12288}, {17, 1000}, {9, 36}}) {
    SCOPED_TRACE(testing::Message() << N << " rows x " << H);
    std::vector<float> x = test_rows(N, H, static_cast<uint32_t>(N * 7 + H));
    std::vector<uint8_t> want_codes(x.size());
    std::vector<float> want_scales(static_cast<size_t>(N));
    ops::fp8_rows_quantize(kCpu, Tensor(want_codes.data(), DType::F8E4M3, Device::CPU, {N, H}),
                           cpu_view(want_scales.data(), {N}), cpu_view(x.data(), {N, H}));
    Buffer in = to_device(g, x, {N, H});
    DeviceRows got(N, H);
    ops::fp8_rows_quantize(g, got.codes, got.scales, in);
    EXPECT_EQ(host_bytes<float>(got.scales), want_scales);
    EXPECT_EQ(host_bytes<uint8_t>(got.codes), want_codes);
  }
}

TEST(GpuFp8Fused, RmsNormFp8EqualsTheNormThenTheRowQuantizer) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const float eps = 1e-6f;
  // 4096: the warp kernel's full form; 1000: a partial group of 32 lanes; 64: 8 rows a warp; 12288: the
  // wide rows' two kernels. N = 37: the last block's rows run past the end.
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{37, 4096}, {37, 1000}, {37, 64}, {37, 5120}, {9, 12288}}) {
    SCOPED_TRACE(testing::Message() << N << " x " << C);
    const std::vector<float> x = test_rows(N, C, static_cast<uint32_t>(C + 1));
    const std::vector<float> w = random_bf16(static_cast<size_t>(C), 3, 1.f);
    Buffer in = to_device(g, x, {N, C}), wd = to_device(g, w, {C});
    // Unfused, on the device.
    Buffer normed = to_device(g, {}, {N, C});
    ops::rmsnorm_forward(g, normed, Tensor(), in, wd, eps);
    DeviceRows want(N, C);
    ops::fp8_rows_quantize(g, want.codes, want.scales, normed);
    const std::vector<uint8_t> want_codes = host_bytes<uint8_t>(want.codes);
    const std::vector<float> want_scales = host_bytes<float>(want.scales);
    // Fused, with the bf16 output ...
    Buffer out = to_device(g, {}, {N, C});
    DeviceRows got(N, C);
    ops::rmsnorm_fp8_forward(g, out, got.codes, got.scales, in, wd, eps);
    EXPECT_EQ(host_bytes<uint16_t>(out), host_bytes<uint16_t>(normed));
    EXPECT_EQ(host_bytes<uint8_t>(got.codes), want_codes);
    EXPECT_EQ(host_bytes<float>(got.scales), want_scales);
    // ... and without it (the warp kernel's widths only: wider rows need out).
    if (C <= ops::kRmsNormFp8CodesOnlyWidth) {
      DeviceRows bare(N, C);
      ops::rmsnorm_fp8_forward(g, Tensor(), bare.codes, bare.scales, in, wd, eps);
      EXPECT_EQ(host_bytes<uint8_t>(bare.codes), want_codes);
      EXPECT_EQ(host_bytes<float>(bare.scales), want_scales);
    }
    // Against the CPU twin (its normed row is not rounded to bf16, so a code may sit one step away).
    std::vector<uint8_t> cpu_codes(x.size());
    std::vector<float> cpu_scales(static_cast<size_t>(N)), wf = w, xf = x, cpu_out(x.size());
    // (the op's contract on both backends: rows wider than kRmsNormFp8CodesOnlyWidth need out)
    const Tensor cpu_normed = C <= ops::kRmsNormFp8CodesOnlyWidth ? Tensor() : cpu_view(cpu_out.data(), {N, C});
    ops::rmsnorm_fp8_forward(kCpu, cpu_normed, Tensor(cpu_codes.data(), DType::F8E4M3, Device::CPU, {N, C}),
                             cpu_view(cpu_scales.data(), {N}), cpu_view(xf.data(), {N, C}), cpu_view(wf.data(), {C}),
                             eps);
    EXPECT_LE(rel_err(dequantize(want_codes, want_scales, C), dequantize(cpu_codes, cpu_scales, C)),
              test::tol::kFp8Requantized);
  }
}

TEST(GpuFp8Fused, SwigluFp8EqualsTheActivationThenTheRowQuantizer) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  // 12288: the 8B model's intermediate size (384 threads a row); 200: one partial warp; 40000: the two
  // kernels (I > 32768).
  for (const auto& [N, I] : {std::pair<int64_t, int64_t>{33, 12288}, {7, 200}, {3, 40000}}) {
    SCOPED_TRACE(testing::Message() << N << " x " << I);
    const std::vector<float> gu = test_rows(N, 2 * I, static_cast<uint32_t>(I + 5));
    Buffer in = to_device(g, gu, {N, 2 * I});
    Buffer act = to_device(g, {}, {N, I});
    ops::swiglu_fused_forward(g, act, in);
    DeviceRows want(N, I);
    ops::fp8_rows_quantize(g, want.codes, want.scales, act);
    const std::vector<uint8_t> want_codes = host_bytes<uint8_t>(want.codes);
    const std::vector<float> want_scales = host_bytes<float>(want.scales);
    Buffer out = to_device(g, {}, {N, I});
    DeviceRows got(N, I);
    ops::swiglu_fp8_forward(g, out, got.codes, got.scales, in);
    EXPECT_EQ(host_bytes<uint16_t>(out), host_bytes<uint16_t>(act));
    EXPECT_EQ(host_bytes<uint8_t>(got.codes), want_codes);
    EXPECT_EQ(host_bytes<float>(got.scales), want_scales);
    if (I <= 32768) {
      DeviceRows bare(N, I);
      ops::swiglu_fp8_forward(g, Tensor(), bare.codes, bare.scales, in);
      EXPECT_EQ(host_bytes<uint8_t>(bare.codes), want_codes);
      EXPECT_EQ(host_bytes<float>(bare.scales), want_scales);
    }
    std::vector<uint8_t> cpu_codes(static_cast<size_t>(N * I));
    std::vector<float> cpu_scales(static_cast<size_t>(N)), guf = gu;
    ops::swiglu_fp8_forward(kCpu, Tensor(), Tensor(cpu_codes.data(), DType::F8E4M3, Device::CPU, {N, I}),
                            cpu_view(cpu_scales.data(), {N}), cpu_view(guf.data(), {N, 2 * I}));
    EXPECT_LE(rel_err(dequantize(want_codes, want_scales, I), dequantize(cpu_codes, cpu_scales, I)),
              test::tol::kFp8Requantized);
  }
}

TEST(GpuFp8Fused, GemmOverQuantizedRowsEqualsTheLinear) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  if (!ops::fp8_token_gemm_available(g))
    GTEST_SKIP() << "this GPU's cuBLASLt has no FP8 GEMM with OUTER_VEC_32F (per-row) scales";
  for (const auto& [N, K, O] : {std::tuple<int64_t, int64_t, int64_t>{64, 4096, 6144}, {48, 12288, 4096}}) {
    SCOPED_TRACE(testing::Message() << N << "x" << K << " -> " << O);
    const std::vector<float> x = random_bf16(static_cast<size_t>(N * K), 51, 2.f);
    std::mt19937 rng(52);
    std::vector<uint8_t> wc(static_cast<size_t>(O * K));
    for (auto& c : wc) {
      c = static_cast<uint8_t>(rng() & 0xFF);
      if ((c & 0x7F) == 0x7F) c = 0x7E;  // no NaN codes
    }
    std::vector<float> ch(static_cast<size_t>(O));
    std::uniform_real_distribution<float> u(1e-4f, 2e-3f);
    for (auto& s : ch) s = u(rng);
    Buffer d_wc(Device::CUDA, DType::F8E4M3, {O, K}), d_ch(Device::CUDA, DType::F32, {1, O});
    cudaMemcpy(d_wc.t().data, wc.data(), wc.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(d_ch.t().data, ch.data(), ch.size() * 4, cudaMemcpyHostToDevice);
    Buffer in = to_device(g, x, {N, K});
    // The linear, quantizing in itself.
    Buffer want = to_device(g, {}, {N, O});
    Buffer ac(Device::CUDA, DType::F8E4M3, {N, K}), as(Device::CUDA, DType::F32, {1, N});
    ops::fp8_linear_forward(g, want, in, d_wc, d_ch, ac, as, ops::Accumulate::No, Tensor(),
                            ops::Fp8Scaling::TokenChannel);
    // The GEMM alone over the row quantizer's codes, twice (two linears sharing the input).
    DeviceRows rows(N, K);
    ops::fp8_rows_quantize(g, rows.codes, rows.scales, in);
    for (int rep = 0; rep < 2; ++rep) {
      Buffer got = to_device(g, {}, {N, O});
      ops::fp8_gemm_forward(g, got, rows.codes, rows.scales.t().reshape({1, N}), d_wc, d_ch, ops::Accumulate::No,
                            Tensor(), ops::Fp8Scaling::TokenChannel);
      EXPECT_EQ(host_bytes<uint16_t>(got), host_bytes<uint16_t>(want)) << "GEMM " << rep;
    }
    // And against the CPU twin of the GEMM over the same codes.
    std::vector<uint8_t> codes = host_bytes<uint8_t>(rows.codes);
    std::vector<float> scales = host_bytes<float>(rows.scales), cpu_out(static_cast<size_t>(N * O));
    ops::fp8_gemm_forward(kCpu, cpu_view(cpu_out.data(), {N, O}),
                          Tensor(codes.data(), DType::F8E4M3, Device::CPU, {N, K}), cpu_view(scales.data(), {1, N}),
                          Tensor(wc.data(), DType::F8E4M3, Device::CPU, {O, K}), cpu_view(ch.data(), {1, O}),
                          ops::Accumulate::No, Tensor(), ops::Fp8Scaling::TokenChannel);
    EXPECT_LE(rel_err(to_host(g, want), cpu_out), test::tol::kOp);
  }
}

}  // namespace
}  // namespace dflash
