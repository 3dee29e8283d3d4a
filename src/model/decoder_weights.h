// The frozen weights both target families share -- the embedding, the final norm, the lm_head and, in every
// decoder layer, the two RMSNorms around the token mixer and the dense SwiGLU MLP -- and the one checkpoint
// loader they both use. A family's loader (src/model/qwen3_weights.cpp, qwen35_weights.cpp) lists only its
// token mixer's tensors and how each is rewritten at load time; the rest is here.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dflash/hf_config.h"
#include "dflash/ops.h"
#include "dflash/safetensors.h"
#include "dflash/target_quant.h"
#include "dflash/tensor.h"

namespace dflash {

// How a frozen linear projection of the target runs (docs/fp8.md).
enum class LinearMode : uint8_t {
  Plain,    // y = x W^T in the backend's dtype
  Fp8,      // W holds the FP8 weights' values; the input is quantized to e4m3 first (ops::fp8_activation_qdq),
            // then the GEMM in the backend's dtype: FP8's numerics, not its speed or memory
  Fp8Gemm,  // the buffer itself is empty; fp8_codes / fp8_scales hold the weights and ops::fp8_linear_forward
            // runs the FP8 GEMM: block-scaled (a CUDA device where ops::fp8_block_gemm_available) or per token x
            // per channel (compressed-tensors FP8-Dynamic, where ops::fp8_token_gemm_available)
  Fp8Dequant,  // the buffer itself is empty; fp8_codes / fp8_scales hold the weights (as Fp8Gemm's), and each
               // call dequantizes them (ops::fp8_weight_dequantize) into the target's one scratch, then runs
               // as Fp8: Fp8's numerics bit for bit at 1 byte a weight (GPUs without the block-scaled GEMM)
};

// Whether a linear of this mode holds its weights as e4m3 codes + kb-major scales (no values buffer).
inline bool holds_fp8_codes(LinearMode m) { return m == LinearMode::Fp8Gemm || m == LinearMode::Fp8Dequant; }

// DFLASH_FP8_LINEAR (docs/fp8.md "How a target's FP8 linears run"): which mode an FP8 target's linears may
// take, for tests and benchmarks. Auto (unset): Fp8Gemm where the device has the GEMM and the linear fits
// it, else Fp8Dequant on CUDA where the stored scales allow it, else Fp8. Gemm: as Auto, but a device
// without the GEMM is a fatal BadOptions. Dequant: Fp8Dequant where the stored scales allow it (the CPU
// backend too), else Fp8. Emulate: Fp8. Another value is a fatal BadOptions. Read at each load.
enum class Fp8LinearChoice : uint8_t { Auto, Gemm, Dequant, Emulate };
Fp8LinearChoice fp8_linear_choice();

// A frozen Linear W [out, in] (the buffer, in the backend's dtype) and how it runs.
struct LinearWeight : Buffer {
  LinearMode mode = LinearMode::Plain;
  int64_t act_group = 0;  // Fp8, Fp8Gemm, Fp8Dequant: input channels per activation scale (0: one per token)
  ops::Fp8Scaling gemm_scaling = ops::Fp8Scaling::Block128;  // Fp8Gemm: which FP8 GEMM (fp8_gemm_scaling)
  Buffer fp8_codes;       // Fp8Gemm, Fp8Dequant: [out, in] F8E4M3
  Buffer fp8_scales;      // Fp8Gemm, Fp8Dequant: [ceil(in/128), out] F32, kb-major (ops::fp8_linear_forward's w_scales)
};

// How many of a target's linear projections run each way (load_decoder_weights counts them).
struct LinearModeCounts {
  int64_t plain = 0, fp8_emulated = 0, fp8_gemm = 0, fp8_dequant = 0;
  int64_t fp8_dequant_largest = 0;  // weights (out x in) of the largest Fp8Dequant linear: the target's one
                                    // dequantize scratch holds that many values
  // Checkpoint tensors of an FP8 checkpoint's linears: stored F8_E4M3, and stored in a float dtype though
  // the config's not-converted list does not name them (they run as stored).
  int64_t stored_fp8 = 0, stored_float_unlisted = 0;
};

// The parts of a decoder layer outside its token mixer, torch layout (Linear W [out, in]). The MLP's
// gate_proj and up_proj [I, H] are loaded into the two row halves of one gate_up_proj [2I, H], so the
// forward runs them as one GEMM; rows of a row-major [out, in] matrix are contiguous, so each stays
// available as a row-slice view of the fused buffer.
struct DecoderLayerWeights {
  Buffer input_layernorm;           // [H] (Qwen3.5/3.6: stored as 1 + w)
  Buffer post_attention_layernorm;  // [H] (Qwen3.5/3.6: stored as 1 + w)
  LinearWeight gate_up_proj;        // [2I, H]: gate_proj | up_proj rows
  Tensor gate_proj, up_proj;        // views of gate_up_proj: [I, H] each
  LinearWeight down_proj;           // [H, I]
};

// The parts of a decoder stack outside its layers.
struct DecoderStackWeights {
  LinearModeCounts linear_modes;  // what load_decoder_weights decided
  Buffer embed_tokens;  // [V, H]
  Buffer norm;          // [H] final RMSNorm (Qwen3.5/3.6: stored as 1 + w)
  Buffer lm_head;       // [V, H]; not allocated when tie_word_embeddings (embed_tokens is the head)
  const Tensor& lm_head_table() const { return lm_head.t().empty() ? embed_tokens.t() : lm_head.t(); }
};

// How a checkpoint tensor becomes the buffer(s) the forward uses.
enum class LoadAs : uint8_t {
  Plain,           // as stored
  ZeroCentred,     // 1 + w (HF Qwen3_5RMSNorm multiplies by 1 + w)
  SplitQueryGate,  // Qwen3.5 q_proj [nh * 2hd, H], per head [query (hd) | gate (hd)] rows -> dst (query rows),
                   // dst2 (gate rows), [nh*hd, H] each
};

struct WeightSpec {
  std::string name;
  std::vector<int64_t> ckpt_shape;  // as stored (Qwen3.5's conv1d is [C, 1, K])
  std::vector<int64_t> buf_shape;   // as used (1-d or 2-d)
  Buffer* dst = nullptr;
  LoadAs how = LoadAs::Plain;
  Buffer* dst2 = nullptr;           // SplitQueryGate
  int64_t heads = 0, head_dim = 0;  // SplitQueryGate
  bool keep_f32 = false;            // float32 on every backend (Qwen3.5's decay parameters: they feed exp)
  // A part of a fused projection (Plain only): the tensor goes to rows [row0, row0 + buf_shape[0]) of *dst,
  // which holds fused_rows rows in all (allocated by whichever part loads first). fused_rows = 0: dst is
  // the tensor.
  int64_t row0 = 0, fused_rows = 0;
  // A linear projection (dst, and dst2 for SplitQueryGate, are these LinearWeights): it may be stored FP8
  // (F8_E4M3 + its scale tensor) and may run FP8. quantize_on_load: --target-precision fp8 on a bf16
  // checkpoint quantizes it (docs/fp8.md says which ones it leaves alone).
  LinearWeight* linear = nullptr;
  LinearWeight* linear2 = nullptr;
  bool quantize_on_load = true;
  // Decided by load_decoder_weights' checks: stored as F8_E4M3; runs FP8; the LinearMode its LinearWeight(s)
  // get (Plain unless runs_fp8).
  bool stored_fp8 = false, runs_fp8 = false;
  // Stored in a float dtype in an FP8 checkpoint whose config's list does not name it (plan_linear).
  bool stored_float_unlisted = false;
  LinearMode mode = LinearMode::Plain;
};

// A tensor loaded as stored, into its own buffer of the checkpoint's shape.
WeightSpec plain_weight(std::string name, std::vector<int64_t> shape, Buffer* dst, LoadAs how = LoadAs::Plain);
// A [rows, H] tensor loaded as stored into rows [row0, row0 + rows) of a fused [fused_rows, H] buffer.
WeightSpec fused_part(std::string name, int64_t rows, int64_t H, Buffer* dst, int64_t row0, int64_t fused_rows);
// The same for linear projections (the spec's `linear` set).
WeightSpec linear_weight(std::string name, std::vector<int64_t> shape, LinearWeight* dst, LoadAs how = LoadAs::Plain);
WeightSpec fused_linear_part(std::string name, int64_t rows, int64_t H, LinearWeight* dst, int64_t row0,
                             int64_t fused_rows);

// The tensors of a decoder stack in checkpoint order: embed_tokens; per layer input_layernorm, the token
// mixer's (mixer_specs(l, "PREFIX.layers.l.", specs) appends them), post_attention_layernorm, gate_proj,
// up_proj, down_proj; then the final norm and, unless tied, lm_head. The three norms load as `norms`.
// layers[l] receives layer l's shared weights.
using MixerSpecs = std::function<void(int layer, const std::string& layer_prefix, std::vector<WeightSpec>& specs)>;
std::vector<WeightSpec> decoder_weight_specs(const Qwen3Config& c, DecoderStackWeights& w,
                                             const std::vector<DecoderLayerWeights*>& layers, LoadAs norms,
                                             const MixerSpecs& mixer_specs);

// Loads `specs` from ckpt onto ctx's device as dtype (float32 where keep_f32): every tensor checked present with its checkpoint shape and a floating
// dtype (BadInput naming it, with `mismatch_hint`) and the config's dtype label, all before any allocation;
// a linear may instead be F8_E4M3 with its scale tensor, as `quant` (config.json) says, and is then
// dequantized on load; a linear that runs FP8 (quant.precision) is marked LinearMode::Fp8, and one stored
// in bf16 that --target-precision fp8 converts holds its quantize -> dequantize values (docs/fp8.md);
// then shard by shard, each shard's mapping released once its last tensor is in place (a large checkpoint
// is never mapped whole). A host float32 Plain tensor is read straight into its buffer; every other one
// goes through one host float32 staging buffer, where the load-time rewrites happen, converted to the
// device dtype on the way. Finally each layer's gate_proj/up_proj views of its gate_up_proj.
// On a device where ops::fp8_block_gemm_available, a linear that runs FP8 with activation groups of 128 and
// a shape the GEMM takes (in % 128 == 0, out % 16 == 0; a fused projection's parts all of them) keeps its
// e4m3 codes and kb-major scales on the device instead (LinearMode::Fp8Gemm, no values buffer): 1 byte a
// weight. On any other CUDA device (and where the GEMM does not fit), a linear whose stored scales are per
// output row per 128 input channels keeps the same codes and scales and dequantizes them per call
// (LinearMode::Fp8Dequant). fp8_linear_choice() may narrow the choice. Returns how many linears run each way.
LinearModeCounts load_decoder_weights(Checkpoint& ckpt, const Qwen3Config& c, const TargetQuantization& quant,
                          std::vector<WeightSpec> specs, const std::vector<DecoderLayerWeights*>& layers,
                          const Ctx& ctx, DType dtype, const char* mismatch_hint);

// Pointers to the shared part of each layer of a family's layer vector.
template <class LayerWeights>
std::vector<DecoderLayerWeights*> shared_layer_parts(std::vector<LayerWeights>& layers) {
  std::vector<DecoderLayerWeights*> p;
  for (LayerWeights& L : layers) p.push_back(&L);
  return p;
}

// A checkpoint with decoder layers beyond config.json's num_hidden_layers (a tensor PREFIX.layers.N.* with
// N >= num_hidden_layers) describes another model than the one the config makes us run: fatal BadInput
// naming the tensor and the field. Both families' loaders run it first.
void check_no_layers_beyond_config(const Checkpoint& ckpt, const Qwen3Config& cfg);

}  // namespace dflash
