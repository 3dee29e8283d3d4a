// config.json of a Qwen3.5 / Qwen3.6 hybrid target (HF Qwen3_5ForCausalLM, or the text model of
// Qwen3_5ForConditionalGeneration with its fields under text_config and its weights under
// model.language_model.): the Qwen3 fields parse_qwen3_config reads, plus the Gated DeltaNet head layout
// and the partial RoPE factor.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "dflash/hf_config.h"
#include "ops/gated_delta.h"

namespace dflash {

// What kind of token mixer a decoder layer of the hybrid has (config layer_types).
enum class Qwen35LayerKind : uint8_t { LinearAttention, FullAttention };

struct Qwen35Config {
  Qwen3Config text;  // sizes, eps, rope_theta, weight_prefix, layer_types (linear/full_attention)
  std::vector<Qwen35LayerKind> kinds;  // one per layer, from text.layer_types
  // Gated DeltaNet layers (HF defaults where the config is silent; every weight shape is checked later).
  int linear_conv_kernel_dim = 4;
  int linear_key_head_dim = 128;
  int linear_value_head_dim = 128;
  int linear_num_key_heads = 16;
  int linear_num_value_heads = 32;
  // Full-attention layers: RoPE rotates the first rotary_dim = int(head_dim * partial_rotary_factor) dims.
  float partial_rotary_factor = 0.25f;
  int rotary_dim = 0;

  ops::GdnHeads gdn_heads() const {
    return {linear_num_key_heads, linear_key_head_dim, linear_num_value_heads, linear_value_head_dim};
  }
};

// True for a Qwen3.5/3.6 hybrid config: architectures "Qwen3_5*", model_type "qwen3_5*", or any
// linear_attention layer, at the top level or under text_config.
bool is_qwen35_config(const nlohmann::json& j);
// The same for <dir>/config.json (false when it cannot be read: the dense loader reports that).
bool is_qwen35_checkpoint(const std::string& dir);

// Parses and checks (BadInput naming the file and field on anything this build cannot run).
Qwen35Config parse_qwen35_config(const nlohmann::json& j, const std::string& source);
Qwen35Config load_qwen35_config(const std::string& config_json_path);

}  // namespace dflash
