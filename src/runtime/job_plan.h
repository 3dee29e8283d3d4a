// The job resolved once (picotron computes its grid once): what every rank derives from the options and the
// target's config.json — the configs, the capture layers, the shape of a hidden-state batch, the loader's
// options, the activation dtype — built by plan_job after the input paths were checked and handed down
// (JobContext::plan, --topology auto's measurement, --dry-run). Nothing else parses those files or
// repeats these rules.
#pragma once
#include <string>
#include <vector>

#include "dflash/data.h"
#include "dflash/drafter.h"
#include "dflash/eval_set.h"
#include "dflash/hs_batch.h"
#include "dflash/options.h"
#include "dflash/target.h"

namespace dflash {

struct JobPlan {
  TargetConfig target;              // the target's config.json (family, widths, its weights' dtype label)
  DrafterConfig drafter;            // --drafter's config.json, or the fresh drafter --draft-layers makes
  std::vector<int> capture_layers;  // the target layers the drafter reads (drafter.target_layer_ids)
  SlotShape slot_shape;             // one hidden-state batch on --backend: targets and drafters agree
  LoaderOptions loader;             // the loader's options every use shares (a target adds its shard)

  // The trainer's inputs: these configs and where the weights are.
  DrafterSource drafter_source(const Options& o) const;
  // Bytes one token of a batch takes on the wire (features of every captured layer, + the final norm for
  // --loss kl): what slots, send buffers and kept eval shares are sized by.
  double wire_bytes_per_token() const;
  // What one drafter may keep of --eval-data's features (kEvalShareLimitBytes, or the test hook's), at
  // wire_bytes_per_token: --eval-max-tokens auto's budget (the job and --dry-run decide the sample by it).
  EvalBudget eval_budget(const Options& o) const;
};

// Parses the target's (and --drafter's) config.json once and derives the rest. Fatal BadInput on a config
// this build cannot run, BadOptions on recipe options that do not fit the target (--target-layers out of
// range, ...; --draft-layers against its depth is validate_inputs's: a dry run plans without it). The
// caller checked the paths (check_input_paths).
JobPlan plan_job(const Options& o);

}  // namespace dflash
