// Gaussian noise on the drafter's fused target features on CUDA (hs-noise, a regulariser; the CPU twin is
// the Rng draw in DrafterNet::forward, src/drafter/drafter_net.cpp, which uses its own generator: same
// distribution, different numbers).
#pragma once
#include <cstdint>

#include "dflash/tensor.h"

namespace dflash::cuda {

// x (BF16 [n], device) += sigma * z_i, z_i ~ N(0, 1), a pure function of (seed, counter, element index i):
// the same (seed, counter) gives the same noise on any GPU and after a resume, a new counter (one per
// training forward) fresh noise. The backward is the identity (the noise is additive and detached).
void add_feature_noise(const Ctx& ctx, const Tensor& x, float sigma, uint64_t seed, uint64_t counter);

}  // namespace dflash::cuda
