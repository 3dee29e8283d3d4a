// JSONL of pre-tokenized records -> token dataset (what dflash-prep runs).
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dflash/data.h"
#include "dflash/error.h"

namespace dflash {

namespace {

// Reads an integer array field; fatal BadInput naming file:line on anything else.
template <class T>
void read_int_array(const nlohmann::json& j, const char* field, const std::string& where, int64_t lo, int64_t hi,
                    std::vector<T>& out) {
  const nlohmann::json& a = j.at(field);
  DF_CHECK(a.is_array(), BadInput, where << ": \"" << field << "\" must be an array of integers");
  out.clear();
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const nlohmann::json& v = a[i];
    DF_CHECK(v.is_number_integer(), BadInput,
             where << ": \"" << field << "\"[" << i << "] is " << v.dump() << ", not an integer");
    const int64_t x = v.get<int64_t>();
    DF_CHECK_HINT(x >= lo && x < hi, BadInput,
                  where << ": \"" << field << "\"[" << i << "] = " << x << " is outside [" << lo << ", " << hi << ")",
                  std::string(field) == "input_ids" ? "tokenize with the target's tokenizer (--vocab-size / --target)"
                                                    : "loss_mask entries are 0 (context) or 1 (train on it)");
    out.push_back(static_cast<T>(x));
  }
}

}  // namespace

TokenRecords read_jsonl_records(const std::string& jsonl_path, int vocab_size, Progress progress) {
  DF_CHECK(vocab_size > 0, BadOptions, "vocab size must be positive (got " << vocab_size << ")");
  std::ifstream in(jsonl_path);
  DF_CHECK(in.good(), BadInput, "cannot open " << jsonl_path);
  struct stat st;
  const double total_bytes = ::stat(jsonl_path.c_str(), &st) == 0 ? static_cast<double>(st.st_size) : 0;

  TokenRecords records;
  std::string line;
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  int64_t line_no = 0;
  auto last_report = std::chrono::steady_clock::now();
  bool reported = false;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = jsonl_path + ":" + std::to_string(line_no);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    DF_CHECK_HINT(!j.is_discarded(), BadInput, where << ": not valid JSON",
                  "one record per line: {\"input_ids\": [...], \"loss_mask\": [...]}");
    DF_CHECK(j.is_object() && j.contains("input_ids"), BadInput, where << ": no \"input_ids\" field");
    read_int_array(j, "input_ids", where, 0, vocab_size, ids);
    DF_CHECK(!ids.empty(), BadInput, where << ": \"input_ids\" is empty");
    mask.clear();
    if (j.contains("loss_mask") && !j.at("loss_mask").is_null()) {
      read_int_array(j, "loss_mask", where, 0, 2, mask);
      DF_CHECK(mask.size() == ids.size(), BadInput,
               where << ": \"loss_mask\" has " << mask.size() << " entries for " << ids.size() << " input_ids");
    }
    records.add(ids, mask);

    if (progress == Progress::Stderr) {
      auto now = std::chrono::steady_clock::now();
      if (now - last_report > std::chrono::seconds(1)) {
        const double done = static_cast<double>(in.tellg());
        std::fprintf(stderr, "\rdflash-prep: %lld records, %lld tokens (%.0f%% of %s)",
                     static_cast<long long>(records.num_records()), static_cast<long long>(records.num_tokens()),
                     total_bytes > 0 && done >= 0 ? 100.0 * done / total_bytes : 0.0, jsonl_path.c_str());
        std::fflush(stderr);
        last_report = now;
        reported = true;
      }
    }
  }
  DF_CHECK(!in.bad(), SystemFailure, "error reading " << jsonl_path);
  if (reported) std::fprintf(stderr, "\n");
  DF_CHECK(records.num_records() > 0, BadInput, jsonl_path << " holds no records");
  return records;
}

PrepResult convert_jsonl_to_dataset(const std::string& jsonl_path, const std::string& out_path, int vocab_size,
                                    const std::string& tokenizer, Progress progress) {
  TokenRecords records = read_jsonl_records(jsonl_path, vocab_size, progress);
  write_token_dataset(out_path, records, vocab_size, tokenizer);
  PrepResult r;
  r.records = static_cast<int64_t>(records.num_records());
  r.tokens = records.num_tokens();
  for (uint8_t m : records.loss_mask) r.loss_tokens += m;
  return r;
}

}  // namespace dflash
