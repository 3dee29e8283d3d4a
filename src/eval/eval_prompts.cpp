// Prompts and tau sums: include/dflash/eval_prompts.h.
#include "dflash/eval_prompts.h"

#include <algorithm>

#include "dflash/error.h"
#include "io/json_file.h"

namespace dflash {

size_t EvalPrompts::longest() const {
  size_t n = 0;
  for (const auto& p : ids) n = std::max(n, p.size());
  return n;
}

EvalPrompts load_eval_prompts(const TokenDataset& ds, int max_prompts, int max_prompt_length, const std::string& what) {
  EvalPrompts p;
  std::vector<int32_t> tok;
  std::vector<uint8_t> mask;
  for (size_t r = 0; r < ds.num_records() && static_cast<int>(p.ids.size()) < max_prompts; ++r) {
    tok.clear();
    mask.clear();
    ds.read_record(r, tok, mask);
    const size_t first = static_cast<size_t>(std::find(mask.begin(), mask.end(), uint8_t{1}) - mask.begin());
    if (first == 0) {
      ++p.no_prompt;
    } else if (first > static_cast<size_t>(max_prompt_length)) {
      ++p.too_long;
    } else {
      p.ids.emplace_back(tok.begin(), tok.begin() + static_cast<std::ptrdiff_t>(first));
      p.record.push_back(r);
    }
  }
  DF_CHECK_HINT(!p.ids.empty(), BadInput,
                what << " " << ds.path() << ": no usable prompt (" << p.no_prompt << " records train from their first token, "
                     << p.too_long << " prompts longer than " << max_prompt_length << " tokens)",
                "prompts are the tokens before a record's first loss_mask 1: tokenize chats with dflash-tokenize");
  return p;
}

std::vector<int32_t> default_stop_ids(const std::string& dir) {
  std::vector<int32_t> ids;
  for (const char* name : {"config.json", "generation_config.json"}) {
    const JsonFile f = try_read_json_file(dir + "/" + name);  // either may be missing (or not JSON): no ids from it
    if (!f.ok() || !f.value.contains("eos_token_id")) continue;
    const nlohmann::json& e = f.value["eos_token_id"];
    auto add = [&](const nlohmann::json& v) {
      if (v.is_number_integer() && std::find(ids.begin(), ids.end(), v.get<int32_t>()) == ids.end())
        ids.push_back(v.get<int32_t>());
    };
    if (e.is_array())
      for (const auto& v : e) add(v);
    else
      add(e);
  }
  return ids;
}

void TauSums::add(const SpecDecodeResult& r) {
  prompts += 1;
  tau_sum += r.tau();
  new_tokens += static_cast<double>(r.tokens.size());
  steps += static_cast<double>(r.acceptance.size());
  for (int a : r.acceptance) accepted += a;
  seconds += r.seconds;
}

std::vector<double> TauSums::pack() const { return {prompts, tau_sum, new_tokens, steps, accepted, seconds}; }

TauSums TauSums::unpack(const double* v) {
  TauSums s;
  s.prompts = v[0];
  s.tau_sum = v[1];
  s.new_tokens = v[2];
  s.steps = v[3];
  s.accepted = v[4];
  s.seconds = v[5];
  return s;
}

}  // namespace dflash
