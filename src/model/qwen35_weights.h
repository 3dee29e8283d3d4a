// The frozen weights of a Qwen3.5 / Qwen3.6 hybrid text model, in the backend's dtype on its device (host
// float32 on the CPU, bf16 on CUDA); the decay parameters A_log and dt_bias stay float32 everywhere.
//
// Two rewrites happen at load time so the forward is plain op calls:
//   - zero-centred RMSNorm weights (input/post-attention layernorms, q_norm/k_norm, the final norm; HF
//     multiplies by 1 + w) are stored as 1 + w; the Gated DeltaNet output norm is a plain weight;
//   - the full-attention q_proj [nh * 2hd, H], per head [query (hd) | gate (hd)] rows, is split into
//     q_proj [nh*hd, H] and gate_proj [nh*hd, H].
// And the MLP's gate_proj and up_proj [I, H] are loaded into the two row halves of one gate_up_proj
// [2I, H], so the forward runs them as one GEMM (the originals stay available as row-slice views); the
// norms, the MLP and the loader are those of model/decoder_weights.h, shared with dense Qwen3.
#pragma once
#include <vector>

#include "dflash/safetensors.h"
#include "dflash/tensor.h"
#include "model/decoder_weights.h"
#include "model/qwen35_config.h"

namespace dflash {

// Gated DeltaNet token mixer (linear_attn.*), torch layout W [out, in].
struct Qwen35LinearAttnWeights {
  LinearWeight in_proj_qkv;  // [2*nk*dk + nv*dv, H]  q | k | v
  LinearWeight in_proj_z;    // [nv*dv, H]            output-norm gate
  LinearWeight in_proj_b;    // [nv, H]               beta logits
  LinearWeight in_proj_a;    // [nv, H]               decay input
  Buffer conv1d;       // [2*nk*dk + nv*dv, K]  depthwise causal conv (checkpoint [C, 1, K])
  Buffer A_log;        // [nv]
  Buffer dt_bias;      // [nv]
  Buffer norm;         // [dv]                  gated RMSNorm weight (plain)
  LinearWeight out_proj;     // [H, nv*dv]
};

// Gated full attention (self_attn.*).
struct Qwen35FullAttnWeights {
  LinearWeight q_proj, gate_proj;  // [nh*hd, H] each (split from the checkpoint's q_proj)
  LinearWeight k_proj, v_proj;     // [nkv*hd, H]
  LinearWeight o_proj;             // [H, nh*hd]
  Buffer q_norm, k_norm;     // [hd], stored as 1 + w
};

struct Qwen35LayerWeights : DecoderLayerWeights {
  Qwen35LayerKind kind = Qwen35LayerKind::FullAttention;
  Qwen35LinearAttnWeights linear;  // allocated for LinearAttention layers
  Qwen35FullAttnWeights attn;      // allocated for FullAttention layers
};

struct Qwen35Weights : DecoderStackWeights {
  std::vector<Qwen35LayerWeights> layers;
};

// Checks that every tensor the config implies is in `ckpt` with the right shape and a floating dtype,
// before allocating anything (BadInput naming the tensor), then loads them onto ctx's device as dtype.
// quant: how config.json says the linears are stored and how this run executes them (docs/fp8.md).
Qwen35Weights load_qwen35_weights(Checkpoint& ckpt, const Qwen35Config& cfg, const Ctx& ctx, DType dtype,
                                  const TargetQuantization& quant = TargetQuantization{});

}  // namespace dflash
