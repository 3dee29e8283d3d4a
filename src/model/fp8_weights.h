// FP8 linears at load time (docs/fp8.md): what load_decoder_weights (model/decoder_weights.h) asks of a
// linear projection's checkpoint tensor -- stored FP8 or not, runs FP8 or not -- and its float32 values.
#pragma once
#include <optional>

#include "dflash/ops.h"
#include "dflash/safetensors.h"
#include "dflash/target_quant.h"
#include "model/decoder_weights.h"

namespace dflash {

// Checks the linear s against the checkpoint and config.json's quantization (before any allocation) and
// sets s.stored_fp8 / s.runs_fp8. Stored F8_E4M3: its scale tensor present with the format's shape and a
// floating dtype, and the config saying the module is converted (else a fatal BadInput naming the tensor).
// Stored BF16/F16/F32: it runs as stored; where the config's list does not name it, s.stored_float_unlisted
// (releases leave small linears unconverted unlisted; load_decoder_weights counts them).
void plan_linear(Checkpoint& ckpt, const TargetQuantization& q, WeightSpec& s, const char* mismatch_hint);

// s's float32 values [ckpt_shape] into dst: dequantized from e4m3 when stored FP8; else as stored, then
// quantized -> dequantized (128x128 blocks) when s.runs_fp8 (--target-precision fp8 on a bf16 checkpoint).
// A non-finite dequantized weight (a NaN code) is a fatal BadInput naming the tensor.
void load_linear_f32(Checkpoint& ckpt, const TargetQuantization& q, const WeightSpec& s, float* dst);

// Whether the FP8 linear s (s.runs_fp8) can keep its e4m3 codes and kb-major scales on the device
// (LinearMode::Fp8Gemm, Fp8Dequant): a matrix whose stored scales are per output row per 128 input channels
// (TargetQuantization::scales_per_128_channels).
bool fp8_codes_fit(const TargetQuantization& q, const WeightSpec& s);

// The FP8 GEMM a quantization runs as (ops::fp8_linear_forward's scaling), on a device that has it:
// activations in groups of 128 (the fine-grained format, FP8-Block, --target-precision fp8) -> Block128;
// one activation scale per token with one weight scale per output channel (compressed-tensors
// FP8-Dynamic) -> TokenChannel; anything else (per-token activations over block weights) has none.
std::optional<ops::Fp8Scaling> fp8_gemm_scaling(const TargetQuantization& q);

// Whether the FP8 linear s can run as ops::fp8_linear_forward, apart from its row count (the caller checks
// the whole, possibly fused, projection's) and the device: fp8_codes_fit, a scaling (above), and in % 128
// == 0 (Block128) or in % 16 == 0 (TokenChannel).
bool fp8_gemm_fits(const TargetQuantization& q, const WeightSpec& s);

// s's e4m3 codes [rows, cols] and its scales per output row per 128 input channels, row-major
// [rows, ceil(cols/128)] (a block scale repeated over its block's rows, a channel scale over the groups):
// as stored when stored FP8, else quantized into 128x128 blocks (--target-precision fp8). A NaN code or a
// non-finite scale is a fatal BadInput naming the tensor. s must pass fp8_codes_fit.
void load_linear_fp8(Checkpoint& ckpt, const TargetQuantization& q, const WeightSpec& s, uint8_t* codes,
                     float* row_scales);

}  // namespace dflash
