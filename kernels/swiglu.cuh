// SwiGLU activation of the MLP.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// out [N, I] = silu(gate [N, I]) * up [N, I]  (BF16; out may alias gate or up)
decltype(ops::swiglu_forward) swiglu_forward;

// out [N, I] = silu(gate_up [N, 2I][:, :I]) * gate_up[:, I:]  (BF16; out must not overlap gate_up)
decltype(ops::swiglu_fused_forward) swiglu_fused_forward;

// swiglu_fused_forward + the per-token e4m3 quantization of its bf16 output in one pass (one block per row;
// I % 8 == 0; I > 32768 runs the two kernels, out required there).
decltype(ops::swiglu_fp8_forward) swiglu_fp8_forward;

}  // namespace dflash::cuda
