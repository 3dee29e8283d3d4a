// ops::fp8_linear_forward's CPU twin (docs/fp8.md), the reference the CUDA GEMMs are held to
// (tests/gpu/test_fp8_linear_gpu.cpp), against the host arithmetic of dflash/fp8.h written out here:
//   Block128: activations quantized per token in groups of 128 (scales kb-major [KB, N]), weights per output
//     row per 128 input channels (kb-major [KB, O]);
//   TokenChannel (compressed-tensors FP8-Dynamic): one activation scale per token ([1, N]) and one weight
//     scale per output channel ([1, O]).
// Each: the activation codes and scales bit for bit, the output within float32 summation-order noise (1e-5
// relative L2), and the two scalings give different products (the test can tell which one ran).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "dflash/fp8.h"
#include "dflash/ops.h"

using namespace dflash;

namespace {

constexpr int64_t kN = 9, kK = 300, kO = 40;  // K: 3 groups of 128, the last partial

struct Case {
  std::vector<float> x, out, act_scales;
  std::vector<uint8_t> w_codes, act_codes;
  std::vector<float> w_scales;  // [KB, O] or [1, O]
};

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * double(a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / den);
}

Case make_case(int64_t kb_rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::uniform_real_distribution<float> u(1e-3f, 4e-3f);
  Case c;
  c.x.resize(kN * kK);
  for (float& v : c.x) v = nd(rng);
  c.w_codes.resize(kO * kK);
  for (uint8_t& q : c.w_codes) {
    q = static_cast<uint8_t>(rng());
    if ((q & 0x7F) == 0x7F) q ^= 1;  // not NaN
  }
  c.w_scales.resize(static_cast<size_t>(kb_rows * kO));
  for (float& s : c.w_scales) s = u(rng);
  return c;
}

void run_op(Case& c, ops::Fp8Scaling scaling) {
  const int64_t KB = scaling == ops::Fp8Scaling::TokenChannel ? 1 : fp8::blocks(kK, fp8::kBlock);
  c.out.assign(kN * kO, 0.f);
  c.act_codes.assign(kN * kK, 0);
  c.act_scales.assign(KB * kN, -1.f);
  ops::fp8_linear_forward(cpu_ctx(), cpu_view(c.out.data(), {kN, kO}), cpu_view(c.x.data(), {kN, kK}),
                          Tensor(c.w_codes.data(), DType::F8E4M3, Device::CPU, {kO, kK}),
                          cpu_view(c.w_scales.data(), {static_cast<int64_t>(c.w_scales.size()) / kO, kO}),
                          Tensor(c.act_codes.data(), DType::F8E4M3, Device::CPU, {kN, kK}),
                          cpu_view(c.act_scales.data(), {KB, kN}), ops::Accumulate::No, Tensor(), scaling);
}

// out[n, o] = sum_k deq(x)[n, k] * deq(w)[o, k] in float64, from fp8.h's quantizer and dequantizers.
std::vector<float> reference(const Case& c, int64_t group, std::vector<uint8_t>* codes, std::vector<float>* scales) {
  const int64_t G = fp8::blocks(kK, group);
  codes->resize(kN * kK);
  scales->resize(kN * G);  // row-major [N, G]
  fp8::quantize_activation_groups(c.x.data(), kN, kK, group, codes->data(), scales->data());
  std::vector<float> w(kO * kK);
  if (group == kK) {
    fp8::dequantize_weight_channels(c.w_codes.data(), c.w_scales.data(), kO, kK, w.data());
  } else {
    for (int64_t o = 0; o < kO; ++o)
      for (int64_t k = 0; k < kK; ++k)
        w[o * kK + k] = fp8::e4m3_to_f32(c.w_codes[o * kK + k]) * c.w_scales[(k / fp8::kBlock) * kO + o];
  }
  std::vector<float> out(kN * kO);
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t o = 0; o < kO; ++o) {
      double acc = 0;
      for (int64_t k = 0; k < kK; ++k)
        acc += double(fp8::e4m3_to_f32((*codes)[n * kK + k]) * (*scales)[n * G + k / group]) * w[o * kK + k];
      out[n * kO + o] = static_cast<float>(acc);
    }
  return out;
}

}  // namespace

TEST(Fp8LinearCpu, Block128IsGroupsOf128OverKbMajorScales) {
  Case c = make_case(fp8::blocks(kK, fp8::kBlock), 7);
  run_op(c, ops::Fp8Scaling::Block128);
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  const std::vector<float> want = reference(c, fp8::kBlock, &codes, &scales);
  EXPECT_EQ(c.act_codes, codes);
  const int64_t KB = fp8::blocks(kK, fp8::kBlock);
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t kb = 0; kb < KB; ++kb) EXPECT_EQ(c.act_scales[kb * kN + n], scales[n * KB + kb]) << n << "," << kb;
  EXPECT_LE(rel_l2(c.out, want), 1e-5);
}

TEST(Fp8LinearCpu, TokenChannelIsOneScalePerTokenAndPerChannel) {
  Case c = make_case(1, 8);
  run_op(c, ops::Fp8Scaling::TokenChannel);
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  const std::vector<float> want = reference(c, kK, &codes, &scales);
  EXPECT_EQ(c.act_codes, codes);
  EXPECT_EQ(c.act_scales, scales);  // [1, N] = row-major [N, 1]
  EXPECT_LE(rel_l2(c.out, want), 1e-5);
  // The same weights read as 1x128-group scales (the channel scale repeated) with 128-channel activation
  // groups: another quantization of the activations, so another product.
  Case b = c;
  b.w_scales.clear();
  for (int64_t kb = 0; kb < fp8::blocks(kK, fp8::kBlock); ++kb)
    b.w_scales.insert(b.w_scales.end(), c.w_scales.begin(), c.w_scales.end());
  run_op(b, ops::Fp8Scaling::Block128);
  EXPECT_GT(rel_l2(b.out, c.out), 1e-4) << "the two scalings gave the same product";
  EXPECT_LE(rel_l2(b.out, c.out), 0.1);
}
