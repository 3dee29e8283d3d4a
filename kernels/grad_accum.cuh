// Gradient accumulation on CUDA: the twins of ops::grad_accumulate / grad_fold (include/dflash/optim.h,
// CPU reference src/ops/grad_accum.cpp). F32 [n] device tensors, any alignment (a fold covers a bucket of
// the flat gradient, which starts where a parameter does).
#pragma once
#include "dflash/optim.h"

namespace dflash::cuda {

void grad_accumulate(const Ctx& ctx, const Tensor& acc, const Tensor& g, float s, ops::AccumInto into);
void grad_fold(const Ctx& ctx, const Tensor& g, const Tensor& acc, float s);

}  // namespace dflash::cuda
