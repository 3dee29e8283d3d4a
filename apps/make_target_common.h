// What the two programs that write a made-up Qwen3 target (dflash-make-tiny: small and learnable,
// dflash-make-random: a real model's shape, for benchmarks) write the same way: the shape's config.json
// fields, the shape checks and the output directories. One config writer, so the two stay loadable by
// the same parser (src/io/hf_config.cpp).
#pragma once
#include <sys/stat.h>

#include <cerrno>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/error.h"

namespace dflash {

// A dense Qwen3 shape and the config fields that go with it.
struct Qwen3Shape {
  int vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int max_position_embeddings = 4096;
  double rope_theta = 1000000.0, rms_norm_eps = 1e-6;
  bool tied = false;
};

// The dense Qwen3 fields of config.json in the order HF writes them, up to layer_types (every layer full
// attention). The caller adds torch_dtype and its provenance; a hybrid overrides the fields it changes
// (an ordered_json keeps a reassigned key where it was).
inline nlohmann::ordered_json qwen3_config_json(const Qwen3Shape& s) {
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
  c["layer_types"] = std::vector<std::string>(static_cast<size_t>(s.layers), "full_attention");
  return c;
}

// The attention shape the target forward can run (BadOptions with `usage` otherwise).
inline void check_qwen3_shape(const Qwen3Shape& s, const char* usage) {
  DF_CHECK_HINT(s.heads % s.kv_heads == 0, BadOptions,
                "--heads " << s.heads << " must be a multiple of --kv-heads " << s.kv_heads, usage);
  DF_CHECK_HINT(s.head_dim % 2 == 0, BadOptions, "--head-dim must be even (RoPE rotates pairs)", usage);
}

// Creates d unless it exists.
inline void make_dir(const std::string& d) {
  DF_CHECK_HINT(::mkdir(d.c_str(), 0755) == 0 || errno == EEXIST, SystemFailure, "cannot create directory " << d,
                "check that the parent directory exists and is writable");
}

}  // namespace dflash
