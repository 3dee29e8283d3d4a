// FP8 e4m3fn arithmetic and the fine-grained quantizers on the host (include/dflash/fp8.h).
#include "dflash/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace dflash::fp8 {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

uint8_t e4m3_from_f32(float f) {
  // The bit-level conversion of c10's fp8e4m3fn_from_fp32_value, so a code written here is the code torch
  // writes for the same float.
  const uint32_t kNaNFrom = UINT32_C(1087) << 20;    // 480.0f: the first magnitude that is NaN
  const uint32_t kDenormMask = UINT32_C(141) << 23;  // 2^14: adding it rounds a subnormal into place
  uint32_t f_bits = bits_of(f);
  const uint32_t sign = f_bits & UINT32_C(0x80000000);
  f_bits ^= sign;
  uint8_t result;
  if (f_bits >= kNaNFrom) {
    result = 0x7F;  // NaN, Inf and everything from 480 up
  } else if (f_bits < (UINT32_C(121) << 23)) {
    // Below 2^-6, e4m3's smallest normal: the float addition rounds to the subnormal grid (to nearest even).
    f_bits = bits_of(float_of(f_bits) + float_of(kDenormMask));
    result = static_cast<uint8_t>(f_bits - kDenormMask);
  } else {
    const uint32_t mant_odd = (f_bits >> 20) & 1u;
    f_bits += (static_cast<uint32_t>(7 - 127) << 23) + UINT32_C(0x7FFFF);  // rebias, round half up ...
    f_bits += mant_odd;                                                   // ... then to even
    result = static_cast<uint8_t>(f_bits >> 20);
  }
  return static_cast<uint8_t>(result | (sign >> 24));
}

uint8_t e4m3_from_f32_sat(float f) {
  if (std::isnan(f)) return e4m3_from_f32(f);
  return e4m3_from_f32(std::min(kE4M3Max, std::max(-kE4M3Max, f)));
}

float e4m3_to_f32(uint8_t code) {
  const bool negative = (code & 0x80u) != 0;
  const int e = (code >> 3) & 0xF, m = code & 0x7;
  float v;
  if (e == 0xF && m == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -9);  // m/8 * 2^-6
  } else {
    v = std::ldexp(static_cast<float>(8 + m), e - 10);  // (1 + m/8) * 2^(e-7)
  }
  return negative ? -v : v;
}

void quantize_weight_blocks(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scale_inv) {
  const int64_t br = blocks(rows, kBlock), bc = blocks(cols, kBlock);
  for (int64_t bi = 0; bi < br; ++bi) {
    const int64_t r0 = bi * kBlock, r1 = std::min(rows, r0 + kBlock);
    for (int64_t bj = 0; bj < bc; ++bj) {
      const int64_t c0 = bj * kBlock, c1 = std::min(cols, c0 + kBlock);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float scale = amax > 0.0f ? kE4M3Max / amax : 1.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) codes[r * cols + c] = e4m3_from_f32_sat(w[r * cols + c] * scale);
      scale_inv[bi * bc + bj] = 1.0f / scale;
    }
  }
}

void dequantize_weight_blocks(const uint8_t* codes, const float* scale_inv, int64_t rows, int64_t cols,
                              int64_t block_rows, int64_t block_cols, float* out) {
  const int64_t bc = blocks(cols, block_cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = scale_inv + (r / block_rows) * bc;
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = e4m3_to_f32(codes[r * cols + c]) * srow[c / block_cols];
  }
}

void quantize_weight_channels(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
    const float s = amax > 0.0f ? amax / kE4M3Max : 1.0f;
    scale[r] = s;
    for (int64_t c = 0; c < cols; ++c) codes[r * cols + c] = e4m3_from_f32_sat(w[r * cols + c] / s);
  }
}

void dequantize_weight_channels(const uint8_t* codes, const float* scale, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = e4m3_to_f32(codes[r * cols + c]) * scale[r];
}

namespace {
// One activation group's scale: amax / 448 over columns [c0, c1) of a row (0 for an all-zero group). The one
// rule of quantize_activation_groups and its quantize -> dequantize twin.
float group_scale(const float* xr, int64_t c0, int64_t c1) {
  float amax = 0.0f;
  for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(xr[c]));
  return amax / kE4M3Max;
}
}  // namespace

void quantize_activation_groups(const float* x, int64_t rows, int64_t cols, int64_t group, uint8_t* codes,
                                float* scales) {
  const int64_t ng = blocks(cols, group);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t c0 = g * group, c1 = std::min(cols, c0 + group);
      const float* xr = x + r * cols;
      const float s = group_scale(xr, c0, c1);
      for (int64_t c = c0; c < c1; ++c) codes[r * cols + c] = s > 0.0f ? e4m3_from_f32_sat(xr[c] / s) : 0;
      scales[r * ng + g] = s;
    }
  }
}

void activation_quant_dequant(const float* x, int64_t rows, int64_t cols, int64_t group, float* out) {
  const int64_t ng = blocks(cols, group);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t c0 = g * group, c1 = std::min(cols, c0 + group);
      const float* xr = x + r * cols;
      const float s = group_scale(xr, c0, c1);
      float* o = out + r * cols;
      for (int64_t c = c0; c < c1; ++c) o[c] = s > 0.0f ? e4m3_to_f32(e4m3_from_f32_sat(xr[c] / s)) * s : 0.0f;
    }
  }
}

}  // namespace dflash::fp8
