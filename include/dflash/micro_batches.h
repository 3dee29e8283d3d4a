// The micro-batches per optimizer step: one rule for the job (grad_accum_for, include/dflash/schedule.h, which
// adds its checks) and the layout plan (src/plan/layout_plan.cpp, which prices every split with it). Plain
// integer arithmetic, header-only: the plan library links the base library only.
#pragma once
#include <cstdint>

namespace dflash {

// The most micro-batches per optimizer step, given (--grad-accum) or derived (--global-batch-tokens): far
// beyond any recipe (they step on ~98K to ~262K tokens), and no counter of them can overflow.
constexpr int kMostMicroBatches = 1 << 20;

// ceil(global_batch_tokens / tokens_per_micro_batch), at least 1, without global + per - 1 (which overflowed
// near INT64_MAX to 1). tokens_per_micro_batch: --token-budget x the drafters (> 0).
inline int64_t micro_batches_for(int64_t global_batch_tokens, int64_t tokens_per_micro_batch) {
  const int64_t k = global_batch_tokens / tokens_per_micro_batch +
                    (global_batch_tokens % tokens_per_micro_batch != 0 ? 1 : 0);
  return k < 1 ? 1 : k;
}

}  // namespace dflash
