#include "model/qwen35_weights.h"

#include <string>
#include <utility>
#include <vector>

#include "dflash/error.h"

namespace dflash {
namespace {

// The token mixer's tensors of layer L: the Gated DeltaNet's (linear_attn.*) or the gated full
// attention's (self_attn.*).
void mixer_specs(const Qwen35Config& cfg, Qwen35LayerWeights& L, const std::string& lp, std::vector<WeightSpec>& s) {
  const Qwen3Config& c = cfg.text;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, hd = c.head_dim;
  const int64_t q_dim = nh * hd, kv_dim = int64_t(c.num_key_value_heads) * hd;
  if (L.kind == Qwen35LayerKind::LinearAttention) {
    const ops::GdnHeads g = cfg.gdn_heads();
    const int64_t C = g.qkv_dim(), K = cfg.linear_conv_kernel_dim;
    Qwen35LinearAttnWeights& A = L.linear;
    const std::string ap = lp + "linear_attn.";
    s.push_back(linear_weight(ap + "in_proj_qkv.weight", {C, H}, &A.in_proj_qkv));
    s.push_back(linear_weight(ap + "in_proj_z.weight", {g.value_dim(), H}, &A.in_proj_z));
    // [nv, H] each, feeding beta's sigmoid and the decay's exp: --target-precision fp8 leaves them alone
    // (docs/fp8.md); a checkpoint that stores them FP8 still runs them FP8.
    WeightSpec b = linear_weight(ap + "in_proj_b.weight", {g.nv, H}, &A.in_proj_b);
    WeightSpec a = linear_weight(ap + "in_proj_a.weight", {g.nv, H}, &A.in_proj_a);
    b.quantize_on_load = a.quantize_on_load = false;
    s.push_back(b);
    s.push_back(a);
    WeightSpec conv = plain_weight(ap + "conv1d.weight", {C, K}, &A.conv1d);
    conv.ckpt_shape = {C, 1, K};
    s.push_back(conv);
    WeightSpec a_log = plain_weight(ap + "A_log", {g.nv}, &A.A_log);
    WeightSpec dt_bias = plain_weight(ap + "dt_bias", {g.nv}, &A.dt_bias);
    a_log.keep_f32 = dt_bias.keep_f32 = true;
    s.push_back(a_log);
    s.push_back(dt_bias);
    s.push_back(plain_weight(ap + "norm.weight", {g.dv}, &A.norm));
    s.push_back(linear_weight(ap + "out_proj.weight", {H, g.value_dim()}, &A.out_proj));
  } else {
    Qwen35FullAttnWeights& A = L.attn;
    const std::string ap = lp + "self_attn.";
    WeightSpec q = linear_weight(ap + "q_proj.weight", {q_dim, H}, &A.q_proj, LoadAs::SplitQueryGate);
    q.ckpt_shape = {2 * q_dim, H};
    q.dst2 = &A.gate_proj;
    q.linear2 = &A.gate_proj;
    q.heads = nh;
    q.head_dim = hd;
    s.push_back(q);
    s.push_back(linear_weight(ap + "k_proj.weight", {kv_dim, H}, &A.k_proj));
    s.push_back(linear_weight(ap + "v_proj.weight", {kv_dim, H}, &A.v_proj));
    s.push_back(linear_weight(ap + "o_proj.weight", {H, q_dim}, &A.o_proj));
    s.push_back(plain_weight(ap + "q_norm.weight", {hd}, &A.q_norm, LoadAs::ZeroCentred));
    s.push_back(plain_weight(ap + "k_norm.weight", {hd}, &A.k_norm, LoadAs::ZeroCentred));
  }
}

}  // namespace

Qwen35Weights load_qwen35_weights(Checkpoint& ckpt, const Qwen35Config& cfg, const Ctx& ctx, DType dtype,
                                  const TargetQuantization& quant) {
  check_no_layers_beyond_config(ckpt, cfg.text);
  Qwen35Weights w;
  w.layers.resize(cfg.text.num_hidden_layers);
  for (int l = 0; l < cfg.text.num_hidden_layers; ++l) w.layers[l].kind = cfg.kinds[l];
  const std::vector<DecoderLayerWeights*> shared = shared_layer_parts(w.layers);
  // The zero-centred norms (HF multiplies by 1 + w) are stored as 1 + w, so the forward runs plain RMSNorms.
  std::vector<WeightSpec> specs = decoder_weight_specs(
      cfg.text, w, shared, LoadAs::ZeroCentred,
      [&](int l, const std::string& lp, std::vector<WeightSpec>& s) { mixer_specs(cfg, w.layers[l], lp, s); });
  w.linear_modes = load_decoder_weights(ckpt, cfg.text, quant, std::move(specs), shared, ctx, dtype,
                       "the checkpoint does not match its config.json (Qwen3.5 hybrid layout)");
  return w;
}

}  // namespace dflash
