// The decoder-stack target both Qwen families build on (as llama.cpp's llm_build_* share their blocks):
// everything of a target forward except the token mixer of each layer. A family
// (src/model/qwen3_target.cpp: attention in every layer; qwen35_target.cpp: Gated DeltaNet or gated
// attention by layer) loads its weights, reserves its mixer's activations and writes mixer_forward; the
// rest is here:
//
//   stream = embedding(tokens)
//   per decoder layer l, with input `in` and output buffer `dst` (a different buffer):
//     x   = input_layernorm(in)
//     dst = in + mixer_l(x)                        (the family's; the add in its output GEMM's epilogue)
//     x   = post_attention_layernorm(dst)
//     gu  = x [Wg; Wu]^T                           (one GEMM)
//     dst += (silu(gu[:, :I]) * gu[:, I:]) Wd^T    (an accumulating GEMM)
//   final_norm = norm(last layer's output)         (none: the layers after the last capture do not run)
//
// A captured layer's `dst` is its slot in CaptureOut.features, so captures cost no copy; the other layers
// alternate between two stream buffers (model/capture_stack.h). All activations are allocated once for
// max_tokens, in the constructor: the forward allocates nothing.
//
// Per-token FP8 GEMMs (compressed-tensors FP8-Dynamic, docs/fp8.md "Per-token activations, quantized
// once"): the norms write their output's e4m3 codes beside it (ops::rmsnorm_fp8_forward; the MLP's norm
// only the codes), and the SwiGLU only its codes when down_proj is such a GEMM (ops::swiglu_fp8_forward), so
// the linears that take x (q|k|v, gate|up, and a hybrid layer's several input projections) and down_proj
// run on codes quantized once (LinearInput); the other inputs (o_proj's) are quantized once per linear.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dflash/ops.h"
#include "dflash/target.h"
#include "dflash/tensor.h"
#include "model/capture_stack.h"
#include "model/decoder_weights.h"
#include "model/scratch_plan.h"

namespace dflash {

// The token mixers' per-token activations as views of the one allocation the phases of a layer share
// (model/scratch_plan.h): reserve() a view in the current phase, new_phase() for views that may overlap
// the earlier ones.
class ScratchViews {
 public:
  explicit ScratchViews(int64_t rows) : plan_(rows) {}
  void reserve(Tensor* view, DType dtype, int64_t cols) { views_.push_back({view, plan_.reserve(dtype, cols)}); }
  void new_phase() { plan_.new_phase(); }
  size_t bytes() const { return plan_.bytes(); }
  // Points every reserved view into work (a buffer of at least bytes()).
  void bind(const Buffer& work) const {
    for (const auto& [view, id] : views_) *view = plan_.view(work, id);
  }

 private:
  ScratchPlan plan_;
  std::vector<std::pair<Tensor*, int>> views_;
};

// A linear's input [T, K]: its values, and where a producer already wrote its per-token e4m3 codes [T, K]
// and scales [T] (ops::rmsnorm_fp8_forward, ops::swiglu_fp8_forward): every per-token FP8 GEMM taking it
// runs on those (ops::fp8_gemm_forward) instead of quantizing the values again. values is empty only where
// every linear that takes the input is such a GEMM (the stack's down_proj input).
struct LinearInput {
  LinearInput(const Tensor& v) : values(v) {}  // NOLINT(google-explicit-constructor): a plain input
  LinearInput(const Tensor& v, const Tensor& c, const Tensor& s) : values(v), codes(c), scales(s) {}
  bool quantized() const { return !codes.empty(); }
  Tensor values, codes, scales;
};

class DecoderStackTarget : public TargetModel {
 public:
  const Qwen3Config& config() const override { return text_; }
  const std::vector<int>& capture_layers() const override { return capture_layers_; }
  DType activation_dtype() const override { return act_; }
  void forward(const PackedBatch& batch, const CaptureOut& out) override;
  void lm_head_forward(const Tensor& logits, const Tensor& final_norm) override;
  Tensor embed_tokens() const override { return weights_->embed_tokens.t(); }
  Tensor lm_head() const override { return weights_->lm_head_table(); }
  int64_t fp8_gemm_calls() const override { return fp8_gemm_calls_; }
  int64_t fp8_dequant_calls() const override { return fp8_dequant_calls_; }

 protected:
  // text: the stack's sizes; quant: how its linears are stored and run (docs/fp8.md). Checks max_tokens
  // and plans the captures (BadOptions); allocates nothing.
  DecoderStackTarget(const Ctx& ctx, const Qwen3Config& text, const TargetQuantization& quant, const std::string& dir,
                     std::vector<int> capture_layers, int64_t max_tokens);

  // Once the family has loaded its weights (which must outlive this object and stay in place):
  // `layers` are its layers' shared parts.
  template <class LayerWeights>
  void bind_weights(const DecoderStackWeights& weights, std::vector<LayerWeights>& layers) {
    weights_ = &weights;
    const std::vector<DecoderLayerWeights*> parts = shared_layer_parts(layers);
    layers_.assign(parts.begin(), parts.end());
  }

  // Allocates the activations, once: the two stream buffers and x_norm; then reserve_mixer(views), where
  // the family reserves its token mixer's phases and allocates any buffer of its own; then the MLP's
  // phase, the one scratch allocation every phase's views share, and the device batch. widest_mixer_input /
  // widest_mixer_output: the most input / output features of the mixer's linears (an FP8 run quantizes each
  // linear's input into buffers of max(that, H, I) per token; an FP8 GEMM's last T % 16 tokens go through
  // a 16-row pad of max(that, 2I, H) outputs; Fp8Dequant linears share one weight scratch the size of the
  // largest of them, LinearModeCounts::fp8_dequant_largest).
  void allocate_activations(int64_t widest_mixer_input, int64_t widest_mixer_output,
                            const std::function<void(ScratchViews& views)>& reserve_mixer);

  // out [T, O] (+)= in [T, K] W^T, and out = residual + in W^T: a frozen linear, its input quantized to
  // e4m3 first when W runs FP8 (LinearMode::Fp8; Fp8Dequant: W's codes dequantized into the weight scratch
  // first), or the block-scaled FP8 GEMM (LinearMode::Fp8Gemm): docs/fp8.md.
  // A per-token FP8 GEMM's input with codes (LinearInput) runs on them.
  void linear(const Tensor& out, const LinearInput& in, const LinearWeight& W,
              ops::Accumulate acc = ops::Accumulate::No);
  void linear_residual(const Tensor& out, const LinearInput& in, const LinearWeight& W, const Tensor& residual);

  // dst = in + the token mixer of layer l over x = input_layernorm(in); x, in and dst hold T rows, cu the
  // packed batch's cu_seqlens. x carries its per-token codes where the target has per-token FP8 GEMMs. May
  // overwrite x's values (the stack normalises dst into it next).
  virtual void mixer_forward(int layer, const LinearInput& x, const Tensor& in, const Tensor& dst, int64_t T,
                             const Tensor& cu) = 0;

  // The first T rows of an activation buffer (or a view of one) allocated for max_tokens.
  static Tensor rows(const Tensor& b, int64_t T) { return b.slice_rows(0, T); }
  // The batch's positions (restarting at 0 per sequence) on the device, [T] I32.
  Tensor positions(int64_t T) const { return rows(inputs_.pos, T); }

  // ops::fp8_linear_forward's token count is a multiple of this on CUDA (cuBLASLt's FP8 GEMM).
  static constexpr int64_t kGemmRows = 16;

  Ctx ctx_;
  DType act_ = DType::F32;  // activations: float32 on the CPU, bf16 on CUDA
  Qwen3Config text_;
  TargetQuantization quant_;

 private:
  void layer_forward(int layer, const Tensor& in, const Tensor& dst, int64_t T, const Tensor& cu);
  // What a norm writes: its bf16 output x, x and x's per-token codes (per-token FP8 GEMMs take x, maybe other
  // readers too: the mixer's input), or only the codes (every reader is such a GEMM: the MLP's gate|up).
  enum class NormOutput : uint8_t { Values, ValuesAndCodes, Codes };
  // x = rmsnorm(in) * w (x: the first T rows of x_norm_), its codes into fp8_x_codes_ where asked.
  LinearInput norm(const Tensor& in, const Tensor& w, int64_t T, NormOutput output);
  // silu(gu[:, :I]) * gu[:, I:] for down_proj: its values in mlp_act_, or, when down_proj is a per-token FP8
  // GEMM, only its codes (in fp8_act_codes_).
  LinearInput mlp_activation(const Tensor& gu, const LinearWeight& down, int64_t T);
  // in itself for a Plain W; for an FP8 W, in quantized -> dequantized into fp8_in_.
  Tensor linear_input(const Tensor& in, const LinearWeight& W);
  // The values the GEMM multiplies by: W's buffer, or for an Fp8Dequant W its codes dequantized into
  // fp8_weight_ (valid until the next Fp8Dequant linear).
  Tensor linear_weight_values(const LinearWeight& W);
  // An Fp8Gemm W: out = base + in W^T, base = residual, out itself (acc Yes) or nothing. Per-token W: on
  // in's codes, or on codes quantized here (fp8_token_gemm).
  void fp8_gemm(const Tensor& out, const LinearInput& in, const LinearWeight& W, ops::Accumulate acc,
                const Tensor& residual);
  void fp8_token_gemm(const Tensor& out, const LinearInput& in, const LinearWeight& W, ops::Accumulate acc,
                      const Tensor& residual);

  std::vector<int> capture_layers_;
  CapturePlan captures_;
  int64_t max_tokens_ = 0;
  const DecoderStackWeights* weights_ = nullptr;
  std::vector<const DecoderLayerWeights*> layers_;

  Buffer stream_[2];    // [max_tokens, H] residual stream of the layers that are not captured
  Buffer x_norm_;       // [max_tokens, H]
  Buffer work_;         // the layer's phases' per-token activations (ScratchViews)
  Tensor mlp_gate_up_;  // [max_tokens, 2I] the fused gate|up GEMM's output   (the MLP's phase of work_)
  Tensor mlp_act_;      // [max_tokens, I] silu(gate) * up
  DeviceBatch inputs_;  // tokens, positions, cu_seqlens
  Buffer fp8_in_;       // Fp8 and Fp8Dequant linears: [max_tokens * widest linear input] their quantized input
  // Fp8Dequant linears: [largest one's out x in] its weight dequantized to the activations' dtype (one for
  // all: the linears run one at a time on the target's stream).
  Buffer fp8_weight_;
  // FP8 GEMMs (ops::fp8_linear_forward's scratch): the input's e4m3 codes [max_tokens * widest input] and
  // kb-major scales [widest input / 128 * max_tokens]; the 16-row pad of the last T % 16 tokens: its input
  // [16 * widest input] (bf16), codes, scales and output [16 * widest output].
  Buffer fp8_act_codes_, fp8_act_scales_;
  Buffer pad_in_, pad_codes_, pad_scales_, pad_out_;
  // Per-token FP8 GEMMs (NormOutput with codes): the norms' output codes [max_tokens * H] and scales
  // [max_tokens] (x's, apart from fp8_act_codes_: o_proj quantizes its input there while x's codes may
  // still have readers, a hybrid layer's input projections).
  Buffer fp8_x_codes_, fp8_x_scales_;
  NormOutput mixer_input_ = NormOutput::Values;  // ValuesAndCodes where the target has per-token FP8 GEMMs
  int64_t fp8_gemm_calls_ = 0, fp8_dequant_calls_ = 0;
};

}  // namespace dflash
