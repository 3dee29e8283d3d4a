// JSONL of pre-tokenized records -> token dataset (what dflash-prep runs).
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dflash/data.h"
#include "dflash/error.h"
#include "dflash/jsonl_prep.h"

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
                  : std::string(field) == "labels"  ? "labels are the input ids, or -100 where there is no loss"
                                                    : "loss_mask entries are 0 (context) or 1 (train on it)");
    out.push_back(static_cast<T>(x));
  }
}

}  // namespace

TokenRecords read_jsonl_records(const std::string& jsonl_path, int vocab_size, Progress progress) {
  JsonlPrepOptions o;
  o.progress = progress;
  return read_jsonl_records(jsonl_path, vocab_size, o, nullptr);
}

TokenRecords read_jsonl_records(const std::string& jsonl_path, int vocab_size, const JsonlPrepOptions& options,
                                JsonlPrepStats* stats_out) {
  DF_CHECK(vocab_size > 0, BadOptions, "vocab size must be positive (got " << vocab_size << ")");
  std::ifstream in(jsonl_path);
  DF_CHECK(in.good(), BadInput, "cannot open " << jsonl_path);
  struct stat st;
  const double total_bytes = ::stat(jsonl_path.c_str(), &st) == 0 ? static_cast<double>(st.st_size) : 0;

  JsonlPrepStats stats;
  TokenRecords records;
  std::string line;
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<int64_t> labels;
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
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      if (k == "input_ids" || k == "loss_mask" || k == "labels") continue;
      if (std::find(stats.unused_fields.begin(), stats.unused_fields.end(), k) != stats.unused_fields.end()) continue;
      stats.unused_fields.push_back(k);
      if (reported) std::fprintf(stderr, "\n");
      std::fprintf(stderr, "dflash-prep: warning: %s: field \"%s\" is not used (said once per field; the record "
                   "is input_ids + loss_mask or labels)\n", where.c_str(), k.c_str());
    }
    read_int_array(j, "input_ids", where, 0, vocab_size, ids);
    DF_CHECK(!ids.empty(), BadInput, where << ": \"input_ids\" is empty");
    mask.clear();
    const bool has_mask = j.contains("loss_mask") && !j.at("loss_mask").is_null();
    const bool has_labels = j.contains("labels") && !j.at("labels").is_null();
    if (has_mask) {
      read_int_array(j, "loss_mask", where, 0, 2, mask);
      DF_CHECK(mask.size() == ids.size(), BadInput,
               where << ": \"loss_mask\" has " << mask.size() << " entries for " << ids.size() << " input_ids");
      ++stats.records_with_loss_mask;
    }
    if (has_labels) {
      read_int_array(j, "labels", where, -100, vocab_size, labels);
      DF_CHECK(labels.size() == ids.size(), BadInput,
               where << ": \"labels\" has " << labels.size() << " entries for " << ids.size() << " input_ids");
      for (size_t i = 0; i < labels.size(); ++i) {
        DF_CHECK_HINT(labels[i] == -100 || labels[i] == ids[i], BadInput,
                      where << ": \"labels\"[" << i << "] = " << labels[i] << " is neither -100 nor input_ids[" << i
                            << "] = " << ids[i],
                      "labels are input_ids with -100 where there is no loss (Hugging Face's convention, not "
                      "shifted: the model shifts them)");
        const uint8_t m = labels[i] == -100 ? 0 : 1;
        if (has_mask) {
          DF_CHECK(mask[i] == m, BadInput,
                   where << ": \"loss_mask\"[" << i << "] = " << int(mask[i]) << " disagrees with \"labels\"[" << i
                         << "] = " << labels[i] << " (-100 means no loss)");
        } else {
          mask.push_back(m);
        }
      }
      ++stats.records_with_labels;
    }
    if (!has_mask && !has_labels) {
      DF_CHECK_HINT(!options.require_mask, BadInput,
                    where << ": no \"loss_mask\" or \"labels\" (--require-mask)",
                    "without --require-mask such a record trains on every token");
      ++stats.records_without_mask;
    }
    records.add(ids, mask);

    if (options.progress == Progress::Stderr) {
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
  if (stats_out) *stats_out = stats;
  return records;
}

PrepResult convert_jsonl_to_dataset(const std::string& jsonl_path, const std::string& out_path, int vocab_size,
                                    const std::string& tokenizer, Progress progress) {
  JsonlPrepOptions o;
  o.progress = progress;
  return convert_jsonl_to_dataset(jsonl_path, out_path, vocab_size, tokenizer, o, nullptr);
}

PrepResult convert_jsonl_to_dataset(const std::string& jsonl_path, const std::string& out_path, int vocab_size,
                                    const std::string& tokenizer, const JsonlPrepOptions& options,
                                    JsonlPrepStats* stats) {
  TokenRecords records = read_jsonl_records(jsonl_path, vocab_size, options, stats);
  write_token_dataset(out_path, records, vocab_size, tokenizer);
  PrepResult r;
  r.records = static_cast<int64_t>(records.num_records());
  r.tokens = records.num_tokens();
  for (uint8_t m : records.loss_mask) r.loss_tokens += m;
  return r;
}

}  // namespace dflash
