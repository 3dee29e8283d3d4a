// Parsing of the Qwen3.5 / Qwen3.6 / Qwen3.8 hybrid config (Qwen3.8-27B has Qwen3.6-27B's architecture
// and keys). The Qwen3 fields (and the VLM nesting under text_config) come from parse_qwen3_config; this
// adds what only the hybrid has and refuses what this build does not run (MoE variants, sliding-window
// layers, an attention without its output gate, a non-silu linear-attention gate, a multimodal RoPE
// that is not plain RoPE on text). Keys that do not change the text forward are ignored: the vision tower
// (vision_config, image/video token ids), the multi-token-prediction head (mtp_num_hidden_layers,
// mtp_use_dedicated_embeddings: its mtp.* tensors are not read), mamba_ssm_dtype (the recurrent state is
// float32 here), language_model_only, use_cache, dtype.
#include "model/qwen35_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "dflash/error.h"
#include "io/json_file.h"

namespace dflash {
namespace {

using nlohmann::json;

const char* const kHint = "fix config.json, or point at the right checkpoint directory";

bool starts_with(const json& j, const char* key, const std::string& prefix) {
  return j.contains(key) && j[key].is_string() && j[key].get<std::string>().rfind(prefix, 0) == 0;
}

bool contains_text(const json& j, const char* key, const std::string& needle) {
  return j.contains(key) && j[key].is_string() && j[key].get<std::string>().find(needle) != std::string::npos;
}

bool is_qwen35_object(const json& j) {
  if (!j.is_object()) return false;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"])
      if (a.is_string() && a.get<std::string>().rfind("Qwen3_5", 0) == 0) return true;
  if (starts_with(j, "model_type", "qwen3_5")) return true;
  if (j.contains("layer_types") && j["layer_types"].is_array())
    for (const json& t : j["layer_types"])
      if (t == "linear_attention") return true;
  return false;
}

// An optional positive integer field (HF's default when absent).
int optional_positive_int(const json& j, const std::string& key, int dflt, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  const json& v = j[key];
  const bool ok = v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
  DF_CHECK_HINT(ok && v.get<double>() >= 1 && v.get<double>() <= 1 << 20, BadInput,
                "field '" << where << key << "' must be a positive integer, got " << v.dump(), kHint);
  return static_cast<int>(v.get<double>());
}

// Qwen3.8 (and the Qwen3.6 releases) describe multimodal RoPE: rope_parameters.mrope_section splits the
// rotary_dim / 2 frequencies among the (temporal, height, width) position ids, interleaved or in blocks.
// For text every token's three ids are its one position, so each frequency turns by that position and the
// rotation is plain partial RoPE, which this build runs. A section that does not cover the rotary
// frequencies describes some other rotation: refused.
void check_mrope(const json& j, const std::string& where, const std::string& source, int rotary_dim) {
  if (!j.contains("rope_parameters") || !j["rope_parameters"].is_object()) return;
  const json& rp = j["rope_parameters"];
  if (rp.contains("mrope_interleaved") && !rp["mrope_interleaved"].is_null())
    DF_CHECK_HINT(rp["mrope_interleaved"].is_boolean(), BadInput,
                  source << ": field '" << where << "rope_parameters.mrope_interleaved' must be true or false, got "
                         << rp["mrope_interleaved"].dump(),
                  kHint);
  if (!rp.contains("mrope_section") || rp["mrope_section"].is_null()) return;
  const json& sec = rp["mrope_section"];
  long long sum = 0;
  bool ok = sec.is_array() && !sec.empty();
  for (const json& v : sec) {
    ok = ok && v.is_number_integer() && v.get<long long>() >= 0;
    if (ok) sum += v.get<long long>();
  }
  DF_CHECK_HINT(ok && sum == rotary_dim / 2, BadInput,
                source << ": field '" << where << "rope_parameters.mrope_section' is " << sec.dump()
                       << "; its sections must be whole numbers adding up to rotary_dim / 2 = " << rotary_dim / 2
                       << " (head_dim x partial_rotary_factor / 2)",
                kHint);
}

// The Gated DeltaNet output gate, norm(o) * act(z): silu in Qwen3.5/3.6/3.8 ("swish" is the same function;
// vLLM reads output_gate_type with silu as its default). A sigmoid gate is other math: refused.
void check_output_gate(const json& j, const std::string& where, const std::string& source) {
  if (!j.contains("output_gate_type")) return;
  const json& v = j["output_gate_type"];
  DF_CHECK_HINT(v == "silu" || v == "swish", BadInput,
                source << ": field '" << where << "output_gate_type' is " << v.dump()
                       << "; this build's Gated DeltaNet layers gate their output with silu (\"silu\" or \"swish\")",
                "a sigmoid-gated (or other) linear-attention output is not implemented; use a Qwen3.5/3.6/3.8 "
                "checkpoint, whose config says \"swish\" or nothing");
}

}  // namespace

bool is_qwen35_config(const json& j) {
  return is_qwen35_object(j) || (j.is_object() && j.contains("text_config") && is_qwen35_object(j["text_config"]));
}

bool is_qwen35_checkpoint(const std::string& dir) {
  const JsonFile f = try_read_json_file(dir + "/config.json");
  return f.ok() && is_qwen35_config(f.value);
}

Qwen35Config parse_qwen35_config(const json& root, const std::string& source) {
  Qwen35Config c;
  c.text = parse_qwen3_config(root, source);  // fatal BadInput on the shared fields
  const bool nested = root.contains("text_config") && root["text_config"].is_object();
  const json& j = nested ? root["text_config"] : root;
  const std::string where = nested ? "text_config." : "";

  for (const json* o : {&root, &j})
    DF_CHECK_HINT(!contains_text(*o, "model_type", "moe"), BadInput,
                  source << ": model_type " << (*o)["model_type"].dump()
                         << " is a mixture-of-experts Qwen3.5/3.6; this build runs the dense hybrids only",
                  "use a dense Qwen3.5/3.6 target (e.g. Qwen3.5-27B)");
  if (j.contains("hidden_act") && !j["hidden_act"].is_null())
    DF_CHECK_HINT(j["hidden_act"] == "silu", BadInput,
                  source << ": field '" << where << "hidden_act' is " << j["hidden_act"].dump()
                         << "; the Qwen3.5 hybrid uses silu",
                  kHint);
  if (j.contains("attn_output_gate") && !j["attn_output_gate"].is_null())
    DF_CHECK_HINT(j["attn_output_gate"] == true, BadInput,
                  source << ": field '" << where << "attn_output_gate' is " << j["attn_output_gate"].dump()
                         << "; Qwen3.5 full-attention layers always have their sigmoid output gate",
                  kHint);

  c.linear_conv_kernel_dim = optional_positive_int(j, "linear_conv_kernel_dim", c.linear_conv_kernel_dim, where);
  c.linear_key_head_dim = optional_positive_int(j, "linear_key_head_dim", c.linear_key_head_dim, where);
  c.linear_value_head_dim = optional_positive_int(j, "linear_value_head_dim", c.linear_value_head_dim, where);
  c.linear_num_key_heads = optional_positive_int(j, "linear_num_key_heads", c.linear_num_key_heads, where);
  c.linear_num_value_heads = optional_positive_int(j, "linear_num_value_heads", c.linear_num_value_heads, where);
  DF_CHECK_HINT(c.linear_num_value_heads % c.linear_num_key_heads == 0, BadInput,
                source << ": linear_num_value_heads " << c.linear_num_value_heads
                       << " is not a multiple of linear_num_key_heads " << c.linear_num_key_heads,
                kHint);

  // transformers 5 keeps partial_rotary_factor in rope_parameters; older configs at the top level.
  double prf = 0.25;  // Qwen3_5TextConfig's default
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("partial_rotary_factor")) {
    prf = j["rope_parameters"]["partial_rotary_factor"].is_number()
              ? j["rope_parameters"]["partial_rotary_factor"].get<double>()
              : -1.0;
  } else if (j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null()) {
    prf = j["partial_rotary_factor"].is_number() ? j["partial_rotary_factor"].get<double>() : -1.0;
  }
  const int rot = static_cast<int>(c.text.head_dim * prf);  // Python int(): truncation
  DF_CHECK_HINT(prf > 0.0 && prf <= 1.0 && rot >= 2 && rot % 2 == 0, BadInput,
                source << ": partial_rotary_factor " << prf << " with head_dim " << c.text.head_dim
                       << " gives rotary dim " << rot << "; it must be an even number of at least 2",
                kHint);
  c.partial_rotary_factor = static_cast<float>(prf);
  c.rotary_dim = rot;
  check_mrope(j, where, source, rot);
  check_output_gate(j, where, source);

  // No layer_types: HF's default pattern, a full-attention layer every full_attention_interval (4).
  if (!j.contains("layer_types") || j["layer_types"].is_null()) {
    const int interval = optional_positive_int(j, "full_attention_interval", 4, where);
    for (int l = 0; l < c.text.num_hidden_layers; ++l)
      c.text.layer_types[l] = (l + 1) % interval ? "linear_attention" : "full_attention";
  }
  for (size_t l = 0; l < c.text.layer_types.size(); ++l) {
    const std::string& t = c.text.layer_types[l];
    DF_CHECK_HINT(t == "linear_attention" || t == "full_attention", BadInput,
                  source << ": layer " << l << " is " << t
                         << "; a Qwen3.5 hybrid has linear_attention and full_attention layers only",
                  kHint);
    c.kinds.push_back(t == "linear_attention" ? Qwen35LayerKind::LinearAttention : Qwen35LayerKind::FullAttention);
  }
  return c;
}

Qwen35Config load_qwen35_config(const std::string& config_json_path) {
  const json j = read_json_file(config_json_path,
                                "a Hugging Face checkpoint directory holds config.json as written by save_pretrained");
  return parse_qwen35_config(j, config_json_path);
}

}  // namespace dflash
