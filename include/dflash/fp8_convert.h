// An FP8 copy of a bf16 target checkpoint in a format serving teams download (docs/fp8.md): what
// dflash-fp8-convert writes, and what the tests and benches make FP8 targets with.
#pragma once
#include <string>
#include <vector>

#include "dflash/target_quant.h"

namespace dflash {

enum class Fp8ConvertFormat : uint8_t {
  Block,    // transformers' fine-grained FP8 (quant_method "fp8", 128x128 weight_scale_inv, modules_to_not_convert)
  Channel,  // compressed-tensors FP8-Dynamic (per-channel weight_scale, per-token activations, ignore)
};

struct Fp8ConvertResult {
  TargetQuantization quant;  // how the loader reads the written config
  int converted = 0;         // linear projections written in FP8
};

// Writes dst (a new directory): src's config.json with a quantization_config, every decoder layer's
// linear (a 2-D "<module>.weight": *_proj, the Gated DeltaNet's in_proj_qkv/z/a/b) the config does not exclude (`ignore`: modules_to_not_convert patterns, or
// compressed-tensors ignore entries) as F8_E4M3 + its scale, every other tensor and file copied. Fatal
// BadOptions when dst exists, BadInput when src is already quantized.
Fp8ConvertResult write_fp8_checkpoint(const std::string& src, const std::string& dst, Fp8ConvertFormat format,
                                      const std::vector<std::string>& ignore);

}  // namespace dflash
