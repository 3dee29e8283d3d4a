// SwiGLU activation of the MLP.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// out [N, I] = silu(gate [N, I]) * up [N, I]  (BF16; out may alias gate or up)
void swiglu_forward(const Ctx& ctx, const Tensor& out, const Tensor& gate, const Tensor& up);

// out [N, I] = silu(gate_up [N, 2I][:, :I]) * gate_up[:, I:]  (BF16; out must not overlap gate_up)
void swiglu_fused_forward(const Ctx& ctx, const Tensor& out, const Tensor& gate_up);

}  // namespace dflash::cuda
