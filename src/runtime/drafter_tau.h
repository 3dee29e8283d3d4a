// --eval-tau-every (docs/pipeline.md "Evaluation"): the drafter ranks measure the acceptance length tau of
// the drafter they train, exactly as dflash-eval measures an exported one (include/dflash/spec_decode.h:
// greedy speculative decoding with the target verifying; include/dflash/eval_prompts.h: the prompts and
// the definition of tau). Each drafter rank loads its own copy of the target for the verification (the
// factory the target ranks use), decodes its share of the eval set's first --eval-tau-prompts prompts
// (prompt i on drafter i % D) with --eval-tau-max-new-tokens new tokens each, and the sums over the
// drafters make the /eval row's tau. The targets wait for credits meanwhile: a measurement must end
// within --peer-timeout.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dflash/drafter.h"
#include "dflash/eval_prompts.h"
#include "dflash/metrics.h"
#include "dflash/options.h"
#include "dflash/spec_decode.h"
#include "dflash/target.h"
#include "job.h"

namespace dflash {

// The longest prompt decoded: dflash-eval's default limit (kDefaultMaxPromptLength), lowered where the
// trainer's --token-budget buffers leave less room for prompt + new tokens + block. Fatal BadOptions when
// not even a one-token prompt fits.
int tau_max_prompt_length(const Options& o, int block_size);
// The prompts, read on the drafter ranks by validate_inputs (before --out is touched): fatal BadInput when
// the eval set has none that fits. block_size: the drafter's (ModelPlan::drafter).
std::shared_ptr<const EvalPrompts> load_tau_prompts(const Options& o, int block_size, const TokenDataset& eval_data);
// tau is measured after optimizer step `step`: every --eval-tau-every steps, and at the run's last step
// when it is known in advance (--max-steps, or the steps planned from the data); the end of training adds
// one when it was not.
bool tau_due(int64_t step, const Options& o, const RunPlan& plan);

class DrafterTau {
 public:
  // Loads the target (slow: before the job's load barrier). trainer must outlive this.
  DrafterTau(const JobContext& job, DrafterTrainer& trainer);
  ~DrafterTau();
  DrafterTau(const DrafterTau&) = delete;
  DrafterTau& operator=(const DrafterTau&) = delete;

  // This drafter's share, decoded with the trainer's current weights; progress() runs after each prompt
  // (the caller's messages keep moving).
  TauSums measure(const std::function<void()>& progress);
  // The /eval row's tau fields from the sums over every drafter.
  static void fill(EvalMetrics& m, const TauSums& all);

 private:
  const JobContext& job_;
  std::vector<size_t> mine_;  // indices into job.tau_prompts
  std::vector<int32_t> stop_;
  std::unique_ptr<TargetModel> target_;
  std::unique_ptr<SpecDecoder> decoder_;
};

}  // namespace dflash
