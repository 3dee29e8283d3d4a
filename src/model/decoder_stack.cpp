#include "model/decoder_stack.h"

#include <algorithm>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/fp8.h"
#include "dflash/ops.h"
#include "model/fp8_weights.h"

namespace dflash {
namespace {

// The first n elements of buffer b as a tensor of `shape` (n = its product).
Tensor view(const Buffer& b, std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  DF_ASSERT(static_cast<size_t>(n) <= b.numel());
  return b.t().reshape({static_cast<int64_t>(b.numel())}).slice_rows(0, n).reshape(shape);
}

Tensor rows_of(const Tensor& t, int64_t r0, int64_t r1) { return t.empty() ? Tensor() : t.slice_rows(r0, r1); }

bool per_token_gemm(const LinearWeight& W) {
  return W.mode == LinearMode::Fp8Gemm && W.gemm_scaling == ops::Fp8Scaling::TokenChannel;
}

}  // namespace

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
    pad_codes_.zero();
    pad_scales_.zero();
    pad_out_.zero();
    if (fp8_gemm_scaling(quant_) == ops::Fp8Scaling::TokenChannel) {
      mixer_input_ = NormOutput::ValuesAndCodes;
      fp8_x_codes_ = Buffer(d, DType::F8E4M3, {T * H});
      fp8_x_scales_ = Buffer(d, DType::F32, {T});
    }
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
  mixer_forward(layer, norm(in, L.input_layernorm, T, mixer_input_), in, dst, T, cu);
  // gate|up is the post-attention norm's one reader.
  const LinearInput x = norm(dst, L.post_attention_layernorm, T,
                             per_token_gemm(L.gate_up_proj) ? NormOutput::Codes : NormOutput::Values);
  const Tensor gu = rows(mlp_gate_up_, T);
  linear(gu, x, L.gate_up_proj);
  linear(dst, mlp_activation(gu, L.down_proj, T), L.down_proj, ops::Accumulate::Yes);
}

LinearInput DecoderStackTarget::norm(const Tensor& in, const Tensor& w, int64_t T, NormOutput output) {
  const Tensor x = rows(x_norm_, T);
  if (output == NormOutput::Values) {
    ops::rmsnorm_forward(ctx_, x, Tensor(), in, w, text_.rms_norm_eps);
    return x;
  }
  const int64_t H = x.size(1);
  const Tensor c = view(fp8_x_codes_, {T, H}), s = view(fp8_x_scales_, {T});
  const Tensor values = output == NormOutput::Codes && H <= ops::kRmsNormFp8CodesOnlyWidth ? Tensor() : x;
  ops::rmsnorm_fp8_forward(ctx_, values, c, s, in, w, text_.rms_norm_eps);
  return LinearInput(values, c, s);
}

LinearInput DecoderStackTarget::mlp_activation(const Tensor& gu, const LinearWeight& down, int64_t T) {
  const Tensor a = rows(mlp_act_, T);
  if (!per_token_gemm(down)) {
    ops::swiglu_fused_forward(ctx_, a, gu);
    return a;
  }
  // The GEMM reads only the codes: the bf16 activation is not written.
  const int64_t I = a.size(1);
  const Tensor c = view(fp8_act_codes_, {T, I}), s = view(fp8_act_scales_, {T});
  ops::swiglu_fp8_forward(ctx_, Tensor(), c, s, gu);
  return LinearInput(Tensor(), c, s);
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

void DecoderStackTarget::linear(const Tensor& out, const LinearInput& in, const LinearWeight& W,
                                ops::Accumulate acc) {
  if (W.mode == LinearMode::Fp8Gemm) return fp8_gemm(out, in, W, acc, Tensor());
  DF_ASSERT(!in.values.empty());
  ops::matmul_forward(ctx_, out, linear_input(in.values, W), linear_weight_values(W), acc);
}

void DecoderStackTarget::linear_residual(const Tensor& out, const LinearInput& in, const LinearWeight& W,
                                         const Tensor& residual) {
  if (W.mode == LinearMode::Fp8Gemm) return fp8_gemm(out, in, W, ops::Accumulate::No, residual);
  DF_ASSERT(!in.values.empty());
  ops::matmul_residual_forward(ctx_, out, linear_input(in.values, W), linear_weight_values(W), residual);
}

void DecoderStackTarget::fp8_gemm(const Tensor& out, const LinearInput& x, const LinearWeight& W,
                                  ops::Accumulate acc, const Tensor& residual) {
  if (W.gemm_scaling == ops::Fp8Scaling::TokenChannel) return fp8_token_gemm(out, x, W, acc, residual);
  const Tensor& in = x.values;
  DF_ASSERT(!in.empty());
  const int64_t T = in.size(0), K = in.size(1), O = W.fp8_codes.t().size(0);
  // Scales along K per row: ceil(K/128) (Block128).
  const int64_t KB = fp8::blocks(K, fp8::kBlock);
  const Tensor w_scales = W.fp8_scales.t().slice_rows(0, KB);
  DF_ASSERT(!fp8_act_codes_.t().empty() && static_cast<size_t>(T * K) <= fp8_act_codes_.numel() &&
            static_cast<size_t>(kGemmRows * O) <= pad_out_.numel());
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

void DecoderStackTarget::fp8_token_gemm(const Tensor& out, const LinearInput& x, const LinearWeight& W,
                                        ops::Accumulate acc, const Tensor& residual) {
  constexpr ops::Fp8Scaling kToken = ops::Fp8Scaling::TokenChannel;
  // The input's codes [T, K] and scales [T]: its producer's, or quantized here (o_proj's input).
  Tensor codes = x.codes, scales = x.scales;
  if (!x.quantized()) {
    DF_ASSERT(!x.values.empty() && !fp8_act_codes_.t().empty());
    codes = view(fp8_act_codes_, {x.values.size(0), x.values.size(1)});
    scales = view(fp8_act_scales_, {x.values.size(0)});
    ops::fp8_rows_quantize(ctx_, codes, scales, x.values);
  }
  const int64_t T = codes.size(0), K = codes.size(1), O = W.fp8_codes.t().size(0);
  // The weights' kb-major scales repeat each channel's over the groups: their first row is the [1, O] the
  // GEMM takes.
  const Tensor w_scales = W.fp8_scales.t().slice_rows(0, 1);
  DF_ASSERT(static_cast<size_t>(kGemmRows * O) <= pad_out_.numel());
  // As fp8_gemm: the first T - T % 16 tokens in place, the rest through the 16-row pad, whose codes and
  // scales are the input's last rows (a token's codes are its own: per-token quantization).
  const int64_t full = T / kGemmRows * kGemmRows, rest = T - full;
  if (full > 0)
    ops::fp8_gemm_forward(ctx_, out.slice_rows(0, full), codes.slice_rows(0, full),
                          scales.slice_rows(0, full).reshape({1, full}), W.fp8_codes, w_scales, acc,
                          rows_of(residual, 0, full), kToken);
  if (rest > 0) {
    // The pad's rows past `rest` hold what an earlier call left there (zeros at first): a GEMM's output row
    // depends only on its own input and C rows, so they never reach the rows copied out.
    const Tensor pcodes = view(pad_codes_, {kGemmRows, K}), pscales = view(pad_scales_, {kGemmRows});
    const Tensor pout = view(pad_out_, {kGemmRows, O});
    copy_tensor(ctx_, pcodes.slice_rows(0, rest), codes.slice_rows(full, T));
    copy_tensor(ctx_, pscales.slice_rows(0, rest), scales.slice_rows(full, T));
    const Tensor base = !residual.empty() ? residual : acc == ops::Accumulate::Yes ? out : Tensor();
    if (!base.empty()) copy_tensor(ctx_, pout.slice_rows(0, rest), base.slice_rows(full, T));
    ops::fp8_gemm_forward(ctx_, pout, pcodes, pscales.reshape({1, kGemmRows}), W.fp8_codes, w_scales,
                          base.empty() ? ops::Accumulate::No : ops::Accumulate::Yes, Tensor(), kToken);
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
