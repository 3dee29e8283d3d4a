// The per-token FP8 GEMM's input, quantized once (docs/fp8.md "Per-token activations, quantized once"), on
// the CPU backend:
//   fp8_gemm_forward over codes and scales a caller quantized = fp8_linear_forward of the same input, bit for
//     bit (TokenChannel with fp8_rows_quantize's codes, Block128 with fp8_linear_forward's own), with a
//     residual too;
//   rmsnorm_fp8_forward = rmsnorm_forward then fp8_rows_quantize of its output, bit for bit, with and without
//     the normed output;
//   swiglu_fp8_forward = swiglu_fused_forward then fp8_rows_quantize, bit for bit, likewise.
// The CUDA twins are held to these and to the unfused CUDA ops in tests/gpu/test_fp8_fused_gpu.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "dflash/fp8.h"
#include "dflash/ops.h"

using namespace dflash;

namespace {

const Ctx kCpu = cpu_ctx();

std::vector<float> random_values(size_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor f8(std::vector<uint8_t>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::F8E4M3, Device::CPU, dims);
}

// Per-token codes and scales of x [N, K] by the row quantizer (what a fused producer writes).
struct Rows {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
Rows quantize_rows(std::vector<float>& x, int64_t N, int64_t K) {
  Rows r{std::vector<uint8_t>(static_cast<size_t>(N * K), 0xAA), std::vector<float>(static_cast<size_t>(N), -1.f)};
  ops::fp8_rows_quantize(kCpu, f8(r.codes, {N, K}), cpu_view(r.scales.data(), {N}), cpu_view(x.data(), {N, K}));
  return r;
}

TEST(Fp8FusedCpu, GemmOverQuantizedRowsEqualsTheLinear) {
  const int64_t N = 5, K = 256, O = 48;
  for (const ops::Fp8Scaling scaling : {ops::Fp8Scaling::TokenChannel, ops::Fp8Scaling::Block128}) {
    SCOPED_TRACE(scaling == ops::Fp8Scaling::TokenChannel ? "TokenChannel" : "Block128");
    const bool token = scaling == ops::Fp8Scaling::TokenChannel;
    const int64_t KB = token ? 1 : K / fp8::kBlock;
    std::vector<float> x = random_values(static_cast<size_t>(N * K), 1, 2.f);
    std::vector<float> w = random_values(static_cast<size_t>(O * K), 2, 0.05f);
    std::vector<uint8_t> wc(static_cast<size_t>(O * K));
    std::vector<float> ws(static_cast<size_t>(KB * O)), ch(static_cast<size_t>(O));
    if (token) {
      fp8::quantize_weight_channels(w.data(), O, K, wc.data(), ch.data());
      ws = ch;
    } else {
      std::vector<float> blocks(static_cast<size_t>(fp8::blocks(O, fp8::kBlock) * KB));
      fp8::quantize_weight_blocks(w.data(), O, K, wc.data(), blocks.data());
      for (int64_t kb = 0; kb < KB; ++kb)
        for (int64_t o = 0; o < O; ++o) ws[kb * O + o] = blocks[(o / fp8::kBlock) * KB + kb];
    }
    std::vector<float> residual = random_values(static_cast<size_t>(N * O), 3, 1.f);
    // The linear: quantizes x itself.
    std::vector<float> want(static_cast<size_t>(N * O));
    std::vector<uint8_t> ac(static_cast<size_t>(N * K));
    std::vector<float> as(static_cast<size_t>(KB * N));
    ops::fp8_linear_forward(kCpu, cpu_view(want.data(), {N, O}), cpu_view(x.data(), {N, K}), f8(wc, {O, K}),
                            cpu_view(ws.data(), {KB, O}), f8(ac, {N, K}), cpu_view(as.data(), {KB, N}),
                            ops::Accumulate::No, cpu_view(residual.data(), {N, O}), scaling);
    // The GEMM alone over codes quantized beforehand: the row quantizer's (TokenChannel), the linear's
    // (Block128: groups of 128, no row quantizer).
    Rows rows = quantize_rows(x, N, K);
    if (token) {
      EXPECT_EQ(rows.codes, ac);
      EXPECT_EQ(rows.scales, as);
    } else {
      rows = Rows{ac, as};
    }
    std::vector<float> got(static_cast<size_t>(N * O), -7.f);
    ops::fp8_gemm_forward(kCpu, cpu_view(got.data(), {N, O}), f8(rows.codes, {N, K}),
                          cpu_view(rows.scales.data(), {KB, N}), f8(wc, {O, K}), cpu_view(ws.data(), {KB, O}),
                          ops::Accumulate::No, cpu_view(residual.data(), {N, O}), scaling);
    EXPECT_EQ(got, want);
  }
}

TEST(Fp8FusedCpu, RmsNormFp8IsTheNormThenTheRowQuantizer) {
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{7, 64}, {3, 1000}}) {
    SCOPED_TRACE(testing::Message() << N << " x " << C);
    std::vector<float> x = random_values(static_cast<size_t>(N * C), 4, 3.f);
    for (int64_t c = 0; c < C; ++c) x[c] = 0.f;  // row 0 all zero: scale 0, codes 0
    std::vector<float> w = random_values(static_cast<size_t>(C), 5, 1.f);
    std::vector<float> normed(x.size());
    ops::rmsnorm_forward(kCpu, cpu_view(normed.data(), {N, C}), Tensor(), cpu_view(x.data(), {N, C}),
                         cpu_view(w.data(), {C}), 1e-6f);
    const Rows want = quantize_rows(normed, N, C);
    std::vector<float> out(x.size(), -7.f);
    Rows got{std::vector<uint8_t>(x.size(), 0xAA), std::vector<float>(static_cast<size_t>(N), -1.f)};
    ops::rmsnorm_fp8_forward(kCpu, cpu_view(out.data(), {N, C}), f8(got.codes, {N, C}),
                             cpu_view(got.scales.data(), {N}), cpu_view(x.data(), {N, C}), cpu_view(w.data(), {C}),
                             1e-6f);
    EXPECT_EQ(out, normed);
    EXPECT_EQ(got.codes, want.codes);
    EXPECT_EQ(got.scales, want.scales);
    EXPECT_EQ(got.scales[0], 0.f);
    // Without the normed output: the same codes and scales.
    Rows bare{std::vector<uint8_t>(x.size(), 0xAA), std::vector<float>(static_cast<size_t>(N), -1.f)};
    ops::rmsnorm_fp8_forward(kCpu, Tensor(), f8(bare.codes, {N, C}), cpu_view(bare.scales.data(), {N}),
                             cpu_view(x.data(), {N, C}), cpu_view(w.data(), {C}), 1e-6f);
    EXPECT_EQ(bare.codes, want.codes);
    EXPECT_EQ(bare.scales, want.scales);
  }
}

TEST(Fp8FusedCpu, SwigluFp8IsTheActivationThenTheRowQuantizer) {
  const int64_t N = 6, I = 200;
  std::vector<float> gu = random_values(static_cast<size_t>(N * 2 * I), 6, 2.f);
  for (int64_t c = 0; c < 2 * I; ++c) gu[c] = 0.f;  // row 0: silu(0) * 0 = 0 everywhere
  std::vector<float> a(static_cast<size_t>(N * I));
  ops::swiglu_fused_forward(kCpu, cpu_view(a.data(), {N, I}), cpu_view(gu.data(), {N, 2 * I}));
  const Rows want = quantize_rows(a, N, I);
  std::vector<float> out(a.size(), -7.f);
  Rows got{std::vector<uint8_t>(a.size(), 0xAA), std::vector<float>(static_cast<size_t>(N), -1.f)};
  ops::swiglu_fp8_forward(kCpu, cpu_view(out.data(), {N, I}), f8(got.codes, {N, I}), cpu_view(got.scales.data(), {N}),
                          cpu_view(gu.data(), {N, 2 * I}));
  EXPECT_EQ(out, a);
  EXPECT_EQ(got.codes, want.codes);
  EXPECT_EQ(got.scales, want.scales);
  EXPECT_EQ(got.scales[0], 0.f);
  Rows bare{std::vector<uint8_t>(a.size(), 0xAA), std::vector<float>(static_cast<size_t>(N), -1.f)};
  ops::swiglu_fp8_forward(kCpu, Tensor(), f8(bare.codes, {N, I}), cpu_view(bare.scales.data(), {N}),
                          cpu_view(gu.data(), {N, 2 * I}));
  EXPECT_EQ(bare.codes, want.codes);
  EXPECT_EQ(bare.scales, want.scales);
}

}  // namespace
