// How a target checkpoint stores its linear projections (config.json's quantization_config) and how a run
// executes them (--target-precision): docs/fp8.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash {

// The FP8 checkpoint formats this build reads.
enum class CheckpointFp8 : uint8_t {
  None,               // no quantization_config: every tensor BF16/F16/F32
  FineGrained,        // transformers' quant_method "fp8" (Qwen's -FP8 releases): 128x128 block weight_scale_inv
  CompressedTensors,  // llm-compressor's compressed-tensors float-quantized 8-bit (FP8-Dynamic, FP8-Block)
};
const char* checkpoint_fp8_name(CheckpointFp8 f);  // "none", "fp8 (fine-grained)", "compressed-tensors"

// How a stored FP8 weight's scales are laid out.
enum class WeightScales : uint8_t {
  Blocks,    // [ceil(out/block_rows), ceil(in/block_cols)] float32, w = q * scale
  Channels,  // [out, 1] (or [out]) float32, w = q * scale
};

// --target-precision: how the linears run.
enum class TargetPrecision : uint8_t { Bf16, Fp8 };

// The format --target-precision quantizes a bf16 checkpoint's linears into on load: fp8 -> Block (the
// fine-grained format of Qwen's -FP8 releases: 128x128 weight blocks, activations per token in groups of
// 128); fp8-dynamic -> Dynamic (llm-compressor's FP8-Dynamic: one weight scale per output channel, one
// activation scale per token).
enum class OnLoadFp8 : uint8_t { Block, Dynamic };
const char* target_precision_name(TargetPrecision p);  // "bf16", "fp8"

struct TargetQuantization {
  CheckpointFp8 format = CheckpointFp8::None;
  WeightScales scales = WeightScales::Blocks;
  int64_t block_rows = 128, block_cols = 128;   // Blocks
  std::string scale_suffix = "weight_scale_inv";  // the scale tensor beside "<module>.weight"
  // Input channels per dynamic activation scale of an FP8 linear: 128 (fine-grained, FP8-Block), 0 = one
  // per token (compressed-tensors' strategy "token").
  int64_t act_group = 128;
  // FineGrained: modules_to_not_convert plus "lm_head", matched as transformers does (digits -> '*', then
  // substring). CompressedTensors: ignore (exact module names, or "re:" regular expressions matched from
  // the start of the name).
  std::vector<std::string> not_converted;
  // How this run executes the linears: the checkpoint's own precision unless --target-precision says
  // otherwise (resolve_target_precision).
  TargetPrecision precision = TargetPrecision::Bf16;
  OnLoadFp8 on_load = OnLoadFp8::Block;  // format None with precision Fp8: the format quantized into on load

  // Whether the config says `module` (e.g. "model.layers.3.mlp.down_proj") is stored FP8. None: false.
  bool stores_fp8(const std::string& module) const;
  // Input channels per activation scale when the linears run FP8: on a bf16 checkpoint (None) the on-load
  // format's (128 for fp8, 0 = one per token for fp8-dynamic), else act_group.
  int64_t activation_group() const {
    return format == CheckpointFp8::None ? (on_load == OnLoadFp8::Dynamic ? 0 : 128) : act_group;
  }
  // Whether the FP8 weights have one scale per output channel (stored so, or fp8-dynamic on load).
  bool channel_scales() const {
    return format == CheckpointFp8::None ? on_load == OnLoadFp8::Dynamic : scales == WeightScales::Channels;
  }
  // Whether the FP8 linears are per token x per channel (compressed-tensors FP8-Dynamic, fp8-dynamic): one
  // activation scale per token over weights with one scale per output channel, the per-token FP8 GEMM's.
  bool token_channel() const { return activation_group() == 0 && channel_scales(); }
  // Whether an FP8 weight's scales are (or, quantized on load, become) one per output row per 128 input
  // channels: channel scales, blocks 128 columns wide, or --target-precision fp8's 128x128 blocks. Such
  // weights can stay e4m3 on the device with kb-major scales (docs/fp8.md "How a target's FP8 linears run").
  bool scales_per_128_channels() const {
    return format == CheckpointFp8::None || scales == WeightScales::Channels || block_cols == 128;
  }
};

// Parses root["quantization_config"] (or text_config's) of a target config.json: absent -> None. A
// quantization this build does not read (another quant_method, static activation scales, int weights, ...)
// is a fatal BadInput naming the field and `source`.
TargetQuantization parse_target_quantization(const nlohmann::json& root, const std::string& source);

// Applies --target-precision ("" = the checkpoint's own, "bf16", "fp8", "fp8-dynamic") to q. fp8-dynamic
// names a format to quantize into: on an FP8 checkpoint (already in its own format) it is a fatal BadOptions.
void resolve_target_precision(TargetQuantization& q, const std::string& option);

}  // namespace dflash
