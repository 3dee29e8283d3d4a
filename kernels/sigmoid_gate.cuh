// Output gate of the Qwen3.5 gated full attention.
#pragma once
#include "dflash/tensor.h"
#include "ops/gated_delta.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// out, x, gate: same numel (BF16; out may alias x). out = x * sigmoid(gate), in fp32.
decltype(ops::sigmoid_gate_forward) sigmoid_gate_forward;

}  // namespace dflash::cuda
