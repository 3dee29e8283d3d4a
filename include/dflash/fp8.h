// FP8 (OCP e4m3fn, torch.float8_e4m3fn) arithmetic on the host: the reference every FP8 path of the
// target is held to (docs/fp8.md).
//
//   e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; 0x7F / 0xFF are NaN; the
//   largest finite value is 448 (0x7E). Subnormals: m/8 * 2^-6.
//
// The quantizers follow transformers' fine-grained FP8 (its finegrained_fp8 integration, recorded in
// docs/fp8.md) bit for bit:
//   weights, blocks of 128x128:  scale = 448 / amax (1 when amax = 0);  q = e4m3(clamp(w * scale, ±448));
//                                weight_scale_inv = 1 / scale;          w ≈ q * weight_scale_inv
//   activations, per token in groups of `group` input channels (128; a whole row for compressed-tensors'
//   per-token scheme):           s = amax / 448;  q = e4m3(x / s);       x ≈ q * s
// An all-zero group has s = 0 and codes 0 (transformers would divide 0 by 0: NaN, later zeroed by its
// nan_to_num over the whole output; ours gives the same zeros without poisoning the row's other groups).
#pragma once
#include <cstdint>

namespace dflash::fp8 {

constexpr float kE4M3Max = 448.0f;
constexpr int64_t kBlock = 128;  // weight block edge and activation group of the fine-grained format

// torch's float -> float8_e4m3fn cast (c10/util/Float8_e4m3fn.h), bit-exact: round to nearest, ties to
// even; NaN, ±Inf and |f| >= 480 give NaN (0x7F | sign); 464 < |f| < 480 rounds up into the NaN code too.
uint8_t e4m3_from_f32(float f);
// The quantizers' cast: clamp to [-448, 448] first (torch.clamp(..., fp8_min, fp8_max).to(e4m3fn)), so
// every finite input gives a finite code; NaN stays NaN.
uint8_t e4m3_from_f32_sat(float f);
// Exact: every code's value is a float.
float e4m3_to_f32(uint8_t code);

// Number of blocks of `block` covering n (the last one may be partial).
inline int64_t blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

// W [rows, cols] -> codes [rows, cols] and scale_inv [blocks(rows, b), blocks(cols, b)] (row-major), b = 128.
void quantize_weight_blocks(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scale_inv);
// out [rows, cols] = codes * scale_inv of the codes' (block_rows x block_cols) block. out may not alias codes.
void dequantize_weight_blocks(const uint8_t* codes, const float* scale_inv, int64_t rows, int64_t cols,
                              int64_t block_rows, int64_t block_cols, float* out);
// W [rows, cols] -> codes [rows, cols] and scale [rows]: llm-compressor's FP8-Dynamic weights, scale = amax / 448
// per output channel (1 for an all-zero row), codes = e4m3(clamp(w / scale, +-448)).
void quantize_weight_channels(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scale);
// out [rows, cols] = codes * scale[row] (compressed-tensors' per-output-channel weight_scale).
void dequantize_weight_channels(const uint8_t* codes, const float* scale, int64_t rows, int64_t cols, float* out);

// x [rows, cols] -> codes [rows, cols], scales [rows, blocks(cols, group)] (row-major).
void quantize_activation_groups(const float* x, int64_t rows, int64_t cols, int64_t group, uint8_t* codes,
                                float* scales);
// out [rows, cols] = dequantize(quantize(x)): what an FP8 linear's GEMM sees of its input. out may be x.
void activation_quant_dequant(const float* x, int64_t rows, int64_t cols, int64_t group, float* out);

}  // namespace dflash::fp8
