// Device-side random fill for benchmarks and tests (random weights of a model shape without a checkpoint).
#pragma once
#include <cstdint>

#include "dflash/tensor.h"

namespace dflash::cuda {

// t (BF16 or F32, device) = mean + uniform noise of standard deviation `stddev`, a pure function of
// (seed, element index): the same seed gives the same tensor on any GPU.
void fill_random(const Ctx& ctx, const Tensor& t, uint64_t seed, float mean, float stddev);

}  // namespace dflash::cuda
