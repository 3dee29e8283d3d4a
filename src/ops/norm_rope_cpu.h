// The per-head arithmetic of the Qwen3 QK-norm + neox RoPE on the CPU backend, shared by
// head_norm_rope_forward (src/ops/head_norm_rope.cpp) and qkv_norm_rope_forward (src/ops/qkv_norm_rope.cpp)
// so the two ops are the same float32 computation, bit for bit (tests/unit/test_fused_ops.cpp checks it).
//
// RoPE follows Hugging Face exactly: inv_freq[i] = 1 / theta^(2i/rotary_dim) in float32, angle =
// float32(pos) * inv_freq[i] in float32, then cos/sin; pairs (i, i + rotary_dim/2) rotate, dims at or
// beyond rotary_dim pass through (partial RoPE).
#pragma once
#include <cmath>
#include <cstdint>

namespace dflash::ops::detail {

// The widest head the float32 reference serves (a head is staged on the stack).
constexpr int64_t kCpuMaxHeadDim = 1024;

struct RopeTables {
  float cos[kCpuMaxHeadDim / 2];
  float sin[kCpuMaxHeadDim / 2];
};

inline float rope_inv_freq(int i, int rot, float theta) {
  const float e = static_cast<float>(2 * i) / static_cast<float>(rot);
  const float p = static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
  return 1.0f / p;
}

// cos/sin of the `half` = rotary_dim / 2 angles of position pos.
inline void rope_tables(RopeTables& tab, int32_t pos, int half, int rot, float theta) {
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * rope_inv_freq(i, rot, theta);
    tab.cos[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
    tab.sin[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
  }
}

// 1 / sqrt(mean(x^2) + eps) over one head of hd values.
inline float head_rstd(const float* x, int64_t hd, float eps) {
  double ss = 0.0;
  for (int64_t c = 0; c < hd; ++c) ss += static_cast<double>(x[c]) * x[c];
  return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(hd) + eps));
}

// One head: o [hd] = rope(x [hd] * rstd * w [hd]) with the token's tables; returns the rstd.
// o may alias x (the normalized head is staged on the stack first). hd <= kCpuMaxHeadDim, rot <= hd.
inline float norm_rope_head(float* o, const float* x, const float* w, const RopeTables& tab, int64_t hd, int rot,
                            float eps) {
  const int half = rot / 2;
  float y[kCpuMaxHeadDim];
  const float r = head_rstd(x, hd, eps);
  for (int64_t c = 0; c < hd; ++c) y[c] = (x[c] * r) * w[c];
  for (int i = 0; i < half; ++i) {
    o[i] = y[i] * tab.cos[i] - y[i + half] * tab.sin[i];
    o[i + half] = y[i + half] * tab.cos[i] + y[i] * tab.sin[i];
  }
  for (int64_t c = rot; c < hd; ++c) o[c] = y[c];
  return r;
}

}  // namespace dflash::ops::detail
