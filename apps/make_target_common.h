// What the two programs that write a made-up Qwen3 target (dflash-make-tiny: small and learnable,
// dflash-make-random: a real model's shape, for benchmarks) write the same way: the shape, its config.json
// fields, its tensor list (names, shapes, how each is initialised), the shape checks and the output
// directories. One config writer and one tensor list for the dense Qwen3 and the Qwen3.5/3.6 hybrid, so the
// two programs stay loadable by the same parser and loader (src/io/hf_config.cpp, src/model/qwen35_config.cpp,
// src/model/qwen3_weights.cpp, src/model/qwen35_weights.cpp); each program draws its own numbers.
#pragma once
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/error.h"

namespace dflash {

// A dense Qwen3 shape, or (hybrid) a Qwen3.5/3.6 one, and the config fields that go with it.
struct Qwen3Shape {
  int vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int max_position_embeddings = 4096;
  double rope_theta = 1000000.0, rms_norm_eps = 1e-6;
  bool tied = false;
  // The hybrid (Qwen3_5ForCausalLM, the text model of Qwen3.5/3.6): Gated DeltaNet layers ("linear_attention")
  // with every 4th layer a gated full attention (partial rotary: a quarter of head_dim), RMSNorm weights
  // stored zero-centred (HF multiplies by 1 + w).
  bool hybrid = false;
  int gdn_key_heads = 0, gdn_value_heads = 0, gdn_head_dim = 0, conv_kernel = 4;
  static constexpr int kFullAttentionInterval = 4;
  static constexpr double kPartialRotaryFactor = 0.25;
  static constexpr double kHybridRopeTheta = 10000000.0;
  bool full_attention(int layer) const { return !hybrid || (layer + 1) % kFullAttentionInterval == 0; }
  int gdn_layers() const {
    int n = 0;
    for (int l = 0; l < layers; ++l) n += !full_attention(l);
    return n;
  }
};

// config.json's fields in the order HF writes them, up to the hybrid's linear-attention fields. The caller
// adds torch_dtype and its provenance. The dense fields first (layer_types: every layer full attention);
// a hybrid overrides the ones it changes (an ordered_json keeps a reassigned key where it was) and adds its
// own, as HF's Qwen3_5TextConfig writes them (tests/data/golden/qwen35-tiny-a/target/config.json).
inline nlohmann::ordered_json target_config_json(const Qwen3Shape& s) {
  nlohmann::ordered_json c;
  c["architectures"] = {"Qwen3ForCausalLM"};
  c["model_type"] = "qwen3";
  c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["hidden_act"] = "silu";
  c["vocab_size"] = s.vocab;
  c["hidden_size"] = s.hidden;
  c["intermediate_size"] = s.intermediate;
  c["num_hidden_layers"] = s.layers;
  c["num_attention_heads"] = s.heads;
  c["num_key_value_heads"] = s.kv_heads;
  c["head_dim"] = s.head_dim;
  c["max_position_embeddings"] = s.max_position_embeddings;
  c["rms_norm_eps"] = s.rms_norm_eps;
  c["rope_theta"] = s.rope_theta;
  c["tie_word_embeddings"] = s.tied;
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  std::vector<std::string> kinds;
  for (int l = 0; l < s.layers; ++l) kinds.push_back(s.full_attention(l) ? "full_attention" : "linear_attention");
  c["layer_types"] = kinds;
  if (s.hybrid) {
    c["architectures"] = {"Qwen3_5ForCausalLM"};
    c["model_type"] = "qwen3_5_text";
    c["rope_theta"] = Qwen3Shape::kHybridRopeTheta;
    c["rope_parameters"] = {{"rope_type", "default"},
                            {"rope_theta", Qwen3Shape::kHybridRopeTheta},
                            {"partial_rotary_factor", Qwen3Shape::kPartialRotaryFactor}};
    c["partial_rotary_factor"] = Qwen3Shape::kPartialRotaryFactor;
    c["linear_conv_kernel_dim"] = s.conv_kernel;
    c["linear_key_head_dim"] = s.gdn_head_dim;
    c["linear_value_head_dim"] = s.gdn_head_dim;
    c["linear_num_key_heads"] = s.gdn_key_heads;
    c["linear_num_value_heads"] = s.gdn_value_heads;
    c.erase("use_sliding_window");
    c.erase("sliding_window");
  }
  return c;
}

// How a tensor of the checkpoint is initialised; each program draws the numbers its own way (dflash-make-tiny
// Gaussian from one sequential generator, dflash-make-random uniform of the same std from a counter).
enum class TensorInit {
  Normal,  // zero mean, std `scale` (embeddings, projections, the GDN conv)
  NearOne, // an RMSNorm weight: scale x (1 + 0.1 N), stored minus one when `zero_centred`
  ALog,    // GDN decay rate: log U(1, 16) (HF's initialisation)
  DtBias,  // GDN dt bias: softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] (HF's initialisation)
};

struct TargetTensor {
  std::string name;
  std::vector<int64_t> shape;
  TensorInit init = TensorInit::Normal;
  double scale = 1.0;         // Normal: the std; NearOne: the multiplier
  bool zero_centred = false;  // NearOne: stored as w - 1
  uint64_t numel() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

// The GDN dt bias for u uniform in [0, 1): softplus^-1 of dt = exp(log 1e-3 + u (log 1e-1 - log 1e-3)).
inline double gdn_dt_bias(double u) {
  const double dt = std::exp(std::log(1e-3) + u * (std::log(1e-1) - std::log(1e-3)));
  return dt + std::log(-std::expm1(-dt));
}
// The GDN A_log for u uniform in [0, 1): log U(1, 16).
inline double gdn_a_log(double u) { return std::log(1.0 + 15.0 * u); }

// Every tensor of the checkpoint, in the order written (HF's names and checkpoint shapes). Scales, and why:
// embeddings of unit size; projections 1/sqrt(fan_in), so a unit-RMS input gives unit-size outputs;
// attention (and GDN) outputs at 0.3 and MLP outputs at 0.5 of that, so no layer's update dominates the
// residual stream (a random forward stays finite over many layers); norms near one; model.norm's weight
// `final_norm_scale` (dflash-make-tiny peaks its target's distribution with ~4); lm_head unless tied. The
// hybrid's full-attention q_proj holds the query and its sigmoid output gate per head ([query (hd) |
// gate (hd)] rows per head: twice the rows); its Gated DeltaNet layers take HF's initialisation of the decay
// parameters (A_log, dt_bias above), and their gated output norm's weight is plain (not zero-centred).
inline std::vector<TargetTensor> target_tensors(const Qwen3Shape& s, double final_norm_scale = 1.0) {
  const int64_t V = s.vocab, H = s.hidden, I = s.intermediate;
  const int64_t qd = int64_t(s.heads) * s.head_dim, kvd = int64_t(s.kv_heads) * s.head_dim;
  const double in_h = 1.0 / std::sqrt(double(H)), in_q = 1.0 / std::sqrt(double(qd)), in_i = 1.0 / std::sqrt(double(I));
  std::vector<TargetTensor> w;
  auto normal = [&](const std::string& name, std::vector<int64_t> shape, double std) {
    w.push_back(TargetTensor{name, std::move(shape), TensorInit::Normal, std, false});
  };
  auto norm = [&](const std::string& name, int64_t n, double scale = 1.0) {
    w.push_back(TargetTensor{name, {n}, TensorInit::NearOne, scale, s.hybrid});
  };
  normal("model.embed_tokens.weight", {V, H}, 1.0);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    norm(p + "input_layernorm.weight", H);
    if (s.full_attention(l)) {
      normal(p + "self_attn.q_proj.weight", {s.hybrid ? 2 * qd : qd, H}, in_h);
      normal(p + "self_attn.k_proj.weight", {kvd, H}, in_h);
      normal(p + "self_attn.v_proj.weight", {kvd, H}, in_h);
      normal(p + "self_attn.o_proj.weight", {H, qd}, 0.3 * in_q);
      norm(p + "self_attn.q_norm.weight", s.head_dim);
      norm(p + "self_attn.k_norm.weight", s.head_dim);
    } else {
      const std::string a = p + "linear_attn.";
      const int64_t nk = s.gdn_key_heads, nv = s.gdn_value_heads, d = s.gdn_head_dim;
      const int64_t C = 2 * nk * d + nv * d, vd = nv * d;
      normal(a + "in_proj_qkv.weight", {C, H}, in_h);
      normal(a + "in_proj_z.weight", {vd, H}, in_h);
      normal(a + "in_proj_b.weight", {nv, H}, in_h);
      normal(a + "in_proj_a.weight", {nv, H}, in_h);
      normal(a + "conv1d.weight", {C, 1, s.conv_kernel}, 1.0 / std::sqrt(double(s.conv_kernel)));
      w.push_back(TargetTensor{a + "A_log", {nv}, TensorInit::ALog, 1.0, false});
      w.push_back(TargetTensor{a + "dt_bias", {nv}, TensorInit::DtBias, 1.0, false});
      w.push_back(TargetTensor{a + "norm.weight", {d}, TensorInit::NearOne, 1.0, false});
      normal(a + "out_proj.weight", {H, vd}, 0.3 * (1.0 / std::sqrt(double(vd))));
    }
    norm(p + "post_attention_layernorm.weight", H);
    normal(p + "mlp.gate_proj.weight", {I, H}, in_h);
    normal(p + "mlp.up_proj.weight", {I, H}, in_h);
    normal(p + "mlp.down_proj.weight", {H, I}, 0.5 * in_i);
  }
  norm("model.norm.weight", H, final_norm_scale);
  if (!s.tied) normal("lm_head.weight", {V, H}, in_h);
  return w;
}

// The shape the target forward can run (BadOptions with `usage` otherwise).
inline void check_qwen3_shape(const Qwen3Shape& s, const char* usage) {
  DF_CHECK_HINT(s.heads % s.kv_heads == 0, BadOptions,
                "--heads " << s.heads << " must be a multiple of --kv-heads " << s.kv_heads, usage);
  DF_CHECK_HINT(s.head_dim % 2 == 0, BadOptions, "--head-dim must be even (RoPE rotates pairs)", usage);
  if (!s.hybrid) return;
  DF_CHECK_HINT(s.head_dim % 8 == 0, BadOptions,
                "--head-dim " << s.head_dim << " must be a multiple of 8 for a hybrid (its partial RoPE rotates a "
                                               "quarter of head_dim, in pairs)",
                usage);
  DF_CHECK_HINT(s.gdn_key_heads >= 1 && s.gdn_value_heads % s.gdn_key_heads == 0, BadOptions,
                "the Gated DeltaNet's value heads (" << s.gdn_value_heads << ") must be a multiple of its key heads ("
                                                     << s.gdn_key_heads << ")",
                usage);
  DF_CHECK_HINT(s.gdn_head_dim >= 1 && s.conv_kernel >= 1, BadOptions,
                "the Gated DeltaNet's head dim and conv kernel must be positive", usage);
}

// Creates d unless it exists.
inline void make_dir(const std::string& d) {
  DF_CHECK_HINT(::mkdir(d.c_str(), 0755) == 0 || errno == EEXIST, SystemFailure, "cannot create directory " << d,
                "check that the parent directory exists and is writable");
}

}  // namespace dflash
