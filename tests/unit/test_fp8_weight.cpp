// ops::fp8_weight_dequantize (LinearMode::Fp8Dequant, docs/fp8.md "How a target's FP8 linears run"): the
// CPU twin over the kb-major scales against the loader's host dequantization (fp8::dequantize_weight_blocks
// for 128x128 blocks, fp8::dequantize_weight_channels for channel scales), bit for bit, on a shape that
// divides neither 128 nor 8 and on every e4m3 code that is not NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "dflash/fp8.h"
#include "dflash/ops.h"

using namespace dflash;

namespace {

constexpr int64_t kO = 300, kK = 201;  // 3 x 2 blocks, the last ones partial

std::vector<uint8_t> random_codes(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> codes(static_cast<size_t>(kO * kK));
  for (size_t i = 0; i < codes.size(); ++i) {
    uint8_t c = static_cast<uint8_t>(i < 254 ? i + (i >= 127) : rng());  // every finite code first
    if ((c & 0x7F) == 0x7F) c ^= 1;                                     // e4m3fn's NaN: the loader refuses it
    codes[i] = c;
  }
  return codes;
}

// scales [KB, O] kb-major from a scale per output row per 128 input channels.
template <class RowScale>
std::vector<float> kb_major(RowScale row_scale) {
  const int64_t KB = fp8::blocks(kK, fp8::kBlock);
  std::vector<float> s(static_cast<size_t>(KB * kO));
  for (int64_t kb = 0; kb < KB; ++kb)
    for (int64_t o = 0; o < kO; ++o) s[static_cast<size_t>(kb * kO + o)] = row_scale(o, kb);
  return s;
}

std::vector<float> op_dequantize(std::vector<uint8_t>& codes, std::vector<float>& scales) {
  std::vector<float> out(codes.size(), -1.f);
  const int64_t KB = fp8::blocks(kK, fp8::kBlock);
  ops::fp8_weight_dequantize(cpu_ctx(), cpu_view(out.data(), {kO, kK}),
                             Tensor(codes.data(), DType::F8E4M3, Device::CPU, {kO, kK}),
                             cpu_view(scales.data(), {KB, kO}));
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(Fp8WeightDequantize, BlockScalesEqualTheLoadersDequantization) {
  std::vector<uint8_t> codes = random_codes(1);
  const int64_t RB = fp8::blocks(kO, fp8::kBlock), KB = fp8::blocks(kK, fp8::kBlock);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> log2s(-12.f, 2.f);
  std::vector<float> scale_inv(static_cast<size_t>(RB * KB));
  for (float& s : scale_inv) s = std::exp2(log2s(rng)) * 1.37f;  // not powers of two: the product rounds
  std::vector<float> want(codes.size());
  fp8::dequantize_weight_blocks(codes.data(), scale_inv.data(), kO, kK, fp8::kBlock, fp8::kBlock, want.data());
  std::vector<float> scales = kb_major([&](int64_t o, int64_t kb) { return scale_inv[(o / fp8::kBlock) * KB + kb]; });
  EXPECT_TRUE(same_bits(op_dequantize(codes, scales), want));
}

TEST(Fp8WeightDequantize, ChannelScalesEqualTheLoadersDequantization) {
  std::vector<uint8_t> codes = random_codes(3);
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(1e-4f, 3e-2f);
  std::vector<float> channel(static_cast<size_t>(kO));
  for (float& s : channel) s = u(rng);
  std::vector<float> want(codes.size());
  fp8::dequantize_weight_channels(codes.data(), channel.data(), kO, kK, want.data());
  std::vector<float> scales = kb_major([&](int64_t o, int64_t) { return channel[o]; });
  const std::vector<float> got = op_dequantize(codes, scales);
  EXPECT_TRUE(same_bits(got, want));
  EXPECT_NE(got[1], 0.f);  // the op wrote something
}

TEST(Fp8WeightDequantize, ShapesAreChecked) {
  std::vector<uint8_t> codes = random_codes(5);
  std::vector<float> scales(static_cast<size_t>(kO), 1.f), out(codes.size());
  // one scale row where K = 201 needs two
  EXPECT_DEATH(ops::fp8_weight_dequantize(cpu_ctx(), cpu_view(out.data(), {kO, kK}),
                                          Tensor(codes.data(), DType::F8E4M3, Device::CPU, {kO, kK}),
                                          cpu_view(scales.data(), {1, kO})),
               "fp8_weight_dequantize: argument 'scales' has shape \\[1, 300\\], expected \\[2, 300\\]");
}
