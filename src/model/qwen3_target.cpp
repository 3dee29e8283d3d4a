// The frozen dense Qwen3 target forward over a packed batch, written only in ops.h calls over Buffers so the
// same code runs on the CPU (float32) and CUDA (bf16) backends. The stack around each layer's attention --
// embedding, norms, MLP, captures, final norm -- is model/decoder_stack.h; the token mixer of layer l,
// with x = input_layernorm(in):
//   qkv = x [Wq; Wk; Wv]^T;  q,k = rope(head_rmsnorm(q,k)), v copied    (one GEMM, one pass: qkv_norm_rope)
//   dst = in + attention(q, k, v) Wo^T                                   (the add in o_proj's epilogue)
#include "model/qwen3_target.h"

#include <cmath>
#include <utility>

#include "dflash/ops.h"
#include "dflash/safetensors.h"
#include "model/decoder_stack.h"
#include "model/qwen3_weights.h"

namespace dflash {
namespace {

// cfg, once checked to describe a model this build runs (dense, full attention): before anything else.
const Qwen3Config& checked(const Qwen3Config& cfg, const std::string& dir) {
  check_qwen3_target_config(cfg, dir + "/config.json");
  return cfg;
}

class Qwen3Target final : public DecoderStackTarget {
 public:
  Qwen3Target(const Qwen3Config& cfg, const TargetQuantization& quant, const std::string& dir, const Ctx& ctx,
              std::vector<int> capture_layers, int64_t max_tokens)
      : DecoderStackTarget(ctx, checked(cfg, dir), quant, dir, std::move(capture_layers), max_tokens) {
    const Qwen3Config& c = text_;
    Checkpoint ckpt(dir);
    w_ = load_qwen3_weights(ckpt, c, ctx, act_, quant_);
    bind_weights(w_, w_.layers);

    const int64_t q_dim = int64_t(c.num_attention_heads) * c.head_dim;
    const int64_t kv_dim = int64_t(c.num_key_value_heads) * c.head_dim;
    // The attention's phase of the layer scratch, sized (nh + 2nkv) hd + nh hd + 2 (nh hd + nkv hd) values
    // per token against the MLP's 3I: the fused qkv output beside q/k/v costs little (on the 8B shape 36864
    // values per token for both phases against 34816 for separate q, k, v, attn, gate, up buffers).
    allocate_activations(q_dim, q_dim + 2 * kv_dim, [&](ScratchViews& views) {
      views.reserve(&qkv_, act_, q_dim + 2 * kv_dim);
      views.reserve(&q_, act_, q_dim);
      views.reserve(&k_, act_, kv_dim);
      views.reserve(&v_, act_, kv_dim);
      views.reserve(&attn_, act_, q_dim);
    });
  }

  TargetFamily family() const override { return TargetFamily::Qwen3; }

 private:
  void mixer_forward(int layer, const LinearInput& x, const Tensor& in, const Tensor& dst, int64_t T,
                     const Tensor& cu) override {
    const Qwen3LayerWeights& L = w_.layers[static_cast<size_t>(layer)];
    const Qwen3Config& c = text_;
    const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
    const ops::RopeSpec rope{c.rope_theta, static_cast<int>(hd)};
    const Tensor qkvt = rows(qkv_, T), qt = rows(q_, T), kt = rows(k_, T), vt = rows(v_, T), at = rows(attn_, T);
    linear(qkvt, x, L.qkv_proj);
    const Tensor q3 = qt.reshape({T, nh, hd}), k3 = kt.reshape({T, nkv, hd});
    ops::qkv_norm_rope_forward(ctx_, q3, k3, vt.reshape({T, nkv, hd}), qkvt, L.q_norm, L.k_norm, positions(T), rope,
                               c.rms_norm_eps);
    ops::attention_varlen_causal_forward(ctx_, at.reshape({T, nh, hd}), q3, k3, vt.reshape({T, nkv, hd}), cu,
                                         1.0f / std::sqrt(static_cast<float>(hd)));
    linear_residual(dst, at, L.o_proj, in);
  }

  Qwen3Weights w_;
  // The attention's activations, views of the layer scratch [max_tokens, ...]
  Tensor qkv_;         // [T, (nh + 2nkv) hd] the fused q|k|v GEMM's output
  Tensor q_, k_, v_;   // [T, nh*hd], [T, nkv*hd], [T, nkv*hd] its normed/rotated/copied heads
  Tensor attn_;        // [T, nh*hd]
};

}  // namespace

std::unique_ptr<TargetModel> make_qwen3_target(const Qwen3Config& cfg, const TargetQuantization& quant,
                                               const std::string& dir, const Ctx& ctx, std::vector<int> capture_layers,
                                               int64_t max_tokens) {
  return std::make_unique<Qwen3Target>(cfg, quant, dir, ctx, std::move(capture_layers), max_tokens);
}

}  // namespace dflash
