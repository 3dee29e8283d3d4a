// Hugging Face config.json parsing for Qwen3 targets and DFlash drafters, and the drafter's export config.
//
// Every field is checked for presence, type and range, and an error names the file and the field's full
// path (e.g. "text_config.num_key_value_heads"), because a silently defaulted field here shows up much
// later as a drafter that trains fine and is accepted badly at serving time.
#include "dflash/hf_config.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "dflash/error.h"
#include "dflash/target_quant.h"
#include "io/json_file.h"

namespace dflash {
namespace {

using nlohmann::json;

const char* const kConfigHint = "fix config.json, or point at the right checkpoint directory";

// A JSON object together with where it came from, for error messages.
struct Fields {
  const json& j;
  const std::string& source;
  std::string prefix;  // "" or "text_config."

  std::string where(const std::string& key) const { return "'" + prefix + key + "' in " + source; }
  bool has(const std::string& key) const { return j.contains(key) && !j[key].is_null(); }

  int64_t integer(const std::string& key) const {
    DF_CHECK_HINT(j.contains(key), BadInput, "missing field " << where(key), kConfigHint);
    return integer_value(key, j[key]);
  }
  int64_t integer_value(const std::string& key, const json& v) const {
    bool ok = v.is_number_integer();
    // Python writes 4096.0 for some integer fields; accept integral floats.
    if (!ok && v.is_number_float()) {
      double d = v.get<double>();
      ok = std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15;
      if (ok) return static_cast<int64_t>(d);
    }
    DF_CHECK_HINT(ok, BadInput, "field " << where(key) << " must be an integer, got " << v.dump(), kConfigHint);
    return v.get<int64_t>();
  }
  int positive_int(const std::string& key) const {
    const int v = checked_int(key, integer(key), 1);
    // Plausibility bounds, far above any real model, checked before anything is sized by these fields
    // (num_hidden_layers 1e9 made every rank allocate per-layer state until it ran out of memory).
    static const std::map<std::string, int64_t> kMost = {
        {"vocab_size", int64_t{1} << 24},        {"hidden_size", int64_t{1} << 17},
        {"intermediate_size", int64_t{1} << 20}, {"num_hidden_layers", 4096},
        {"num_attention_heads", 4096},           {"num_key_value_heads", 4096},
        {"head_dim", 4096},                      {"block_size", 4096},
        {"num_target_layers", 4096}};
    const auto most = kMost.find(key);
    DF_CHECK_HINT(most == kMost.end() || v <= most->second, BadInput,
                  "field " << where(key) << " = " << v << " is not plausible (at most " << most->second << ")",
                  "check the checkpoint's config.json: no model this tool runs comes near that");
    return v;
  }
  int checked_int(const std::string& key, int64_t v, int64_t min) const {
    DF_CHECK_HINT(v >= min && v <= std::numeric_limits<int>::max(), BadInput,
                  "field " << where(key) << " = " << v << " is out of range (must be >= " << min << ")", kConfigHint);
    return static_cast<int>(v);
  }
  double positive_number(const std::string& key, const json& v) const {
    DF_CHECK_HINT(v.is_number(), BadInput, "field " << where(key) << " must be a number, got " << v.dump(),
                  kConfigHint);
    double d = v.get<double>();
    DF_CHECK_HINT(std::isfinite(d) && d > 0, BadInput, "field " << where(key) << " = " << d << " must be positive",
                  kConfigHint);
    return d;
  }
  bool boolean(const std::string& key, bool dflt) const {
    if (!has(key)) return dflt;
    DF_CHECK_HINT(j[key].is_boolean(), BadInput,
                  "field " << where(key) << " must be true or false, got " << j[key].dump(), kConfigHint);
    return j[key].get<bool>();
  }
};

// A rope_parameters / rope_scaling object: we implement plain RoPE only, so any scaling type is refused
// rather than silently ignored (the drafter would learn features the serving engine does not produce).
void check_rope_type(const Fields& f, const std::string& key) {
  if (!f.has(key)) return;
  const json& r = f.j[key];
  DF_CHECK_HINT(r.is_object(), BadInput, "field " << f.where(key) << " must be an object, got " << r.dump(),
                kConfigHint);
  for (const char* type_key : {"rope_type", "type"}) {
    if (!r.contains(type_key) || r[type_key].is_null()) continue;
    DF_CHECK_HINT(r[type_key].is_string() && r[type_key].get<std::string>() == "default", BadInput,
                  "unsupported RoPE scaling " << r[type_key].dump() << " in " << f.where(key),
                  "dflash-train implements plain RoPE (rope_type \"default\"); remove the scaling from config.json "
                  "if the serving engine runs the target without it");
  }
}

constexpr const char* kConfigJsonHint =
    "a Hugging Face checkpoint directory holds config.json, a JSON object as transformers' save_pretrained writes it";

// The shortest decimal that reads back as `f`: config.json gets 1e-06, not 9.999999974752427e-07.
double float_for_json(float f) {
  char buf[32];
  for (int precision = 1; precision <= 9; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, static_cast<double>(f));
    double d = std::strtod(buf, nullptr);
    if (static_cast<float>(d) == f) return d;
  }
  return static_cast<double>(f);
}

}  // namespace

Qwen3Config parse_qwen3_config(const json& root, const std::string& source) {
  DF_CHECK_HINT(root.is_object(), BadInput, source << " is not a JSON object", kConfigHint);
  Qwen3Config c;
  const bool nested = root.contains("text_config") && !root["text_config"].is_null();
  if (nested) {
    DF_CHECK_HINT(root["text_config"].is_object(), BadInput, "field 'text_config' in " << source
                                                                                       << " is not an object",
                  kConfigHint);
    c.weight_prefix = "model.language_model.";  // VLM checkpoints keep the text weights there
  }
  const json& j = nested ? root["text_config"] : root;
  Fields f{j, source, nested ? "text_config." : ""};
  for (const json* level : {&root, nested ? &j : nullptr})
    for (const char* key : {"dtype", "torch_dtype"})
      if (c.dtype_label.empty() && level && level->contains(key) && (*level)[key].is_string())
        c.dtype_label = (*level)[key].get<std::string>();

  c.vocab_size = f.positive_int("vocab_size");
  c.hidden_size = f.positive_int("hidden_size");
  c.intermediate_size = f.positive_int("intermediate_size");
  c.num_hidden_layers = f.positive_int("num_hidden_layers");
  c.num_attention_heads = f.positive_int("num_attention_heads");
  c.num_key_value_heads = f.has("num_key_value_heads") ? f.positive_int("num_key_value_heads") : c.num_attention_heads;
  DF_CHECK_HINT(c.num_attention_heads % c.num_key_value_heads == 0, BadInput,
                "num_attention_heads = " << c.num_attention_heads << " is not divisible by num_key_value_heads = "
                                         << c.num_key_value_heads << " (" << f.where("num_key_value_heads") << ")",
                kConfigHint);
  if (f.has("head_dim")) {
    c.head_dim = f.positive_int("head_dim");
  } else {
    DF_CHECK_HINT(c.hidden_size % c.num_attention_heads == 0, BadInput,
                  "missing field " << f.where("head_dim") << ", and hidden_size = " << c.hidden_size
                                   << " is not divisible by num_attention_heads = " << c.num_attention_heads,
                  kConfigHint);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // neox RoPE rotates pairs (i, i + head_dim/2)
  DF_CHECK_HINT(c.head_dim % 2 == 0, BadInput, "field " << f.where("head_dim") << " = " << c.head_dim << " is odd",
                kConfigHint);
  DF_CHECK_HINT(j.contains("rms_norm_eps"), BadInput, "missing field " << f.where("rms_norm_eps"), kConfigHint);
  c.rms_norm_eps = static_cast<float>(f.positive_number("rms_norm_eps", j["rms_norm_eps"]));

  // RoPE theta: transformers <5 writes "rope_theta" at the top level, transformers 5 "rope_parameters".
  check_rope_type(f, "rope_parameters");
  check_rope_type(f, "rope_scaling");
  if (f.has("rope_theta")) {
    c.rope_theta = static_cast<float>(f.positive_number("rope_theta", j["rope_theta"]));
    // Both spellings (this project's exports write both for older loaders): they must agree, or which one a
    // serving engine reads decides the positions it uses.
    if (f.has("rope_parameters") && j["rope_parameters"].is_object() && j["rope_parameters"].contains("rope_theta")) {
      Fields rp{j["rope_parameters"], source, f.prefix + "rope_parameters."};
      const double other = rp.positive_number("rope_theta", rp.j["rope_theta"]);
      DF_CHECK_HINT(std::abs(other - j["rope_theta"].get<double>()) <= 1e-6 * other, BadInput,
                    "'" << f.prefix << "rope_theta' " << j["rope_theta"].get<double>() << " and '" << rp.prefix
                        << "rope_theta' " << other << " in " << source << " disagree",
                    "the two fields name one RoPE base: make them equal (the model card says which is right)");
    }
  } else if (f.has("rope_parameters") && j["rope_parameters"].contains("rope_theta")) {
    Fields rp{j["rope_parameters"], source, f.prefix + "rope_parameters."};
    c.rope_theta = static_cast<float>(rp.positive_number("rope_theta", rp.j["rope_theta"]));
  } else {
    DF_FAIL(BadInput, "missing field " << f.where("rope_theta") << " (looked for rope_theta and "
                                       << f.prefix << "rope_parameters.rope_theta)",
            kConfigHint);
  }

  // VLM configs may keep tie_word_embeddings at the top level only.
  c.tie_word_embeddings = f.has("tie_word_embeddings") || !nested
                              ? f.boolean("tie_word_embeddings", false)
                              : Fields{root, source, ""}.boolean("tie_word_embeddings", false);
  if (f.has("max_position_embeddings")) c.max_position_embeddings = f.positive_int("max_position_embeddings");

  c.sliding_window = f.has("sliding_window") ? f.checked_int("sliding_window", f.integer("sliding_window"), 0) : 0;
  if (f.has("layer_types")) {
    const json& lt = j["layer_types"];
    DF_CHECK_HINT(lt.is_array() && lt.size() == static_cast<size_t>(c.num_hidden_layers), BadInput,
                  "field " << f.where("layer_types") << " must be a list of " << c.num_hidden_layers
                           << " layer types (one per layer), got " << lt.dump(),
                  kConfigHint);
    for (const json& t : lt) {
      const bool known = t.is_string() && (t == "full_attention" || t == "sliding_attention" ||
                                           t == "linear_attention");
      DF_CHECK_HINT(known, BadInput, "unknown layer type " << t.dump() << " in " << f.where("layer_types"),
                    "layer types are full_attention, sliding_attention (and linear_attention for Qwen3.5)");
      c.layer_types.push_back(t.get<std::string>());
    }
  } else {
    // Older Qwen3 configs: sliding window on layers >= max_window_layers when use_sliding_window is set.
    const bool use_sliding = f.boolean("use_sliding_window", false);
    int max_window_layers = c.num_hidden_layers;
    if (use_sliding && f.has("max_window_layers"))
      max_window_layers = f.checked_int("max_window_layers", f.integer("max_window_layers"), 0);
    for (int l = 0; l < c.num_hidden_layers; ++l)
      c.layer_types.push_back(use_sliding && c.sliding_window > 0 && l >= max_window_layers ? "sliding_attention"
                                                                                            : "full_attention");
  }
  for (const std::string& t : c.layer_types)
    DF_CHECK_HINT(t != "sliding_attention" || c.sliding_window > 0, BadInput,
                  f.where("layer_types") << " has sliding_attention layers but " << f.where("sliding_window")
                                         << " is not a positive window size",
                  kConfigHint);
  return c;
}

namespace {

bool is_one_of(const json& v, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (v == n) return true;
  return false;
}

// Whether a quantization_config may be there: a target's is read by parse_target_quantization
// (include/dflash/target_quant.h), which refuses what this build does not run; a drafter has none.
enum class QuantizationConfig : uint8_t { Refused, ReadByTarget };

// Fields whose other values describe math this build does not run (shared by targets and drafters):
// biases in attention or MLP, an activation other than SiLU, quantized weights (drafters).
void check_supported_math(const json& j, const std::string& where, const std::string& source,
                          QuantizationConfig quant) {
  auto at = [&](const char* key) { return "'" + where + key + "' in " + source; };
  for (const char* key : {"attention_bias", "mlp_bias"})
    DF_CHECK_HINT(!j.contains(key) || j[key].is_null() || j[key] == false, BadInput,
                  "field " << at(key) << " is " << j[key].dump() << ": this build's Qwen layers have no biases",
                  "the model is not a Qwen3-family model this build implements (Qwen3, Qwen3.5/3.6 have no biases)");
  DF_CHECK_HINT(!j.contains("hidden_act") || j["hidden_act"].is_null() || j["hidden_act"] == "silu", BadInput,
                "field " << at("hidden_act") << " is " << j["hidden_act"].dump() << ": this build's MLP is SwiGLU (silu)",
                "the model is not a Qwen3-family model this build implements");
  if (quant == QuantizationConfig::ReadByTarget) return;
  DF_CHECK_HINT(!j.contains("quantization_config") || j["quantization_config"].is_null(), BadInput,
                "field " << at("quantization_config") << " is set ("
                         << (j["quantization_config"].is_object() && j["quantization_config"].contains("quant_method")
                                 ? "quant_method " + j["quantization_config"]["quant_method"].dump()
                                 : j["quantization_config"].dump().substr(0, 80))
                         << "): quantized weights would be read as plain floats",
                "use the unquantized (bf16) checkpoint of the model");
}

}  // namespace

void check_target_config_supported(const json& root, const std::string& source, bool hybrid) {
  DF_CHECK_HINT(root.is_object(), BadInput, source << " is not a JSON object", kConfigHint);
  const bool nested = root.contains("text_config") && root["text_config"].is_object();
  check_supported_math(root, "", source, QuantizationConfig::ReadByTarget);
  if (nested) check_supported_math(root["text_config"], "text_config.", source, QuantizationConfig::ReadByTarget);
  (void)parse_target_quantization(root, source);  // a quantization this build does not read: refused here
  const char* const hint = hybrid ? "this build runs dense Qwen3.5/3.6 hybrids (Qwen3_5ForCausalLM, "
                                    "Qwen3_5ForConditionalGeneration)"
                                  : "this build runs dense Qwen3 targets (Qwen3ForCausalLM, model_type qwen3) and "
                                    "Qwen3.5/3.6 hybrids; MoE and other families are not implemented";
  // model_type at the top and in text_config, and every architecture, when present.
  for (int level = 0; level < (nested ? 2 : 1); ++level) {
    const json& j = level == 0 ? root : root["text_config"];
    const std::string where = level == 0 ? "" : "text_config.";
    if (!j.contains("model_type") || j["model_type"].is_null()) continue;
    const json& mt = j["model_type"];
    const bool ok = mt.is_string() &&
                    (hybrid ? mt.get<std::string>().rfind("qwen3_5", 0) == 0 && mt.get<std::string>().find("moe") == std::string::npos
                            : is_one_of(mt, {"qwen3", "qwen3_vl", "qwen3_vl_text"}));
    DF_CHECK_HINT(ok, BadInput, "field '" << where << "model_type' in " << source << " is " << mt.dump()
                                          << ", a model this build does not implement",
                  hint);
  }
  if (root.contains("architectures") && !root["architectures"].is_null()) {
    const json& arch = root["architectures"];
    DF_CHECK_HINT(arch.is_array(), BadInput, "field 'architectures' in " << source << " must be a list", kConfigHint);
    for (const json& a : arch) {
      const bool ok = a.is_string() &&
                      (hybrid ? a.get<std::string>().rfind("Qwen3_5", 0) == 0 && a.get<std::string>().find("Moe") == std::string::npos
                              : is_one_of(a, {"Qwen3ForCausalLM", "Qwen3Model", "Qwen3VLForConditionalGeneration"}));
      DF_CHECK_HINT(ok, BadInput, "field 'architectures' in " << source << " names " << a.dump()
                                                              << ", a model this build does not implement",
                    hint);
    }
  }
}

Qwen3Config load_qwen3_config(const std::string& config_json_path) {
  return parse_qwen3_config(read_json_file(config_json_path, kConfigJsonHint), config_json_path);
}

json read_config_json(const std::string& config_json_path) { return read_json_file(config_json_path, kConfigJsonHint); }

const char* draft_arch_name(DraftArch a) { return a == DraftArch::DFlash2 ? "dflash2" : "dflash"; }
const char* selector_candidates_name(SelectorCandidates c) {
  return c == SelectorCandidates::Insert ? "insert" : "strict";
}
const char* draft_arch_architecture(DraftArch a) {
  return a == DraftArch::DFlash2 ? "DFlash2DraftModel" : "DFlashDraftModel";
}

namespace {

// The official _draft_value rule (docs/dflash2.md 2.1): dflash_config[name], else the top-level field.
const json* draft_value(const json& j, const std::string& name) {
  if (j.contains("dflash_config") && j["dflash_config"].is_object() && j["dflash_config"].contains(name) &&
      !j["dflash_config"][name].is_null())
    return &j["dflash_config"][name];
  if (j.contains(name) && !j[name].is_null()) return &j[name];
  return nullptr;
}

// A DFlash2 shape field (positive integer), where it is found by draft_value; `most` bounds it.
int draft_shape_int(const json& j, const std::string& source, const std::string& name, int dflt, int64_t most) {
  const json* v = draft_value(j, name);
  if (!v) return dflt;
  Fields f{j, source, "dflash_config."};
  const int64_t x = f.integer_value(name, *v);
  DF_CHECK_HINT(x >= 1 && x <= most, BadInput,
                "field " << f.where(name) << " = " << x << " is out of range [1, " << most << "]", kConfigHint);
  return static_cast<int>(x);
}

float draft_number(const json& j, const std::string& source, const std::string& name, float dflt, bool zero_ok) {
  const json* v = draft_value(j, name);
  if (!v) return dflt;
  Fields f{j, source, "dflash_config."};
  DF_CHECK_HINT(v->is_number(), BadInput, "field " << f.where(name) << " must be a number, got " << v->dump(),
                kConfigHint);
  const double d = v->get<double>();
  DF_CHECK_HINT(std::isfinite(d) && (d > 0 || (zero_ok && d == 0)), BadInput,
                "field " << f.where(name) << " = " << d << " must be " << (zero_ok ? "0 (off) or positive" : "positive"),
                kConfigHint);
  return static_cast<float>(d);
}

}  // namespace

DrafterConfig parse_drafter_config(const json& j, const std::string& source) {
  DF_CHECK_HINT(j.is_object(), BadInput, source << " is not a JSON object", kConfigHint);
  const char* const format_hint =
      "--drafter expects a DFlash or DFlash2 release-format directory: config.json with architectures "
      "[\"DFlashDraftModel\"] or [\"DFlash2DraftModel\"], block_size, num_target_layers and dflash_config";
  int found = 0;
  DraftArch arch = DraftArch::DFlash;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"])
      for (DraftArch x : {DraftArch::DFlash, DraftArch::DFlash2})
        if (a == draft_arch_architecture(x)) {
          arch = x;
          ++found;
        }
  DF_CHECK_HINT(found == 1, BadInput, source << " is not a DFlash or DFlash2 drafter config (architectures = "
                                            << (j.contains("architectures") ? j["architectures"].dump() : "missing")
                                            << ", expected [\"DFlashDraftModel\"] or [\"DFlash2DraftModel\"])",
                format_hint);
  DF_CHECK_HINT(!j.contains("text_config"), BadInput, source << ": a DFlash drafter config has no text_config",
                format_hint);

  check_supported_math(j, "", source, QuantizationConfig::Refused);
  DrafterConfig d;
  d.layers = parse_qwen3_config(j, source);
  d.layers.weight_prefix = "";  // drafter keys are "layers.N.*", "fc.weight", "norm.weight"
  d.arch = arch;
  Fields f{j, source, ""};
  // DFlash2 releases keep block_size in dflash_config only (the official _draft_value rule reads either).
  if (arch == DraftArch::DFlash2 && !f.has("block_size")) {
    d.block_size = draft_shape_int(j, source, "block_size", 0, 4096);
    DF_CHECK_HINT(d.block_size > 0, BadInput, "missing field 'dflash_config.block_size' in " << source, format_hint);
  } else {
    d.block_size = f.positive_int("block_size");
  }
  d.num_target_layers = f.positive_int("num_target_layers");
  if (arch == DraftArch::DFlash2) {
    d.d2.conv_kernel_size = draft_shape_int(j, source, "conv_kernel_size", 2, 64);
    d.d2.conv_group_size = draft_shape_int(j, source, "conv_group_size", 16, int64_t{1} << 17);
    d.d2.selector_top_k = draft_shape_int(j, source, "selector_top_k", 16, 64);
    d.d2.selector_rank = draft_shape_int(j, source, "selector_rank", 256, 4096);
  }
  d.output_multiplier = draft_number(j, source, "output_multiplier", 1.0f, false);
  d.final_logit_softcapping = draft_number(j, source, "final_logit_softcapping", 0.0f, true);
  d.input_embedding_scale = draft_number(j, source, "input_embedding_scale", 1.0f, false);
  if (f.has("is_causal")) d.is_causal = f.boolean("is_causal", false) ? 1 : 0;
  if (f.has("dtype")) {
    DF_CHECK_HINT(j["dtype"].is_string(), BadInput, "field " << f.where("dtype") << " must be a string", kConfigHint);
    d.torch_dtype = j["dtype"].get<std::string>();
  } else if (f.has("torch_dtype") && j["torch_dtype"].is_string()) {
    d.torch_dtype = j["torch_dtype"].get<std::string>();
  }

  DF_CHECK_HINT(f.has("dflash_config") && j["dflash_config"].is_object(), BadInput,
                "missing object " << f.where("dflash_config"), format_hint);
  Fields df{j["dflash_config"], source, "dflash_config."};
  d.mask_token_id = df.checked_int("mask_token_id", df.integer("mask_token_id"), 0);
  if (df.has("target_layer_ids")) {
    const json& ids = df.j["target_layer_ids"];
    DF_CHECK_HINT(ids.is_array() && !ids.empty(), BadInput,
                  "field " << df.where("target_layer_ids") << " must be a non-empty list of layer ids, got "
                           << ids.dump(),
                  kConfigHint);
    for (const json& v : ids) d.target_layer_ids.push_back(df.checked_int("target_layer_ids", df.integer_value("target_layer_ids", v), 0));
  } else {
    d.target_layer_ids = default_target_layer_ids(d.num_target_layers, d.layers.num_hidden_layers);
  }
  for (int id : d.target_layer_ids)
    DF_CHECK_HINT(id < d.num_target_layers, BadInput,
                  "target layer id " << id << " in " << df.where("target_layer_ids") << " is outside [0, "
                                     << d.num_target_layers << ") (num_target_layers)",
                  kConfigHint);
  return d;
}

DrafterConfig load_drafter_config(const std::string& config_json_path) {
  return parse_drafter_config(read_json_file(config_json_path, kConfigJsonHint), config_json_path);
}

json drafter_config_to_json(const DrafterConfig& c) {
  const Qwen3Config& q = c.layers;
  bool any_sliding = false;
  int first_sliding = q.num_hidden_layers;
  for (int l = 0; l < static_cast<int>(q.layer_types.size()); ++l)
    if (q.layer_types[l] == "sliding_attention") {
      any_sliding = true;
      first_sliding = std::min(first_sliding, l);
    }
  std::vector<std::string> layer_types = q.layer_types;
  if (layer_types.empty()) layer_types.assign(q.num_hidden_layers, "full_attention");

  json j = json::object();  // nlohmann sorts keys, as transformers' save_pretrained does
  const bool d2 = c.arch == DraftArch::DFlash2;
  j["architectures"] = {draft_arch_architecture(c.arch)};
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  // No auto_map: the releases' names their own dflash.py, which is not shipped here (docs/serving.md).
  if (!d2) j["block_size"] = c.block_size;  // DFlash2 releases: in dflash_config only (the fixture's layout)
  j["bos_token_id"] = nullptr;
  j["dflash_config"] = {{"mask_token_id", c.mask_token_id}, {"target_layer_ids", c.target_layer_ids}};
  if (d2) {
    json& df = j["dflash_config"];
    df["block_size"] = c.block_size;
    df["conv_group_size"] = c.d2.conv_group_size;
    df["conv_kernel_size"] = c.d2.conv_kernel_size;
    df["final_logit_softcapping"] = c.final_logit_softcapping > 0 ? json(float_for_json(c.final_logit_softcapping))
                                                                   : json(nullptr);
    df["output_multiplier"] = float_for_json(c.output_multiplier);
    df["selector_rank"] = c.d2.selector_rank;
    df["selector_top_k"] = c.d2.selector_top_k;
    if (c.input_embedding_scale != 1.0f) df["input_embedding_scale"] = float_for_json(c.input_embedding_scale);
  } else {
    // A DFlash drafter trained with a logit transform: the fields the official compute_logits reads.
    if (c.output_multiplier != 1.0f) j["dflash_config"]["output_multiplier"] = float_for_json(c.output_multiplier);
    if (c.final_logit_softcapping > 0)
      j["dflash_config"]["final_logit_softcapping"] = float_for_json(c.final_logit_softcapping);
  }
  if (c.is_causal >= 0) j["is_causal"] = c.is_causal == 1;
  j["dtype"] = c.torch_dtype;
  // vLLM's name for the target layers a drafter reads, in its own numbering (id j = the output of layer
  // j-1, 0 = the embedding): target_layer_ids + 1. Recent vLLM derives it from dflash_config; releases
  // before that read dflash_config.target_layer_ids without the shift and capture one layer early unless
  // this field is set (docs/serving.md). DFlash2 has no vLLM method, so its export keeps the fixture's keys.
  if (!d2) {
    std::vector<int> aux;
    for (int id : c.target_layer_ids) aux.push_back(id + 1);
    j["eagle_aux_hidden_state_layer_ids"] = aux;
  }
  j["eos_token_id"] = nullptr;
  j["head_dim"] = q.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = q.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = q.intermediate_size;
  j["layer_types"] = layer_types;
  j["max_position_embeddings"] = q.max_position_embeddings;
  // Only read by loaders that derive layer_types themselves: the first sliding layer.
  j["max_window_layers"] = first_sliding;
  j["model_type"] = "qwen3";
  j["num_attention_heads"] = q.num_attention_heads;
  j["num_hidden_layers"] = q.num_hidden_layers;
  j["num_key_value_heads"] = q.num_key_value_heads;
  j["num_target_layers"] = c.num_target_layers;
  j["pad_token_id"] = nullptr;
  j["rms_norm_eps"] = float_for_json(q.rms_norm_eps);
  j["rope_parameters"] = {{"rope_theta", float_for_json(q.rope_theta)}, {"rope_type", "default"}};
  j["rope_theta"] = float_for_json(q.rope_theta);  // for loaders older than transformers 5
  j["sliding_window"] = q.sliding_window > 0 ? json(q.sliding_window) : json(nullptr);
  j["tie_word_embeddings"] = false;
  j["transformers_version"] = "5.17.0";  // the release whose config format this mirrors
  j["use_cache"] = true;
  // Older transformers drop sliding_window unless use_sliding_window is set.
  j["use_sliding_window"] = any_sliding;
  j["vocab_size"] = q.vocab_size;
  return j;
}

std::vector<int> default_target_layer_ids(int num_target_layers, int num_draft_layers) {
  DF_CHECK_HINT(num_draft_layers >= 1, BadInput,
                "cannot choose target layer ids for " << num_draft_layers << " drafter layers", "use --draft-layers >= 1");
  // The official build_target_layer_ids (z-lab/dflash, SpecForge): one drafter layer reads the target's
  // middle layer L // 2; n > 1 layers spread evenly from layer 1 to layer L - 3.
  std::vector<int> ids;
  if (num_draft_layers == 1) {
    ids.push_back(num_target_layers / 2);
  } else {
    const double span = static_cast<double>(num_target_layers - 4);
    for (int i = 0; i < num_draft_layers; ++i)
      // nearbyint rounds half to even, as Python's round() in the reference implementation does.
      ids.push_back(static_cast<int>(std::nearbyint(1.0 + i * span / (num_draft_layers - 1))));
  }
  for (int id : ids)
    DF_CHECK_HINT(id >= 0 && id < num_target_layers, BadInput,
                  "default target layer ids for a " << num_target_layers << "-layer target and " << num_draft_layers
                                                    << " drafter layers fall outside the target (id " << id << ")",
                  "give the drafter's dflash_config.target_layer_ids explicitly, or use a deeper target");
  return ids;
}

void check_drafter_fits_target(const DrafterConfig& d, const Qwen3Config& t) {
  const char* const hint = "the drafter was made for a different target: use a matching --drafter, or start "
                           "from scratch (omit --drafter) to build one for this target";
  DF_CHECK_HINT(d.layers.hidden_size == t.hidden_size, BadInput,
                "drafter hidden_size " << d.layers.hidden_size << " differs from the target's hidden_size "
                                       << t.hidden_size,
                hint);
  DF_CHECK_HINT(d.num_target_layers == t.num_hidden_layers, BadInput,
                "drafter num_target_layers " << d.num_target_layers << " differs from the target's num_hidden_layers "
                                             << t.num_hidden_layers,
                hint);
  DF_CHECK_HINT(d.layers.vocab_size == t.vocab_size, BadInput,
                "drafter vocab_size " << d.layers.vocab_size << " differs from the target's vocab_size "
                                      << t.vocab_size,
                hint);
  DF_CHECK_HINT(d.block_size >= 2, BadInput,
                "drafter block_size " << d.block_size << " is below 2 (a block is an anchor plus masked tokens)",
                "set block_size to 16 (the DFlash default)");
  DF_CHECK_HINT(d.mask_token_id >= 0 && d.mask_token_id < t.vocab_size, BadInput,
                "drafter mask_token_id " << d.mask_token_id << " is outside the target's vocabulary [0, "
                                         << t.vocab_size << ")",
                "the mask token is an unused id inside the target's vocabulary (Qwen3: 151669)");
  DF_CHECK_HINT(!d.target_layer_ids.empty(), BadInput, "drafter has no target_layer_ids", hint);
  // is_causal (docs/dflash2.md 2.6): absent = sliding layers causal within the block, full layers not; false =
  // every layer sees its whole block (BlockAttnSpec::full_block for the sliding ones); true would make full
  // layers causal within the block, which this build's block attention does not do: refused.
  for (size_t l = 0; l < d.layers.layer_types.size() && d.is_causal == 1; ++l)
    DF_CHECK_HINT(d.layers.layer_types[l] == "sliding_attention", BadInput,
                  "drafter config: is_causal true with a " << d.layers.layer_types[l] << " layer " << l
                                                           << " is not supported by this build's block attention",
                  "supported: is_causal absent or false, or true with sliding_attention layers only");
  if (d.arch == DraftArch::DFlash2) {
    const DFlash2Shape& s = d.d2;
    DF_CHECK_HINT(d.layers.hidden_size % s.conv_group_size == 0, BadInput,
                  "DFlash2 conv_group_size " << s.conv_group_size << " does not divide hidden_size "
                                             << d.layers.hidden_size,
                  "use a group size that divides the hidden size (16 in the releases)");
    DF_CHECK_HINT(s.conv_kernel_size <= d.block_size, BadInput,
                  "DFlash2 conv_kernel_size " << s.conv_kernel_size << " exceeds block_size " << d.block_size,
                  "a tap cannot reach past the block: use 2 taps (the releases)");
    DF_CHECK_HINT(s.selector_top_k <= t.vocab_size && s.selector_top_k <= 64, BadInput,
                  "DFlash2 selector_top_k " << s.selector_top_k << " must be at most 64 and the vocabulary",
                  "the releases use 16");
  }
  for (int id : d.target_layer_ids)
    DF_CHECK_HINT(id >= 0 && id < t.num_hidden_layers, BadInput,
                  "drafter target layer id " << id << " is outside the target's layers [0, " << t.num_hidden_layers
                                             << ")",
                  hint);
}

}  // namespace dflash
