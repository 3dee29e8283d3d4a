// The learning-rate schedule (see include/dflash/optim.h): linear warmup, then cosine decay to
// min_lr_ratio x lr at total_steps. Training policy, not an op: it stays with the drafter (src/drafter/).
#include <algorithm>
#include <cmath>

#include "dflash/optim.h"

namespace dflash {

double lr_schedule(int64_t step, double lr, int warmup_steps, int64_t total_steps, double min_lr_ratio) {
  if (warmup_steps > 0 && step < warmup_steps) return lr * static_cast<double>(step + 1) / warmup_steps;
  if (total_steps <= warmup_steps) return lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
}

}  // namespace dflash
