// See include/dflash/schedule.h.
#include "dflash/schedule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dflash/error.h"

namespace dflash {

int64_t count_epoch_batches(const RecordSource& ds, const LoaderOptions& opts, int64_t epoch) {
  DF_CHECK(opts.token_budget > 0, BadOptions, "--token-budget must be positive (got " << opts.token_budget << ")");
  const std::vector<int64_t> order =
      Loader::shard_order(ds.num_records(), opts.seed, epoch, opts.shard_index, opts.num_shards, opts.consumed.get());
  int64_t batches = 0;
  for (int64_t cursor = 0; cursor < static_cast<int64_t>(order.size());) {
    const BatchExtent e = pack_extent(ds, order, cursor, opts.token_budget, opts.long_record);
    if (!e.taken.empty()) ++batches;  // only skipped records left: not a batch
    cursor = e.end;
  }
  return batches;
}

PlannedSchedule plan_schedule(const RecordSource& ds, const LoaderOptions& base, int num_targets, int num_drafters,
                              int epochs, int64_t max_steps, int warmup_steps, double warmup_ratio, int grad_accum,
                              const ScheduleStart& from) {
  DF_CHECK(num_targets > 0 && num_drafters > 0, Internal, "plan_schedule: " << num_targets << " targets, " << num_drafters << " drafters");
  DF_CHECK(grad_accum >= 1, Internal, "plan_schedule: grad_accum " << grad_accum);
  DF_CHECK(from.epoch >= 0 && from.steps_done >= 0, Internal, "plan_schedule: from epoch " << from.epoch);
  PlannedSchedule s;
  if (epochs > 0 && from.batches_left >= 0) {
    s.data_batches = from.batches_left;
  } else if (epochs > 0) {
    for (int64_t e = from.epoch; e < epochs; ++e)
      for (int t = 0; t < num_targets; ++t) {
        LoaderOptions o = base;
        o.shard_index = t;
        o.num_shards = num_targets;
        s.data_batches += count_epoch_batches(ds, o, e);
      }
  }
  for (size_t r = 0; r < ds.num_records(); ++r) {
    const int64_t len = ds.record_length(r);
    if (len <= base.token_budget) continue;
    ++s.long_records;
    s.long_tokens_dropped += base.long_record == LongRecord::Skip ? len : len - base.token_budget;
  }
  const int64_t micro_batches = s.data_batches / num_drafters;  // per drafter, in lockstep
  const int64_t data_steps = from.steps_done + (micro_batches + grad_accum - 1) / grad_accum;
  if (epochs > 0 && (max_steps == 0 || data_steps <= max_steps)) {
    s.total_steps = data_steps;
    s.why = std::to_string(s.data_batches) + " batches over " + std::to_string(epochs) + " epoch(s) / " +
            std::to_string(num_drafters) + " drafter(s)" +
            (grad_accum > 1 ? " / " + std::to_string(grad_accum) + " micro-batches per step" : std::string());
    if (from.steps_done > 0 || from.epoch > 0)
      s.why = std::to_string(from.steps_done) + " step(s) done + " + std::to_string(s.data_batches) +
              " batches left of " + std::to_string(epochs) + " epoch(s) / " +
              std::to_string(num_drafters) + " drafter(s)" +
              (grad_accum > 1 ? " / " + std::to_string(grad_accum) + " micro-batches per step" : std::string());
  } else if (max_steps > 0) {
    s.total_steps = max_steps;
    s.why = "--max-steps";
  } else {
    s.why = "--epochs 0 and no --max-steps: no end, no decay";
  }
  s.warmup_steps = warmup_ratio > 0 ? static_cast<int>(std::lround(warmup_ratio * static_cast<double>(s.total_steps)))
                                    : warmup_steps;
  return s;
}

}  // namespace dflash

namespace dflash {

int grad_accum_for(int64_t global_batch_tokens, int64_t token_budget, int num_drafters) {
  DF_CHECK(global_batch_tokens > 0 && token_budget > 0 && num_drafters > 0, Internal,
           "grad_accum_for(" << global_batch_tokens << ", " << token_budget << ", " << num_drafters << ")");
  // token_budget <= INT32_MAX: the product does not overflow
  const int64_t k = micro_batches_for(global_batch_tokens, token_budget * num_drafters);
  DF_CHECK_HINT(k <= kMostMicroBatches, BadOptions, "--global-batch-tokens " << global_batch_tokens << " needs " << k
                                                                  << " micro-batches per step",
                "give a global batch near the reference recipes' (~98K to ~262K tokens)");
  return static_cast<int>(k);
}

}  // namespace dflash
