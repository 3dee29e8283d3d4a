// Output gate of the Qwen3.5 gated full attention.
#pragma once
#include "dflash/tensor.h"

namespace dflash::cuda {

// out, x, gate: same numel (BF16; out may alias x). out = x * sigmoid(gate), in fp32.
void sigmoid_gate_forward(const Ctx& ctx, const Tensor& out, const Tensor& x, const Tensor& gate);

}  // namespace dflash::cuda
