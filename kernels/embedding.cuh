// Token embedding gather.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// out [T, H] (BF16) = table [V, H] (BF16) rows at tokens [T] (I32, device memory). An id outside [0, V)
// writes a zero row and flags the backend; synchronize(ctx) then fails with BadInput.
void embedding_forward(const Ctx& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table);

}  // namespace dflash::cuda
