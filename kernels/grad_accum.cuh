// Gradient accumulation on CUDA: the twins of ops::grad_accumulate / grad_fold (include/dflash/optim.h,
// CPU reference src/ops/grad_accum.cpp). F32 [n] device tensors, any alignment (a fold covers a bucket of
// the flat gradient, which starts where a parameter does).
#pragma once
#include "dflash/optim.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).
decltype(ops::grad_accumulate) grad_accumulate;
decltype(ops::grad_fold) grad_fold;

}  // namespace dflash::cuda
