// dflash-prep: converts pre-tokenized JSONL records into a dflash token dataset (docs/data.md).
//
//   dflash-prep IN.jsonl OUT.h5 (--vocab-size N | --target DIR) [--tokenizer NAME] [--require-mask]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dflash/data.h"
#include "dflash/error.h"
#include "dflash/safe_file.h"
#include "dflash/tool_args.h"
#include "dflash/version.h"
#include "dflash/hf_config.h"
#include "dflash/jsonl_prep.h"

using namespace dflash;

static const char* kUsage =
    "usage: dflash-prep IN.jsonl OUT.h5 (--vocab-size N | --target DIR) [--tokenizer NAME] [--require-mask]\n"
    "       dflash-prep --help | --version\n"
    "  IN.jsonl: one record per line, {\"input_ids\": [...], \"loss_mask\": [...]} or {\"input_ids\": [...],\n"
    "            \"labels\": [...]} (Hugging Face labels: -100 = no loss, else the input id); with neither, every\n"
    "            token is trained on; other fields are reported once each, and not used\n"
    "  --vocab-size N  ids must be < N;  --target DIR  take N from DIR/config.json\n"
    "  --tokenizer NAME  stored as the dataset's tokenizer attribute (e.g. Qwen/Qwen3-8B)\n"
    "  --require-mask    a record with neither loss_mask nor labels is an error (exit 3) instead of all 1\n";

int main(int argc, char** argv) {
  if (dflash::print_version_if_asked(argc, argv, "dflash-prep")) return 0;
  process_identity().role = "tool";
  std::string in, out, target, tokenizer = "unknown";
  int vocab = 0;
  JsonlPrepOptions options;
  options.progress = Progress::Stderr;
  ToolArgs args(argc, argv, kUsage);
  while (args.next()) {
    if (args.help()) {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (args.is("--vocab-size")) {
      vocab = static_cast<int>(args.integer(1, (1LL << 31) - 1));
    } else if (args.is("--target")) {
      target = args.value();
    } else if (args.is("--tokenizer")) {
      tokenizer = args.value();
    } else if (args.is("--require-mask")) {
      args.no_value();
      options.require_mask = true;
    } else if (args.positional() && in.empty()) {
      in = args.arg();
    } else if (args.positional() && out.empty()) {
      out = args.arg();
    } else {
      args.unknown();
    }
  }
  DF_CHECK_HINT(!in.empty() && !out.empty(), BadOptions, "need IN.jsonl and OUT.h5", kUsage);
  DF_CHECK_HINT((vocab > 0) != !target.empty(), BadOptions, "give exactly one of --vocab-size and --target", kUsage);
  DF_CHECK_HINT(!is_same_file(in, out), BadOptions, "OUT.h5 " << out << " is the input " << in << ": refused (it would "
                "overwrite its own input)", "give another output path");
  if (!target.empty()) vocab = load_qwen3_config(target + "/config.json").vocab_size;

  JsonlPrepStats stats;
  PrepResult r = convert_jsonl_to_dataset(in, out, vocab, tokenizer, options, &stats);
  std::printf("dflash-prep: wrote %s: %lld records, %lld tokens (%lld with loss), vocab %d\n", out.c_str(),
              static_cast<long long>(r.records), static_cast<long long>(r.tokens), static_cast<long long>(r.loss_tokens),
              vocab);
  std::printf("dflash-prep: records with loss_mask %lld, with labels %lld, with neither (all tokens trained) %lld\n",
              static_cast<long long>(stats.records_with_loss_mask), static_cast<long long>(stats.records_with_labels),
              static_cast<long long>(stats.records_without_mask));
  if (!stats.unused_fields.empty()) {
    std::string names;
    for (const std::string& f : stats.unused_fields) names += (names.empty() ? "" : ", ") + f;
    std::printf("dflash-prep: fields not used: %s\n", names.c_str());
  }
  return 0;
}
