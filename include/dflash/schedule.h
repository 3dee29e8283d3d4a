// The learning-rate schedule's length: how many drafter steps a run will take, known before it starts.
//
// The loader's packing is a pure function of the record lengths and the options (each shard's records in
// the seeded order of the epoch, whole records up to --token-budget, longer ones cut or skipped:
// src/data/loader.cpp), so the batches of every shard and epoch can be counted without reading a token.
// Each drafter step trains one batch per drafter and the run stops when the first drafter runs dry, so a
// run of E epochs takes floor(sum of batches / drafters) micro-batches, and with --grad-accum K (K
// micro-batches per optimizer step) ceil(that / K) optimizer steps: the last one may hold fewer micro-batches
// (the end of the data mid-step trains on what it saw). --max-steps caps it, in optimizer steps. With it the cosine
// decays to its floor at the run's real end instead of never (total_steps 0: constant after warmup).
#pragma once
#include <cstdint>
#include <string>

#include "dflash/data.h"
#include "dflash/micro_batches.h"  // kMostMicroBatches, micro_batches_for

namespace dflash {

// Batches the loader packs from shard opts.shard_index / opts.num_shards in `epoch` (0-based), exactly as
// Loader::run does: empty batches (only skipped records left) are not batches.
int64_t count_epoch_batches(const RecordSource& ds, const LoaderOptions& opts, int64_t epoch);

struct PlannedSchedule {
  int64_t total_steps = 0;    // cosine reaches min_lr_ratio * lr here (0: no decay)
  int warmup_steps = 0;
  int64_t data_batches = 0;   // batches of all shards over all epochs (0 when --epochs 0)
  // Records longer than --token-budget, and the tokens the loader drops from them, in every epoch (each
  // record is read once per epoch by one shard): cut to the budget, or left out whole with LongRecord::Skip.
  int64_t long_records = 0;
  int64_t long_tokens_dropped = 0;
  std::string why;            // how total_steps was chosen, for the startup line
};

// Where the planned part of the run starts: a fresh run at epoch 0 with no step done; a run resumed on
// another split (docs/checkpoint.md "Changing the split") with the checkpoint's steps done and the batches its
// targets will still send (their positions may be inside an epoch), so the cosine ends where the data now ends.
struct ScheduleStart {
  int64_t epoch = 0;
  int64_t steps_done = 0;
  int64_t batches_left = -1;  // >= 0: the batches the targets will still send (data_batches_left), not counted again
};

// epochs 0 (forever) with max_steps 0: no end, so no decay (total 0). warmup_ratio > 0 sets the warmup to
// that fraction of total_steps (rounded); otherwise warmup_steps is kept.
PlannedSchedule plan_schedule(const RecordSource& ds, const LoaderOptions& base, int num_targets, int num_drafters,
                              int epochs, int64_t max_steps, int warmup_steps, double warmup_ratio, int grad_accum = 1,
                              const ScheduleStart& from = {});

// --global-batch-tokens T: the micro-batches per optimizer step that reach T tokens at most --token-budget
// per micro-batch on each of num_drafters drafters, ceil(T / (token_budget x num_drafters)), at least 1.
int grad_accum_for(int64_t global_batch_tokens, int64_t token_budget, int num_drafters);

}  // namespace dflash
