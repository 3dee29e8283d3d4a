// Prompts and tau, as dflash-eval measures a drafter (apps/dflash-eval.cpp) and as dflash-train's
// --eval-tau-every measures it during training (src/runtime/drafter_tau.cpp): one definition, so the two
// report the same number for the same drafter, prompts and limits.
//
//   prompt of a record = its tokens before the first loss_mask 1 (what dflash-tokenize writes for a chat:
//                        the conversation up to the assistant's answer); records without one, or with a
//                        longer one than max_prompt_length, are skipped and counted
//   tau                = the mean over prompts of each prompt's mean acceptance length (the tokens each
//                        target verification keeps, official_step_count in spec_decode.h), as the
//                        reference benchmark reports it
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dflash/data.h"
#include "dflash/spec_decode.h"

namespace dflash {

// Prompts longer than this are skipped (dflash-eval's --max-prompt-length default; dflash-train lowers it
// where --token-budget leaves less room, src/runtime/drafter_tau.h).
constexpr int kDefaultMaxPromptLength = 2048;
// Prompts decoding together (SpecDecoder::generate_batch): dflash-eval's --prompt-batch default. Enough rows per
// target forward to keep a GPU busier than one short sequence does; each holds prompt + new tokens of the packed
// forward's buffers. (dflash-train's --eval-tau-prompt-batch defaults to 1: there the target copy's packed
// activations sit on a drafter rank beside training, and the dry run's memory plan does not count them.)
constexpr int kDefaultPromptBatch = 16;

struct EvalPrompts {
  std::vector<std::vector<int32_t>> ids;  // the prompts, in record order
  std::vector<size_t> record;             // the record each came from
  size_t no_prompt = 0, too_long = 0;     // records skipped: loss from the first token, prompt too long
  size_t longest() const;                 // tokens of the longest prompt (0 when none)
};

// The first max_prompts usable records' prompts. None usable: fatal BadInput naming the file (`what`
// names the option that gave it, e.g. "--prompts" or "--eval-data") with a hint.
EvalPrompts load_eval_prompts(const TokenDataset& ds, int max_prompts, int max_prompt_length,
                              const std::string& what = "--prompts");

// eos_token_id of the target's config.json and generation_config.json (an int or a list), when present:
// the default stop ids.
std::vector<int32_t> default_stop_ids(const std::string& target_dir);

// Sums over decoded prompts (several drafters decoding a share each: one MPI_SUM of pack() gives the
// numbers of one decoding all). Pure.
struct TauSums {
  double prompts = 0;     // prompts decoded
  double tau_sum = 0;     // sum over prompts of each prompt's tau
  double new_tokens = 0;  // tokens generated
  double steps = 0;       // target verifications
  double accepted = 0;    // sum of acceptance lengths over all steps
  double seconds = 0;     // decoding wall time: add() sums the prompts' own; whoever decodes several together
                          // (their times overlap) sets the wall time of all instead (DrafterTau::measure)
  void add(const SpecDecodeResult& r);
  double tau() const { return prompts > 0 ? tau_sum / prompts : 0.0; }  // dflash-eval's tau
  static constexpr size_t kPacked = 6;
  std::vector<double> pack() const;
  static TauSums unpack(const double* v);
};

}  // namespace dflash
