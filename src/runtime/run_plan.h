// The run resolved once per segment (picotron computes its grid once): the one way the job's inputs walk,
// argv -> Options (what was typed, const after parse_options) -> RunPlan (this file) -> the roles.
//
// ModelPlan: what every rank derives from the options and the target's config.json (the configs, the
// capture layers, the shape of a hidden-state batch, the loader's options), built by plan_job after the
// input paths were checked; --topology auto's measurement and --dry-run take it alone. RunPlan: the
// ModelPlan grown by what one segment of the run decides collectively before any role starts (the split,
// the micro-batches per step, the lr schedule, the eval cadence, the dataset's facts, where it resumes);
// built by plan_segment (src/runtime/job.cpp) and never changed after. A live re-split ends the segment
// with a SegmentEnd and the next segment builds a new plan. Nothing else parses those files or repeats
// these rules.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dflash/checkpoint.h"
#include "dflash/data.h"
#include "dflash/drafter.h"
#include "dflash/eval_set.h"
#include "dflash/hs_batch.h"
#include "dflash/options.h"
#include "dflash/target.h"
#include "run_dir.h"  // RunState

namespace dflash {

struct ModelPlan {
  TargetConfig target;              // the target's config.json (family, widths, its weights' dtype label)
  DrafterConfig drafter;            // --drafter's config.json, or the fresh drafter --draft-layers makes
  std::vector<int> capture_layers;  // the target layers the drafter reads (drafter.target_layer_ids)
  SlotShape slot_shape;             // one hidden-state batch on --backend: targets and drafters agree
  LoaderOptions loader;             // the loader's options every use shares (a target adds its shard)

  // The trainer's inputs: these configs and where the weights are.
  DrafterSource drafter_source(const Options& o) const;
  // What one drafter may keep of --eval-data's features (kEvalShareLimitBytes, or the test hook's), at
  // slot_shape.value_bytes per token (a drafter keeps an eval batch's values, in the backend's dtype, whatever
  // --hs-dtype): --eval-max-tokens auto's budget (the job and --dry-run decide the sample by it).
  EvalBudget eval_budget(const Options& o) const;
};

// Parses the target's (and --drafter's) config.json once and derives the rest. Fatal BadInput on a config
// this build cannot run, BadOptions on recipe options that do not fit the target (--target-layers out of
// range, ...; --draft-layers against its depth is validate_inputs's: a dry run plans without it). The
// caller checked the paths (check_input_paths).
ModelPlan plan_job(const Options& o);

// How a segment starts: the first from the options (--topology, or --topology auto's choice, --resume),
// every later one from the SegmentEnd of the one before (a live re-split, --rebalance auto).
struct SegmentStart {
  TopologySpec split;
  std::string resume;           // --resume as this segment takes it (the checkpoint a re-split continues from)
  // Not the first segment: the run goes on in the same processes, on the split and from the checkpoint the
  // drafters chose (--rebalance auto), not the command line's.
  bool in_place = false;
  std::string auto_record;      // --topology auto: JSON of its measurement, what-if table and choice ("" = none)
};

// How one segment ended: its code (0, ExitCode::Requeue, kResplitCode), and with kResplitCode the split
// every rank takes next and the checkpoint it starts from (the drafters' choice, --rebalance auto).
struct SegmentEnd {
  int code = 0;
  std::optional<TopologySpec> next_split;
  std::string checkpoint;
};

// The learning-rate schedule's shape (include/dflash/schedule.h): known before the first step.
struct Schedule {
  int64_t total_steps = 0;  // the cosine's end (0: the run's length is unknown: constant after the warmup)
  int warmup_steps = 0;
};

// Facts of --data the first target counted while planning the schedule (metrics.h5 stores them).
struct DatasetFacts {
  int64_t tokens = 0;                         // one epoch of --data (a mix: of its slots)
  int64_t long_records_per_epoch = 0;         // records longer than --token-budget ...
  int64_t long_tokens_dropped_per_epoch = 0;  // ... and the tokens the loader drops from them (cut or skip)
};

// Where this segment resumes from (same on every rank); dir "" = a fresh start.
struct ResumeFrom {
  std::string dir;                     // the checkpoint's step directory
  int64_t step = 0;                    // its step
  ResumeSplit split = ResumeSplit::Same;  // Changed: the checkpoint was made on another split
  std::string run_extended;            // "--max-steps 40 -> 80" when a resume changes --epochs / --max-steps
  // AlreadyComplete: the checkpoint is the end of a run whose export is in OUT/drafter, and the resume does
  // not extend it: the job says so and ends (exit 0), changing nothing (run_dir.h).
  RunState state = RunState::GoesOn;
  DataResume data;                     // where every target starts (checkpoint.h)
  std::shared_ptr<const ConsumedRecords> consumed;  // data.consumed, for the targets' loaders
  OptionMap invariants;  // what a checkpoint records and a resume must match: options, world size, the
                         // inputs' content identities (checkpoint.h)
  bool fresh() const { return dir.empty(); }
};

struct RunPlan : ModelPlan {
  SegmentStart segment;     // the split this segment runs and how it began
  int grad_accum = 1;       // micro-batches per optimizer step (--grad-accum, or from --global-batch-tokens)
  TrainOptions train;       // --lr, --loss, ... with the schedule below written in (the trainer's input)
  Schedule schedule;
  int64_t eval_every = -1;  // with --eval-data: steps between evaluations (0 = only after the last)
  DatasetFacts dataset;
  ResumeFrom resume;
  // The resolved options as this segment runs them (the startup line, metrics.h5, checkpoints): the
  // Options' record with what the segment decided written in (grad-accum; topology and resume after a
  // re-split).
  std::vector<std::pair<std::string, std::string>> resolved;

  const TopologySpec& split() const { return segment.split; }
  std::string resolved_json(const Options& o) const;  // Options::to_json's form, of `resolved`
};

// K micro-batches per optimizer step for a job of num_drafters drafters: --grad-accum, or picked from
// --global-batch-tokens (grad_accum_for, schedule.h).
int grad_accum_of(const Options& o, int num_drafters);
// The startup line: K and the tokens per optimizer step.
std::string grad_accum_line(const Options& o, int grad_accum, int num_drafters);

// `resolved` with name's value replaced (an option the segment resolved).
void set_resolved(std::vector<std::pair<std::string, std::string>>& resolved, const std::string& name,
                  const std::string& value);

}  // namespace dflash
