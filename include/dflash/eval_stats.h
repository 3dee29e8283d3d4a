// Held-out evaluation's numbers (--eval-data, docs/pipeline.md "Evaluation"): what one eval batch adds,
// and the sum over batches and drafters. Sums of counts, not means of means, so several drafters that
// each evaluate a share give exactly the numbers of one drafter evaluating the whole set. Pure.
#pragma once
#include <cstdint>
#include <vector>

#include "dflash/drafter.h"  // StepStats
#include "dflash/metrics.h"  // EvalMetrics

namespace dflash {

struct EvalSums {
  explicit EvalSums(int block_size = 0);
  int block_size = 0;
  double weighted_loss = 0, weight_sum = 0;  // sum of w * loss and of w over the loss rows
  double rows = 0, correct = 0;              // loss rows, rows whose argmax is the label
  double streak_sum = 0, anchors = 0;        // sum over blocks of the leading correct run; blocks
  double tokens = 0, seqs = 0;
  std::vector<double> pos_rows, pos_correct;  // [block_size]

  // One evaluated batch (DrafterTrainer::evaluate) of `seqs` sequences.
  void add(const StepStats& st, int64_t seqs);
  // As one flat vector, for one MPI_SUM over the drafters; unpack(a + b) = the sums of both.
  std::vector<double> pack() const;
  static EvalSums unpack(const std::vector<double>& v, int block_size);
  // The /eval row (step, time_s and seconds are the caller's).
  EvalMetrics metrics() const;
};

// --eval-every: a given value (>= 0) wins; otherwise the --checkpoint-every step interval when there is one,
// else a tenth of the run's planned steps (at least 1); 0 (only at the end) when the run has no planned end.
int64_t resolve_eval_every(int64_t given, int64_t checkpoint_every_steps, int64_t planned_steps);
// An evaluation after optimizer step `step`: every `every` steps counted from 0 (absolute, so a resumed run
// keeps the schedule). The end of training adds one when its step was not due.
inline bool eval_due(int64_t step, int64_t every) { return every > 0 && step > 0 && step % every == 0; }

}  // namespace dflash
