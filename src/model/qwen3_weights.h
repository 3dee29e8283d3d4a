// The frozen weights of a Qwen3 dense decoder stack (the target), loaded from an HF checkpoint.
#pragma once
#include <vector>

#include "dflash/hf_config.h"
#include "dflash/safetensors.h"
#include "dflash/tensor.h"
#include "model/decoder_weights.h"

namespace dflash {

// One decoder layer: the shared norms and MLP (model/decoder_weights.h) and the attention, torch layout
// (Linear W [out, in]). The q/k/v projections read the same input and are stored fused, so the forward
// runs one GEMM for them (wider N: the [nkv*hd, H] k and v GEMMs alone are the least efficient of the
// layer): the checkpoint's q/k/v rows are loaded straight into row ranges of qkv_proj, and each stays
// available as a row-slice view of it.
struct Qwen3LayerWeights : DecoderLayerWeights {
  LinearWeight qkv_proj;            // [(nh + 2 nkv) hd, H]: q_proj | k_proj | v_proj rows
  Tensor q_proj, k_proj, v_proj;    // views of qkv_proj: [nh*hd, H], [nkv*hd, H], [nkv*hd, H]
  Buffer q_norm, k_norm;            // [hd] each, shared by the heads
  LinearWeight o_proj;              // [H, nh*hd]
};

struct Qwen3Weights : DecoderStackWeights {
  std::vector<Qwen3LayerWeights> layers;
};

// Checks that the config describes a model this build runs (dense Qwen3, full attention), then that
// every tensor the config implies is in `ckpt` with the right shape and a floating dtype, all before
// allocating or converting anything; then loads them converted to `dtype` on ctx's device.
// Every failure is a BadInput error naming the tensor (or the config field).
// quant: how config.json says the linears are stored and how this run executes them (docs/fp8.md).
Qwen3Weights load_qwen3_weights(Checkpoint& ckpt, const Qwen3Config& cfg, const Ctx& ctx, DType dtype,
                                const TargetQuantization& quant = TargetQuantization{});

// The config checks alone (also used before building anything that depends on the shapes).
void check_qwen3_target_config(const Qwen3Config& cfg, const std::string& source);

}  // namespace dflash
