// A fresh drafter's recipe from dflash-train's options (include/dflash/options.h): what the DFlash
// releases differ in besides their layer count -- block size, mask token, the target layers read, sliding
// layers -- so that e.g. the Qwen3.6-27B drafter is made from options, without a hand-written directory.
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/error.h"
#include "dflash/options.h"
#include "io/json_file.h"

namespace dflash {

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? "" : item.substr(b, e - b + 1));
  }
  return out;
}

bool parse_nonneg_int(const std::string& s, int& out) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  out = std::stoi(s);
  return true;
}

// The id of `token` in the target's tokenizer.json: its added tokens first, then the model's vocabulary.
int token_id_from_tokenizer(const std::string& target_dir, const std::string& token) {
  const std::string path = target_dir + "/tokenizer.json";
  const JsonFile f = try_read_json_file(path);
  DF_CHECK_HINT(f.status != JsonFileStatus::Missing, BadOptions,
                "--mask-token " << token << ": no " << path << " to look the token up in",
                "give the mask token's id instead (--mask-token ID), or auto");
  DF_CHECK_HINT(f.ok(), BadInput, f.error, "the target's tokenizer.json is damaged");
  const nlohmann::json& j = f.value;
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"])
      if (t.is_object() && t.value("content", std::string()) == token && t.contains("id") && t["id"].is_number_integer())
        return t["id"].get<int>();
  if (j.contains("model") && j["model"].is_object() && j["model"].contains("vocab") && j["model"]["vocab"].is_object()) {
    const auto& v = j["model"]["vocab"];
    const auto it = v.find(token);
    if (it != v.end() && it->is_number_integer()) return it->get<int>();
  }
  DF_FAIL(BadOptions, "--mask-token " << token << ": not a token of " << path,
          "give a token the tokenizer has (added_tokens or vocab), its id, or auto (an unused id of the family)");
}

}  // namespace

void resolve_drafter_recipe(Options& o, const std::vector<std::string>& given) {
  if (!o.drafter_dir.empty()) {
    DF_CHECK_HINT(given.empty(), BadOptions,
                  "--" << given.front() << " describes a fresh drafter, but --drafter " << o.drafter_dir
                       << " brings its own config.json",
                  "drop --" + given.front() + ", or drop --drafter to start a fresh drafter");
    return;
  }
  TrainOptions& t = o.train;
  DF_CHECK_HINT(t.block_size >= 2 && t.block_size <= 256, BadOptions, "--block-size " << t.block_size << " is not in [2, 256]",
                "DFlash drafters use 16");
  DF_CHECK_HINT(t.sliding_window >= 0, BadOptions, "--draft-sliding-window " << t.sliding_window << " is negative",
                "give the keys a sliding layer sees, e.g. 2048");
  int id = -1;
  if (o.mask_token == "auto") t.mask_token_id = -1;
  else if (parse_nonneg_int(o.mask_token, id)) t.mask_token_id = id;
  else t.mask_token_id = token_id_from_tokenizer(o.target_dir, o.mask_token);

  t.target_layer_ids.clear();
  if (!o.target_layers.empty())
    for (const std::string& s : split_list(o.target_layers)) {
      DF_CHECK_HINT(parse_nonneg_int(s, id), BadOptions, "--target-layers " << o.target_layers << ": '" << s << "' is not a layer number",
                    "a comma-separated list of target layers, e.g. 1,16,31,46,61");
      t.target_layer_ids.push_back(id);
    }
  t.layer_types.clear();
  if (!o.draft_layer_types.empty())
    for (const std::string& s : split_list(o.draft_layer_types)) {
      if (s == "full" || s == "full_attention") t.layer_types.push_back("full_attention");
      else if (s == "sliding" || s == "sliding_attention") t.layer_types.push_back("sliding_attention");
      else DF_FAIL(BadOptions, "--draft-layer-types " << o.draft_layer_types << ": '" << s << "' is not full or sliding",
                   "one type per drafter layer, e.g. sliding,sliding,sliding,sliding,full");
    }
  // The counts against --draft-layers and the target's layers are checked where the target's config is
  // known: fresh_drafter_config (called while the inputs are validated, before --out is touched).
}

}  // namespace dflash
