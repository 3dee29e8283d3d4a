// config.json's quantization_config for targets (include/dflash/target_quant.h, docs/fp8.md): the two FP8
// formats people serve, read field by field; anything else is refused naming the field, because weights of
// another quantization would load as plain floats and train a drafter on a model nobody serves.
#include "dflash/target_quant.h"

#include <regex>

#include "dflash/error.h"

namespace dflash {
namespace {

using nlohmann::json;

const char* const kUseBf16 = "use the unquantized (bf16) checkpoint of the model, or a Qwen -FP8 release / an "
                             "llm-compressor FP8-Dynamic checkpoint (docs/fp8.md)";

struct Where {
  const std::string& source;
  std::string prefix;
  std::string at(const std::string& key) const { return "'" + prefix + key + "' in " + source; }
};

void refuse_method(const json& q, const Where& w) {
  DF_FAIL(BadInput,
          "field " << w.at("quantization_config") << " is set ("
                   << (q.is_object() && q.contains("quant_method") ? "quant_method " + q["quant_method"].dump()
                                                                   : q.dump().substr(0, 80))
                   << "): this build reads FP8 checkpoints (quant_method \"fp8\" or \"compressed-tensors\" "
                      "float 8-bit); other quantized weights would be read as plain floats",
          kUseBf16);
}

std::vector<std::string> string_list(const json& q, const char* key, const Where& w) {
  std::vector<std::string> out;
  if (!q.contains(key) || q[key].is_null()) return out;
  DF_CHECK_HINT(q[key].is_array(), BadInput, "field " << w.at(std::string("quantization_config.") + key)
                                                      << " must be a list of module names, got " << q[key].dump(),
                kUseBf16);
  for (const json& e : q[key]) {
    DF_CHECK_HINT(e.is_string(), BadInput, "field " << w.at(std::string("quantization_config.") + key)
                                                    << " holds " << e.dump() << ", not a module name",
                  kUseBf16);
    out.push_back(e.get<std::string>());
  }
  return out;
}

// transformers' fine-grained FP8 (integrations/finegrained_fp8.py): e4m3 weights in blocks, dynamic
// activations in groups of the block's column size.
TargetQuantization parse_fine_grained(const json& q, const Where& w) {
  TargetQuantization t;
  t.format = CheckpointFp8::FineGrained;
  t.scales = WeightScales::Blocks;
  t.scale_suffix = "weight_scale_inv";
  if (q.contains("fmt") && !q["fmt"].is_null())
    DF_CHECK_HINT(q["fmt"] == "e4m3", BadInput,
                  "field " << w.at("quantization_config.fmt") << " is " << q["fmt"].dump() << "; FP8 targets are e4m3",
                  kUseBf16);
  if (q.contains("activation_scheme") && !q["activation_scheme"].is_null())
    DF_CHECK_HINT(q["activation_scheme"] == "dynamic", BadInput,
                  "field " << w.at("quantization_config.activation_scheme") << " is " << q["activation_scheme"].dump()
                           << "; this build quantizes activations dynamically (per token, in groups of 128)",
                  kUseBf16);
  const json& bs = q.contains("weight_block_size") ? q["weight_block_size"] : json();
  DF_CHECK_HINT(bs.is_array() && bs.size() == 2 && bs[0].is_number_integer() && bs[1].is_number_integer() &&
                    bs[0].get<int64_t>() > 0 && bs[1].get<int64_t>() > 0,
                BadInput,
                "field " << w.at("quantization_config.weight_block_size") << " must be two positive integers "
                         << "(e.g. [128, 128]; per-tensor FP8 is not read), got " << bs.dump(),
                kUseBf16);
  t.block_rows = bs[0].get<int64_t>();
  t.block_cols = bs[1].get<int64_t>();
  t.act_group = t.block_cols;
  t.not_converted = string_list(q, "modules_to_not_convert", w);
  t.not_converted.push_back("lm_head");  // transformers' replace_with_fp8_linear adds it always
  return t;
}

// llm-compressor's compressed-tensors, float 8-bit weights (per channel, or in blocks) with dynamic
// activations (per token, or in groups).
TargetQuantization parse_compressed_tensors(const json& q, const Where& w) {
  TargetQuantization t;
  t.format = CheckpointFp8::CompressedTensors;
  t.scale_suffix = "weight_scale";
  const std::string cg = "quantization_config.config_groups";
  DF_CHECK_HINT(q.contains("config_groups") && q["config_groups"].is_object() && q["config_groups"].size() == 1,
                BadInput, "field " << w.at(cg) << " must hold exactly one scheme group (FP8-Dynamic), got "
                                   << (q.contains("config_groups") ? q["config_groups"].dump().substr(0, 120) : "none"),
                kUseBf16);
  const json& g = q["config_groups"].begin().value();
  const json& wt = g.contains("weights") ? g["weights"] : json();
  const json& in = g.contains("input_activations") ? g["input_activations"] : json();
  auto field = [&](const json& o, const char* k) { return o.is_object() && o.contains(k) ? o[k] : json(); };
  DF_CHECK_HINT(field(wt, "type") == "float" && field(wt, "num_bits") == 8, BadInput,
                "field " << w.at(cg + ".*.weights") << " is " << wt.dump().substr(0, 160)
                         << "; this build reads float 8-bit (FP8 e4m3) weights",
                kUseBf16);
  const json ws = field(wt, "strategy");
  if (ws == "channel") {
    t.scales = WeightScales::Channels;
  } else if (ws == "block") {
    const json bs = field(wt, "block_structure");
    DF_CHECK_HINT(bs.is_array() && bs.size() == 2 && bs[0].is_number_integer() && bs[1].is_number_integer() &&
                      bs[0].get<int64_t>() > 0 && bs[1].get<int64_t>() > 0,
                  BadInput, "field " << w.at(cg + ".*.weights.block_structure") << " must be two positive integers",
                  kUseBf16);
    t.scales = WeightScales::Blocks;
    t.block_rows = bs[0].get<int64_t>();
    t.block_cols = bs[1].get<int64_t>();
  } else {
    DF_FAIL(BadInput, "field " << w.at(cg + ".*.weights.strategy") << " is " << ws.dump()
                               << "; this build reads FP8 weights with per-channel or block scales",
            kUseBf16);
  }
  DF_CHECK_HINT(field(in, "type") == "float" && field(in, "num_bits") == 8 && field(in, "dynamic") == true, BadInput,
                "field " << w.at(cg + ".*.input_activations") << " is " << in.dump().substr(0, 160)
                         << "; this build quantizes activations dynamically to FP8 (static input_scale is not read)",
                kUseBf16);
  const json as = field(in, "strategy");
  if (as == "token") {
    t.act_group = 0;
  } else if (as == "group" && field(in, "group_size").is_number_integer() && field(in, "group_size").get<int64_t>() > 0) {
    t.act_group = field(in, "group_size").get<int64_t>();
  } else {
    DF_FAIL(BadInput, "field " << w.at(cg + ".*.input_activations.strategy") << " is " << as.dump()
                               << "; this build reads per-token or per-group dynamic activations",
            kUseBf16);
  }
  t.not_converted = string_list(q, "ignore", w);
  return t;
}

}  // namespace

const char* checkpoint_fp8_name(CheckpointFp8 f) {
  switch (f) {
    case CheckpointFp8::None: return "none";
    case CheckpointFp8::FineGrained: return "fp8 (fine-grained)";
    case CheckpointFp8::CompressedTensors: return "compressed-tensors";
  }
  return "?";
}

const char* target_precision_name(TargetPrecision p) { return p == TargetPrecision::Fp8 ? "fp8" : "bf16"; }

bool TargetQuantization::stores_fp8(const std::string& module) const {
  switch (format) {
    case CheckpointFp8::None: return false;
    case CheckpointFp8::FineGrained: {
      // transformers: re.sub(r"\d+", "*", name), then `key in name` for every key.
      const std::string starred = std::regex_replace(module, std::regex("[0-9]+"), "*");
      for (const std::string& key : not_converted)
        if (starred.find(key) != std::string::npos) return false;
      return true;
    }
    case CheckpointFp8::CompressedTensors:
      // compressed-tensors: "re:PATTERN" is re.match (anchored at the start), anything else the exact name.
      for (const std::string& key : not_converted) {
        if (key.rfind("re:", 0) == 0) {
          if (std::regex_search(module, std::regex(key.substr(3)), std::regex_constants::match_continuous))
            return false;
        } else if (key == module) {
          return false;
        }
      }
      return true;
  }
  return false;
}

TargetQuantization parse_target_quantization(const json& root, const std::string& source) {
  const bool nested = root.contains("text_config") && root["text_config"].is_object();
  const json* q = nullptr;
  Where w{source, ""};
  if (root.contains("quantization_config") && !root["quantization_config"].is_null()) {
    q = &root["quantization_config"];
  } else if (nested && root["text_config"].contains("quantization_config") &&
             !root["text_config"]["quantization_config"].is_null()) {
    q = &root["text_config"]["quantization_config"];
    w.prefix = "text_config.";
  }
  if (!q) return TargetQuantization{};
  if (!q->is_object() || !q->contains("quant_method")) refuse_method(*q, w);
  TargetQuantization t;
  if ((*q)["quant_method"] == "fp8") {
    t = parse_fine_grained(*q, w);
  } else if ((*q)["quant_method"] == "compressed-tensors") {
    const json fmt = q->contains("format") ? (*q)["format"] : json();
    DF_CHECK_HINT(fmt == "float-quantized" || fmt == "naive-quantized", BadInput,
                  "field " << w.at("quantization_config.format") << " is " << fmt.dump()
                           << "; this build reads compressed-tensors' float-quantized (FP8) checkpoints",
                  kUseBf16);
    t = parse_compressed_tensors(*q, w);
  } else {
    refuse_method(*q, w);
  }
  t.precision = TargetPrecision::Fp8;  // the checkpoint's own
  return t;
}

void resolve_target_precision(TargetQuantization& q, const std::string& option) {
  if (option.empty()) return;
  DF_CHECK_HINT(option == "bf16" || option == "fp8" || option == "fp8-dynamic", BadOptions,
                "--target-precision " << option << " is not a precision this build runs", "use bf16, fp8 or fp8-dynamic");
  DF_CHECK_HINT(option != "fp8-dynamic" || q.format == CheckpointFp8::None, BadOptions,
                "--target-precision fp8-dynamic quantizes a bf16 checkpoint, and this one is already FP8 ("
                    << checkpoint_fp8_name(q.format) << ")",
                "use --target-precision fp8 (or leave it out) to run the checkpoint's own FP8 format");
  q.precision = option == "bf16" ? TargetPrecision::Bf16 : TargetPrecision::Fp8;
  q.on_load = option == "fp8-dynamic" ? OnLoadFp8::Dynamic : OnLoadFp8::Block;
}

}  // namespace dflash
