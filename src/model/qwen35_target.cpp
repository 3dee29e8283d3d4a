// The Qwen3.5 / Qwen3.6 hybrid target forward over a packed batch (HF Qwen3_5ForCausalLM / the text
// model of Qwen3_5ForConditionalGeneration), written only in op calls over Buffers, so the same code runs on
// the CPU (float32) and CUDA (bf16 activations; the delta rule's gates and state in float32) backends.
// The stack around each layer's token mixer -- embedding, norms (stored as 1 + w), MLP, captures, final
// norm -- is model/decoder_stack.h; the mixer of layer l, with x = input_layernorm(in):
//   linear_attention (Gated DeltaNet):
//     qkv = silu(causal_conv1d(x Wqkv^T));  z = x Wz^T;  g, beta = gates(x Wa^T, x Wb^T)
//     core = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta);  dst = in + gated_rmsnorm(core, z) Wout^T
//   full_attention (gated):
//     q, gate = x Wq^T, x Wgate^T;  k, v = x Wk^T, x Wv^T;  q, k = partial_rope(head_rmsnorm(q, k))
//     dst = in + (attention(q, k, v) * sigmoid(gate)) Wo^T
//   (the residual add in the output projection's epilogue).
#include "model/qwen35_target.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "dflash/ops.h"
#include "dflash/safetensors.h"
#include "model/decoder_stack.h"
#include "model/qwen35_weights.h"
#include "ops/gated_delta.h"

namespace dflash {
namespace {

class Qwen35Target final : public DecoderStackTarget {
 public:
  Qwen35Target(const Qwen35Config& cfg, const TargetQuantization& quant, const std::string& dir, const Ctx& ctx,
               std::vector<int> capture_layers, int64_t max_tokens)
      : DecoderStackTarget(ctx, cfg.text, quant, dir, std::move(capture_layers), max_tokens), cfg_(cfg) {
    const Qwen3Config& c = text_;
    Checkpoint ckpt(dir);
    w_ = load_qwen35_weights(ckpt, cfg_, ctx, act_, quant_);
    bind_weights(w_, w_.layers);

    bool any_linear = false, any_full = false;
    for (Qwen35LayerKind kind : cfg_.kinds) (kind == Qwen35LayerKind::LinearAttention ? any_linear : any_full) = true;
    // The mixers' per-token activations -- a Gated DeltaNet's, then a full attention's phase -- share the
    // layer scratch with the MLP's phase: a phase's views are dead once its output GEMM has run, so the
    // scratch is the largest phase (the MLP's 3I values per token on the 27B shape) rather than their sum.
    const int64_t widest_input = std::max(int64_t(c.num_attention_heads) * c.head_dim, cfg_.gdn_heads().value_dim());
    const int64_t widest_output = std::max(int64_t(c.num_attention_heads) * c.head_dim, cfg_.gdn_heads().qkv_dim());
    allocate_activations(widest_input, widest_output, [&](ScratchViews& views) {
      const int64_t T = max_tokens;
      const Device d = ctx.device;
      const DType act = act_, f32 = DType::F32;
      if (any_linear) {
        const ops::GdnHeads gh = cfg_.gdn_heads();
        for (Tensor* p : {&qkv_, &conv_}) views.reserve(p, act, gh.qkv_dim());
        for (Tensor* p : {&z_, &core_}) views.reserve(p, act, gh.value_dim());
        for (Tensor* p : {&a_, &b_}) views.reserve(p, act, gh.nv);
        for (Tensor* p : {&g_, &beta_}) views.reserve(p, f32, gh.nv);
        state_ = Buffer(d, f32, {gh.nv, gh.dk, gh.dv});
        if (d == Device::CUDA) gdn_work_ = Buffer(d, act, {ops::gated_delta_rule_workspace_elems(T, gh)});
      }
      if (any_full) {
        views.new_phase();
        const int64_t q_dim = int64_t(c.num_attention_heads) * c.head_dim;
        const int64_t kv_dim = int64_t(c.num_key_value_heads) * c.head_dim;
        for (Tensor* p : {&q_, &gate_, &attn_}) views.reserve(p, act, q_dim);
        for (Tensor* p : {&k_, &v_}) views.reserve(p, act, kv_dim);
      }
    });
  }

  TargetFamily family() const override { return TargetFamily::Qwen35Hybrid; }

 private:
  void mixer_forward(int layer, const LinearInput& x, const Tensor& in, const Tensor& dst, int64_t T,
                     const Tensor& cu) override {
    const Qwen35LayerWeights& L = w_.layers[static_cast<size_t>(layer)];
    if (L.kind == Qwen35LayerKind::LinearAttention) {
      linear_attn_forward(L.linear, x, in, dst, T, cu);
    } else {
      full_attn_forward(L.attn, x, in, dst, T, cu);
    }
  }

  void linear_attn_forward(const Qwen35LinearAttnWeights& A, const LinearInput& x, const Tensor& residual,
                           const Tensor& dst, int64_t T, const Tensor& cu) {
    const ops::GdnHeads gh = cfg_.gdn_heads();
    const Tensor qkv_t = rows(qkv_, T), conv_t = rows(conv_, T), z_t = rows(z_, T), core_t = rows(core_, T);
    const Tensor a_t = rows(a_, T), b_t = rows(b_, T), g_t = rows(g_, T), beta_t = rows(beta_, T);
    linear(qkv_t, x, A.in_proj_qkv);
    ops::causal_conv1d_silu_forward(ctx_, conv_t, qkv_t, A.conv1d, cu);
    linear(z_t, x, A.in_proj_z);
    linear(b_t, x, A.in_proj_b);
    linear(a_t, x, A.in_proj_a);
    ops::gdn_gates_forward(ctx_, g_t, beta_t, a_t, b_t, A.A_log, A.dt_bias);
    ops::gated_delta_rule_forward(ctx_, core_t, state_, conv_t, g_t, beta_t, cu, gh, gdn_work_.t());
    // The output norm runs per value head: rows of dv.
    const Tensor heads = core_t.reshape({T * gh.nv, gh.dv});
    ops::gated_rmsnorm_forward(ctx_, heads, heads, z_t.reshape({T * gh.nv, gh.dv}), A.norm, text_.rms_norm_eps);
    linear_residual(dst, core_t, A.out_proj, residual);
  }

  void full_attn_forward(const Qwen35FullAttnWeights& A, const LinearInput& x, const Tensor& residual,
                         const Tensor& dst, int64_t T, const Tensor& cu) {
    const Qwen3Config& c = text_;
    const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
    const ops::RopeSpec rope{c.rope_theta, cfg_.rotary_dim};
    const Tensor qt = rows(q_, T), gt = rows(gate_, T), kt = rows(k_, T), vt = rows(v_, T), at = rows(attn_, T);
    const Tensor pos = positions(T);
    linear(qt, x, A.q_proj);
    linear(gt, x, A.gate_proj);
    linear(kt, x, A.k_proj);
    linear(vt, x, A.v_proj);
    const Tensor q3 = qt.reshape({T, nh, hd}), k3 = kt.reshape({T, nkv, hd});
    ops::head_norm_rope_forward(ctx_, q3, Tensor(), q3, A.q_norm, pos, rope, c.rms_norm_eps);
    ops::head_norm_rope_forward(ctx_, k3, Tensor(), k3, A.k_norm, pos, rope, c.rms_norm_eps);
    ops::attention_varlen_causal_forward(ctx_, at.reshape({T, nh, hd}), q3, k3, vt.reshape({T, nkv, hd}), cu,
                                         1.0f / std::sqrt(static_cast<float>(hd)));
    ops::sigmoid_gate_forward(ctx_, at, at, gt);
    linear_residual(dst, at, A.o_proj, residual);
  }

  Qwen35Config cfg_;
  Qwen35Weights w_;
  // The mixers' activations, views of the layer scratch [max_tokens, ...] (and two buffers of their own).
  // Gated DeltaNet layers
  Tensor qkv_, conv_;     // [T, 2*nk*dk + nv*dv]
  Tensor z_, core_;       // [T, nv*dv]
  Tensor a_, b_;          // [T, nv] projections (activation dtype)
  Tensor g_, beta_;       // [T, nv] gates, float32
  Buffer state_;          // [nv, dk, dv] float32
  Buffer gdn_work_;       // CUDA: the delta rule's per-chunk UT inverses, bf16 [T * nv * 64] (none on the CPU)
  // Full-attention layers
  Tensor q_, gate_, attn_;  // [T, nh*hd]
  Tensor k_, v_;            // [T, nkv*hd]
};

}  // namespace

std::unique_ptr<TargetModel> make_qwen35_target(const Qwen35Config& cfg, const TargetQuantization& quant,
                                                const std::string& dir, const Ctx& ctx, std::vector<int> capture_layers,
                                                int64_t max_tokens) {
  return std::make_unique<Qwen35Target>(cfg, quant, dir, ctx, std::move(capture_layers), max_tokens);
}

}  // namespace dflash
