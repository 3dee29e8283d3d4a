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

double selector_alpha_schedule(int64_t step, double alpha, double warmup_ratio, double ramp_ratio,
                               int64_t total_steps) {
  if (alpha <= 0 || total_steps <= 0) return alpha;
  const double total = static_cast<double>(total_steps);
  const int64_t warmup = static_cast<int64_t>(total * warmup_ratio);  // Python's int(): toward zero
  if (step < warmup) return 0.0;
  const int64_t ramp = static_cast<int64_t>(total * ramp_ratio);
  if (ramp <= 0) return alpha;
  const double progress = static_cast<double>(step - warmup + 1) / static_cast<double>(ramp);
  return alpha * std::min(std::max(progress, 0.0), 1.0);
}

}  // namespace dflash
