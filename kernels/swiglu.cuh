// SwiGLU activation of the MLP.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// out [N, I] = silu(gate [N, I]) * up [N, I]  (BF16; out may alias gate or up)
void swiglu_forward(const Ctx& ctx, const Tensor& out, const Tensor& gate, const Tensor& up);

}  // namespace dflash::cuda
