#include "model/qwen3_weights.h"

#include <string>
#include <utility>
#include <vector>

#include "dflash/error.h"

namespace dflash {
namespace {

// The attention's tensors of one layer, q/k/v into row ranges of the fused qkv_proj.
void attention_specs(const Qwen3Config& c, Qwen3LayerWeights& L, const std::string& lp, std::vector<WeightSpec>& s) {
  const int64_t H = c.hidden_size;
  const int64_t q_dim = int64_t(c.num_attention_heads) * c.head_dim;
  const int64_t kv_dim = int64_t(c.num_key_value_heads) * c.head_dim;
  const int64_t qkv_rows = q_dim + 2 * kv_dim;
  s.push_back(fused_linear_part(lp + "self_attn.q_proj.weight", q_dim, H, &L.qkv_proj, 0, qkv_rows));
  s.push_back(fused_linear_part(lp + "self_attn.k_proj.weight", kv_dim, H, &L.qkv_proj, q_dim, qkv_rows));
  s.push_back(fused_linear_part(lp + "self_attn.v_proj.weight", kv_dim, H, &L.qkv_proj, q_dim + kv_dim, qkv_rows));
  s.push_back(linear_weight(lp + "self_attn.o_proj.weight", {H, q_dim}, &L.o_proj));
  s.push_back(plain_weight(lp + "self_attn.q_norm.weight", {c.head_dim}, &L.q_norm));
  s.push_back(plain_weight(lp + "self_attn.k_norm.weight", {c.head_dim}, &L.k_norm));
}

}  // namespace

void check_qwen3_target_config(const Qwen3Config& c, const std::string& source) {
  DF_CHECK_HINT(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0 &&
                    c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim > 0,
                BadInput, source << ": model sizes must all be positive", "check config.json");
  DF_CHECK_HINT(c.num_attention_heads % c.num_key_value_heads == 0, BadInput,
                source << ": num_attention_heads " << c.num_attention_heads << " is not a multiple of "
                       << "num_key_value_heads " << c.num_key_value_heads,
                "check config.json");
  DF_CHECK_HINT(c.head_dim % 2 == 0, BadInput, source << ": head_dim " << c.head_dim << " must be even for RoPE",
                "check config.json");
  for (size_t l = 0; l < c.layer_types.size(); ++l)
    DF_CHECK_HINT(c.layer_types[l] == "full_attention", BadInput,
                  source << ": layer " << l << " is " << c.layer_types[l]
                         << "; this build runs dense Qwen3 targets with full attention in every layer",
                  c.layer_types[l] == "linear_attention"
                      ? "Qwen3.5/3.6 hybrid targets (Gated DeltaNet layers) are not supported by this build"
                      : "sliding-window target layers are not supported by this build");
}

Qwen3Weights load_qwen3_weights(Checkpoint& ckpt, const Qwen3Config& cfg, const Ctx& ctx, DType dtype,
                                const TargetQuantization& quant) {
  check_qwen3_target_config(cfg, ckpt.dir() + "/config.json");
  check_no_layers_beyond_config(ckpt, cfg);
  Qwen3Weights w;
  w.layers.resize(cfg.num_hidden_layers);
  const std::vector<DecoderLayerWeights*> shared = shared_layer_parts(w.layers);
  std::vector<WeightSpec> specs =
      decoder_weight_specs(cfg, w, shared, LoadAs::Plain, [&](int l, const std::string& lp, std::vector<WeightSpec>& s) {
        attention_specs(cfg, w.layers[l], lp, s);
      });
  w.linear_modes =
      load_decoder_weights(ckpt, cfg, quant, std::move(specs), shared, ctx, dtype, "the checkpoint does not match its config.json");

  // The original projections as row slices of the fused buffer (the order attention_specs loads them in).
  const int64_t q_dim = int64_t(cfg.num_attention_heads) * cfg.head_dim;
  const int64_t kv_dim = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
  for (Qwen3LayerWeights& L : w.layers) {
    if (holds_fp8_codes(L.qkv_proj.mode)) continue;  // codes and scales only: no values buffer to view
    L.q_proj = L.qkv_proj.t().slice_rows(0, q_dim);
    L.k_proj = L.qkv_proj.t().slice_rows(q_dim, q_dim + kv_dim);
    L.v_proj = L.qkv_proj.t().slice_rows(q_dim + kv_dim, q_dim + 2 * kv_dim);
  }
  return w;
}

}  // namespace dflash
