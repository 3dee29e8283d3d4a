// Token embedding gather.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// out [T, H] (BF16) = table [V, H] (BF16) rows at tokens [T] (I32, device memory). An id outside [0, V)
// writes a zero row and flags the backend; synchronize(ctx) then fails with BadInput.
decltype(ops::embedding_forward) embedding_forward;

}  // namespace dflash::cuda
