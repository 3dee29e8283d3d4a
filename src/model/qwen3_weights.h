// The frozen weights of a Qwen3 dense decoder stack (the target), loaded from an HF checkpoint.
#pragma once
#include <vector>

#include "dflash/hf_config.h"
#include "dflash/safetensors.h"
#include "dflash/tensor.h"

namespace dflash {

// One decoder layer, torch layout (Linear W [out, in]).
// The projections that read the same input are stored fused, so the forward runs one GEMM for each group
// (wider N: the [nkv*hd, H] k and v GEMMs alone are the least efficient of the layer): the checkpoint's
// q/k/v rows are loaded straight into row ranges of qkv_proj and gate/up into gate_up_proj. Rows of a
// row-major [out, in] matrix are contiguous, so each original projection stays available as a row-slice
// view of its fused buffer.
struct Qwen3LayerWeights {
  Buffer input_layernorm;           // [H]
  Buffer qkv_proj;                  // [(nh + 2 nkv) hd, H]: q_proj | k_proj | v_proj rows
  Tensor q_proj, k_proj, v_proj;    // views of qkv_proj: [nh*hd, H], [nkv*hd, H], [nkv*hd, H]
  Buffer q_norm, k_norm;            // [hd] each, shared by the heads
  Buffer o_proj;                    // [H, nh*hd]
  Buffer post_attention_layernorm;  // [H]
  Buffer gate_up_proj;              // [2I, H]: gate_proj | up_proj rows
  Tensor gate_proj, up_proj;        // views of gate_up_proj: [I, H] each
  Buffer down_proj;                 // [H, I]
};

struct Qwen3Weights {
  Buffer embed_tokens;  // [V, H]
  Buffer norm;          // [H] final RMSNorm
  Buffer lm_head;       // [V, H]; not allocated when tie_word_embeddings (embed_tokens is the head)
  std::vector<Qwen3LayerWeights> layers;
  const Tensor& lm_head_table() const { return lm_head.t().empty() ? embed_tokens.t() : lm_head.t(); }
};

// Checks that the config describes a model this build runs (dense Qwen3, full attention), then that
// every tensor the config implies is in `ckpt` with the right shape and a floating dtype, all before
// allocating or converting anything; then loads them converted to `dtype` on ctx's device.
// Every failure is a BadInput error naming the tensor (or the config field).
Qwen3Weights load_qwen3_weights(Checkpoint& ckpt, const Qwen3Config& cfg, const Ctx& ctx, DType dtype);

// The config checks alone (also used before building anything that depends on the shapes).
void check_qwen3_target_config(const Qwen3Config& cfg, const std::string& source);

// A checkpoint with decoder layers beyond config.json's num_hidden_layers (a tensor PREFIX.layers.N.* with
// N >= num_hidden_layers) describes another model than the one the config makes us run: fatal BadInput
// naming the tensor and the field. Shared by the Qwen3 and Qwen3.5/3.6 loaders.
void check_no_layers_beyond_config(const Checkpoint& ckpt, const Qwen3Config& cfg);

}  // namespace dflash
