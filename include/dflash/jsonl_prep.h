// dflash-prep's options beyond data.h's read_jsonl_records / convert_jsonl_to_dataset (which call these with
// the defaults): HF-style "labels" as the mask, --require-mask, and what the conversion noticed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dflash/data.h"

namespace dflash {

// Each non-blank line: {"input_ids": [...], "loss_mask": [0|1, ...], "labels": [...]}.
//  - "labels" (Hugging Face convention, unshifted): -100 = no loss, any other entry must equal the input id
//    at that position (a shifted or foreign label is a fatal BadInput naming the line);
//  - with both "loss_mask" and "labels" they must agree;
//  - with neither the record trains on every token, unless require_mask: then it is a fatal BadInput;
//  - any other field is reported once per field name on stderr ("field \"text\" is not used") and listed in
//    JsonlPrepStats::unused_fields; nothing is ignored silently.
struct JsonlPrepOptions {
  bool require_mask = false;
  Progress progress = Progress::Quiet;
};
struct JsonlPrepStats {
  int64_t records_with_loss_mask = 0;
  int64_t records_with_labels = 0;        // the mask came from (or was checked against) "labels"
  int64_t records_without_mask = 0;       // neither: every token trained on
  std::vector<std::string> unused_fields;  // in the order first seen
};

TokenRecords read_jsonl_records(const std::string& jsonl_path, int vocab_size, const JsonlPrepOptions& options,
                                JsonlPrepStats* stats);
PrepResult convert_jsonl_to_dataset(const std::string& jsonl_path, const std::string& out_path, int vocab_size,
                                    const std::string& tokenizer, const JsonlPrepOptions& options,
                                    JsonlPrepStats* stats);

}  // namespace dflash
