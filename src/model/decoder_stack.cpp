#include "model/decoder_stack.h"

#include <algorithm>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/ops.h"

namespace dflash {

DecoderStackTarget::DecoderStackTarget(const Ctx& ctx, const Qwen3Config& text, const TargetQuantization& quant,
                                       const std::string& dir, std::vector<int> capture_layers, int64_t max_tokens)
    : ctx_(ctx), act_(compute_dtype(ctx.device)), text_(text), quant_(quant), max_tokens_(max_tokens) {
  DF_CHECK(max_tokens > 0, BadOptions, "the target needs max_tokens > 0, got " << max_tokens);
  captures_ = plan_captures(capture_layers, text_.num_hidden_layers, dir);
  capture_layers_ = std::move(capture_layers);
}

void DecoderStackTarget::allocate_activations(int64_t widest_mixer_input,
                                              const std::function<void(ScratchViews& views)>& reserve_mixer) {
  const int64_t T = max_tokens_, H = text_.hidden_size, I = text_.intermediate_size;
  const Device d = ctx_.device;
  if (quant_.precision == TargetPrecision::Fp8) fp8_in_ = Buffer(d, act_, {T * std::max({H, I, widest_mixer_input})});
  for (Buffer& s : stream_) s = Buffer(d, act_, {T, H});
  x_norm_ = Buffer(d, act_, {T, H});
  ScratchViews views(T);
  reserve_mixer(views);
  views.new_phase();
  views.reserve(&mlp_gate_up_, act_, 2 * I);
  views.reserve(&mlp_act_, act_, I);
  work_ = Buffer(d, DType::U8, {static_cast<int64_t>(views.bytes())});
  views.bind(work_);
  inputs_ = DeviceBatch(d, T);
}

void DecoderStackTarget::layer_forward(int layer, const Tensor& in, const Tensor& dst, int64_t T, const Tensor& cu) {
  const DecoderLayerWeights& L = *layers_[static_cast<size_t>(layer)];
  const float eps = text_.rms_norm_eps;
  const Tensor x = rows(x_norm_, T);
  ops::rmsnorm_forward(ctx_, x, Tensor(), in, L.input_layernorm, eps);
  mixer_forward(layer, x, in, dst, T, cu);
  ops::rmsnorm_forward(ctx_, x, Tensor(), dst, L.post_attention_layernorm, eps);
  const Tensor gu = rows(mlp_gate_up_, T), a = rows(mlp_act_, T);
  linear(gu, x, L.gate_up_proj);
  ops::swiglu_fused_forward(ctx_, a, gu);
  linear(dst, a, L.down_proj, ops::Accumulate::Yes);
}

Tensor DecoderStackTarget::linear_input(const Tensor& in, const LinearWeight& W) {
  if (W.mode == LinearMode::Plain) return in;
  const int64_t T = in.size(0), K = in.size(1);
  DF_ASSERT(!fp8_in_.t().empty() && static_cast<size_t>(T * K) <= fp8_in_.numel());
  const Tensor q = fp8_in_.t().reshape({static_cast<int64_t>(fp8_in_.numel())}).slice_rows(0, T * K).reshape({T, K});
  ops::fp8_activation_qdq(ctx_, q, in, W.act_group == 0 ? K : W.act_group);
  return q;
}

void DecoderStackTarget::linear(const Tensor& out, const Tensor& in, const LinearWeight& W, ops::Accumulate acc) {
  ops::matmul_forward(ctx_, out, linear_input(in, W), W, acc);
}

void DecoderStackTarget::linear_residual(const Tensor& out, const Tensor& in, const LinearWeight& W,
                                         const Tensor& residual) {
  ops::matmul_residual_forward(ctx_, out, linear_input(in, W), W, residual);
}

void DecoderStackTarget::forward(const PackedBatch& batch, const CaptureOut& out) {
  DF_ASSERT(weights_ != nullptr && layers_.size() == static_cast<size_t>(text_.num_hidden_layers) &&
            !work_.t().empty());
  const int64_t T = batch.num_tokens(), H = text_.hidden_size;
  const int64_t k = static_cast<int64_t>(capture_layers_.size());

  const Tensor cu = inputs_.upload(ctx_, batch, text_.vocab_size);
  check_capture_out(out, k, T, H, act_, ctx_.device);

  ops::embedding_forward(ctx_, rows(stream_[0], T), rows(inputs_.tokens, T), weights_->embed_tokens);
  capture_stack_forward(ctx_, captures_, stream_, T, H, out, weights_->norm, text_.rms_norm_eps,
                        [&](int l, const Tensor& in, const Tensor& dst) { layer_forward(l, in, dst, T, cu); });
}

void DecoderStackTarget::lm_head_forward(const Tensor& logits, const Tensor& final_norm) {
  ops::matmul_forward(ctx_, logits, final_norm, weights_->lm_head_table());
}

}  // namespace dflash
