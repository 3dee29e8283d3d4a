// FP8 e4m3fn arithmetic (include/dflash/fp8.h): exhaustive over the 256 codes, rounding checked against an
// independent nearest-value search, and the fine-grained weight / activation quantizers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dflash/fp8.h"

using namespace dflash;

namespace {

bool is_nan_code(uint8_t c) { return (c & 0x7F) == 0x7F; }

// The reference encoder, written from the format's definition rather than bit tricks: the finite code
// nearest to |f| (ties to the even code, i.e. mantissa LSB 0), NaN at and beyond the midpoint between 448
// and the would-be next value 480 when torch's cast rounds up into the NaN code.
uint8_t reference_encode(float f) {
  if (std::isnan(f)) return 0x7F;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(f));
  if (a > 464.0) return static_cast<uint8_t>(0x7F | sign);  // rounds to 480, which is the NaN code
  uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double v = fp8::e4m3_to_f32(static_cast<uint8_t>(c));
    const double err = std::fabs(v - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best | sign);
}

}  // namespace

TEST(Fp8, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float v = fp8::e4m3_to_f32(code);
    if (is_nan_code(code)) {
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_EQ(fp8::e4m3_from_f32(v) & 0x7F, 0x7F) << c;
      continue;
    }
    EXPECT_EQ(fp8::e4m3_from_f32(v), code) << "code " << c << " value " << v;
    EXPECT_EQ(fp8::e4m3_from_f32_sat(v), code) << "code " << c << " value " << v;
  }
}

TEST(Fp8, KnownValues) {
  EXPECT_EQ(fp8::e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(fp8::e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(fp8::e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8::e4m3_to_f32(0x40), 2.0f);
  EXPECT_EQ(fp8::e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8::e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8::e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8::e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8::e4m3_to_f32(0x80)));
  EXPECT_EQ(fp8::e4m3_from_f32(-0.0f), 0x80);
}

TEST(Fp8, TiesGoToEven) {
  // 1 + 1/16 is half way between 1 (m=0) and 1.125 (m=1): even -> 1. 1 + 3/16: between m=1 and m=2 -> m=2.
  EXPECT_EQ(fp8::e4m3_from_f32(1.0625f), 0x38);
  EXPECT_EQ(fp8::e4m3_from_f32(1.1875f), 0x3A);
  // Subnormal tie: half the smallest subnormal rounds to 0, 1.5 of it to 2 of it.
  EXPECT_EQ(fp8::e4m3_from_f32(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(fp8::e4m3_from_f32(3 * std::ldexp(1.0f, -10)), 0x02);
  // Every midpoint between neighbouring finite codes, and one float either side of it.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = fp8::e4m3_to_f32(static_cast<uint8_t>(c)), hi = fp8::e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);  // exact: e4m3 values have few bits
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)}) {
      EXPECT_EQ(fp8::e4m3_from_f32(f), reference_encode(f)) << f;
      EXPECT_EQ(fp8::e4m3_from_f32(-f), reference_encode(-f)) << -f;
    }
  }
}

TEST(Fp8, MatchesNearestValueSearchOnRandomFloats) {
  std::mt19937 rng(46);
  std::uniform_real_distribution<float> exponent(-14.0f, 9.5f);
  std::uniform_int_distribution<int> coin(0, 1);
  for (int i = 0; i < 200000; ++i) {
    float f = std::exp2(exponent(rng));
    if (coin(rng)) f = -f;
    ASSERT_EQ(fp8::e4m3_from_f32(f), reference_encode(f)) << f;
  }
}

TEST(Fp8, OverflowAndNaNAsTorch) {
  EXPECT_EQ(fp8::e4m3_from_f32(448.0f), 0x7E);
  EXPECT_EQ(fp8::e4m3_from_f32(464.0f), 0x7E);                       // tie: 448 is even
  EXPECT_EQ(fp8::e4m3_from_f32(std::nextafter(464.0f, 1e9f)), 0x7F);  // rounds up into NaN (torch)
  EXPECT_EQ(fp8::e4m3_from_f32(480.0f), 0x7F);
  EXPECT_EQ(fp8::e4m3_from_f32(1e30f), 0x7F);
  EXPECT_EQ(fp8::e4m3_from_f32(std::numeric_limits<float>::infinity()), 0x7F);
  EXPECT_EQ(fp8::e4m3_from_f32(-std::numeric_limits<float>::infinity()), 0xFF);
  EXPECT_EQ(fp8::e4m3_from_f32(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(fp8::e4m3_from_f32(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  // The quantizers' cast saturates every finite value to ±448; NaN stays NaN.
  EXPECT_EQ(fp8::e4m3_from_f32_sat(470.0f), 0x7E);
  EXPECT_EQ(fp8::e4m3_from_f32_sat(-1e30f), 0xFE);
  EXPECT_EQ(fp8::e4m3_from_f32_sat(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_TRUE(is_nan_code(fp8::e4m3_from_f32_sat(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Fp8, WeightBlocksScaleEachBlockByItsAmax) {
  // 130 x 200: partial blocks in both directions ([2, 2] scales).
  const int64_t R = 130, C = 200;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(R * C);
  for (float& v : w) v = nd(rng);
  w[5 * C + 150] = 9.0f;    // block (0, 1)'s amax
  w[129 * C + 3] = -0.25f;  // block (1, 0) gets a small amax
  for (int64_t c = 0; c < 128; ++c) w[128 * C + c] = w[129 * C + c] = c == 3 ? -0.25f : 0.01f;
  std::vector<uint8_t> codes(R * C);
  std::vector<float> sinv(4);
  fp8::quantize_weight_blocks(w.data(), R, C, codes.data(), sinv.data());
  EXPECT_FLOAT_EQ(sinv[1], 1.0f / (448.0f / 9.0f));
  EXPECT_FLOAT_EQ(sinv[2], 1.0f / (448.0f / 0.25f));
  EXPECT_EQ(codes[5 * C + 150], 0x7E);   // the amax lands on 448
  EXPECT_EQ(codes[129 * C + 3], 0xFE);
  std::vector<float> back(R * C);
  fp8::dequantize_weight_blocks(codes.data(), sinv.data(), R, C, 128, 128, back.data());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const float s = sinv[(r / 128) * 2 + c / 128];
      // Normal range: 3 mantissa bits, relative error <= 2^-4; below it the subnormal step 2^-9 (scaled).
      const float bound = std::max(std::fabs(w[r * C + c]) * 0.0625f, s * std::ldexp(1.0f, -10));
      ASSERT_LE(std::fabs(back[r * C + c] - w[r * C + c]), bound * 1.0001f) << r << "," << c;
    }
}

TEST(Fp8, ZeroWeightBlockKeepsScaleOne) {
  std::vector<float> w(16, 0.0f);
  std::vector<uint8_t> codes(16, 0xAA);
  float sinv = 0.0f;
  fp8::quantize_weight_blocks(w.data(), 4, 4, codes.data(), &sinv);
  EXPECT_EQ(sinv, 1.0f);
  for (uint8_t c : codes) EXPECT_EQ(c, 0x00);
}

TEST(Fp8, ChannelScalesDequantizePerRow) {
  const uint8_t codes[6] = {0x38, 0x40, 0xB8, 0x38, 0x00, 0x7E};  // 1, 2, -1 | 1, 0, 448
  const float scale[2] = {0.5f, 2.0f};
  float out[6];
  fp8::dequantize_weight_channels(codes, scale, 2, 3, out);
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], -0.5f);
  EXPECT_EQ(out[5], 896.0f);
}

TEST(Fp8, ActivationGroupsPerTokenAnd128Channels) {
  // 3 rows x 300 channels: groups [0,128), [128,256), [256,300); row 1's middle group is all zero.
  const int64_t R = 3, C = 300, G = 128;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(R * C);
  for (float& v : x) v = nd(rng);
  for (int64_t c = 128; c < 256; ++c) x[1 * C + c] = 0.0f;
  std::vector<uint8_t> codes(R * C);
  std::vector<float> scales(R * 3);
  fp8::quantize_activation_groups(x.data(), R, C, G, codes.data(), scales.data());
  std::vector<float> qdq(R * C);
  fp8::activation_quant_dequant(x.data(), R, C, G, qdq.data());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < 3; ++g) {
      float amax = 0.0f;
      for (int64_t c = g * G; c < std::min(C, (g + 1) * G); ++c) amax = std::max(amax, std::fabs(x[r * C + c]));
      EXPECT_EQ(scales[r * 3 + g], amax / 448.0f) << r << "," << g;
    }
  EXPECT_EQ(scales[1 * 3 + 1], 0.0f);
  for (int64_t i = 0; i < R * C; ++i) {
    const float s = scales[(i / C) * 3 + (i % C) / G];
    ASSERT_EQ(qdq[i], fp8::e4m3_to_f32(codes[i]) * s) << i;  // the qdq twin is exactly quantize -> dequantize
    ASSERT_FALSE(std::isnan(qdq[i]));
  }
  // In place gives the same, and a whole-row group (compressed-tensors' per-token scheme) is one scale a row.
  std::vector<float> inplace = x;
  fp8::activation_quant_dequant(inplace.data(), R, C, G, inplace.data());
  EXPECT_EQ(inplace, qdq);
  std::vector<float> row_scales(R);
  fp8::quantize_activation_groups(x.data(), R, C, C, codes.data(), row_scales.data());
  for (int64_t r = 0; r < R; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < C; ++c) amax = std::max(amax, std::fabs(x[r * C + c]));
    EXPECT_EQ(row_scales[r], amax / 448.0f);
  }
}
