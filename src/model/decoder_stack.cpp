#include "model/decoder_stack.h"

#include <algorithm>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/fp8.h"
#include "dflash/ops.h"

namespace dflash {

DecoderStackTarget::DecoderStackTarget(const Ctx& ctx, const Qwen3Config& text, const TargetQuantization& quant,
                                       const std::string& dir, std::vector<int> capture_layers, int64_t max_tokens)
    : ctx_(ctx), act_(compute_dtype(ctx.device)), text_(text), quant_(quant), max_tokens_(max_tokens) {
  DF_CHECK(max_tokens > 0, BadOptions, "the target needs max_tokens > 0, got " << max_tokens);
  captures_ = plan_captures(capture_layers, text_.num_hidden_layers, dir);
  capture_layers_ = std::move(capture_layers);
}

void DecoderStackTarget::allocate_activations(int64_t widest_mixer_input, int64_t widest_mixer_output,
                                              const std::function<void(ScratchViews& views)>& reserve_mixer) {
  const int64_t T = max_tokens_, H = text_.hidden_size, I = text_.intermediate_size;
  const Device d = ctx_.device;
  const int64_t K = std::max({H, I, widest_mixer_input}), O = std::max({2 * I, H, widest_mixer_output});
  DF_ASSERT(weights_ != nullptr);
  const LinearModeCounts& modes = weights_->linear_modes;
  if (modes.fp8_emulated > 0 || modes.fp8_dequant > 0) fp8_in_ = Buffer(d, act_, {T * K});
  if (modes.fp8_dequant > 0) fp8_weight_ = Buffer(d, act_, {modes.fp8_dequant_largest});
  if (modes.fp8_gemm > 0) {
    const int64_t KB = fp8::blocks(K, fp8::kBlock);
    fp8_act_codes_ = Buffer(d, DType::F8E4M3, {T * K});
    fp8_act_scales_ = Buffer(d, DType::F32, {KB * T});
    pad_in_ = Buffer(d, act_, {kGemmRows * K});
    pad_codes_ = Buffer(d, DType::F8E4M3, {kGemmRows * K});
    pad_scales_ = Buffer(d, DType::F32, {KB * kGemmRows});
    pad_out_ = Buffer(d, act_, {kGemmRows * O});
    pad_in_.zero();  // the pad's rows past T % 16 are never copied out; zeros keep them finite
    pad_out_.zero();
  }
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

Tensor DecoderStackTarget::linear_weight_values(const LinearWeight& W) {
  if (W.mode != LinearMode::Fp8Dequant) return W.t();
  const int64_t O = W.fp8_codes.t().size(0), K = W.fp8_codes.t().size(1);
  DF_ASSERT(static_cast<size_t>(O * K) <= fp8_weight_.numel());
  const Tensor w = fp8_weight_.t().slice_rows(0, O * K).reshape({O, K});
  ops::fp8_weight_dequantize(ctx_, w, W.fp8_codes, W.fp8_scales);
  ++fp8_dequant_calls_;
  return w;
}

void DecoderStackTarget::linear(const Tensor& out, const Tensor& in, const LinearWeight& W, ops::Accumulate acc) {
  if (W.mode == LinearMode::Fp8Gemm) return fp8_gemm(out, in, W, acc, Tensor());
  ops::matmul_forward(ctx_, out, linear_input(in, W), linear_weight_values(W), acc);
}

void DecoderStackTarget::linear_residual(const Tensor& out, const Tensor& in, const LinearWeight& W,
                                         const Tensor& residual) {
  if (W.mode == LinearMode::Fp8Gemm) return fp8_gemm(out, in, W, ops::Accumulate::No, residual);
  ops::matmul_residual_forward(ctx_, out, linear_input(in, W), linear_weight_values(W), residual);
}

void DecoderStackTarget::fp8_gemm(const Tensor& out, const Tensor& in, const LinearWeight& W, ops::Accumulate acc,
                                  const Tensor& residual) {
  const int64_t T = in.size(0), K = in.size(1), O = W.fp8_codes.t().size(0);
  // Scales along K per row: ceil(K/128) (Block128), or one (TokenChannel: the weights' kb-major scales repeat
  // each channel's over the groups, so their first row is the [1, O] the GEMM takes).
  const bool per_token = W.gemm_scaling == ops::Fp8Scaling::TokenChannel;
  const int64_t KB = per_token ? 1 : fp8::blocks(K, fp8::kBlock);
  const Tensor w_scales = W.fp8_scales.t().slice_rows(0, KB);
  DF_ASSERT(!fp8_act_codes_.t().empty() && static_cast<size_t>(T * K) <= fp8_act_codes_.numel() &&
            static_cast<size_t>(kGemmRows * O) <= pad_out_.numel());
  auto view = [](const Buffer& b, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return b.t().reshape({static_cast<int64_t>(b.numel())}).slice_rows(0, n).reshape(shape);
  };
  auto rows_of = [](const Tensor& t, int64_t r0, int64_t r1) { return t.empty() ? Tensor() : t.slice_rows(r0, r1); };
  // cuBLASLt's FP8 GEMM takes token counts in multiples of 16 (kernels/fp8_linear.cu): the first
  // T - T % 16 tokens run in place, the rest through a 16-row pad.
  const int64_t full = T / kGemmRows * kGemmRows, rest = T - full;
  if (full > 0)
    ops::fp8_linear_forward(ctx_, out.slice_rows(0, full), in.slice_rows(0, full), W.fp8_codes, w_scales,
                            view(fp8_act_codes_, {full, K}), view(fp8_act_scales_, {KB, full}), acc,
                            rows_of(residual, 0, full), W.gemm_scaling);
  if (rest > 0) {
    // The pad's rows past `rest` hold what an earlier call left there (zeros at first): a GEMM's output row
    // depends only on its own input and C rows, so they never reach the rows copied out.
    const Tensor pin = view(pad_in_, {kGemmRows, K}), pout = view(pad_out_, {kGemmRows, O});
    copy_tensor(ctx_, pin.slice_rows(0, rest), in.slice_rows(full, T));
    const Tensor base = !residual.empty() ? residual : acc == ops::Accumulate::Yes ? out : Tensor();
    if (!base.empty()) copy_tensor(ctx_, pout.slice_rows(0, rest), base.slice_rows(full, T));
    ops::fp8_linear_forward(ctx_, pout, pin, W.fp8_codes, w_scales, view(pad_codes_, {kGemmRows, K}),
                            view(pad_scales_, {KB, kGemmRows}),
                            base.empty() ? ops::Accumulate::No : ops::Accumulate::Yes, Tensor(), W.gemm_scaling);
    copy_tensor(ctx_, out.slice_rows(full, T), pout.slice_rows(0, rest));
  }
  ++fp8_gemm_calls_;
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
