// Linear layers through cuBLASLt: bf16 operands, fp32 accumulation, bf16 (or fp32) results.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// out [N, O] (BF16 or F32) = in [N, I] (BF16) · W [O, I]^T (BF16)  (+ out when acc == Accumulate::Yes)
decltype(ops::matmul_forward) matmul_forward;
// out [N, O] (BF16) = residual [N, O] (BF16) + in [N, I] · W [O, I]^T: the add in the GEMM's fp32 epilogue
decltype(ops::matmul_residual_forward) matmul_residual_forward;
// din [N, I] (BF16, overwritten; skipped when empty) = dout [N, O] · W [O, I]
// dW [O, I] (BF16 or F32, accumulated; skipped when empty) += dout^T · in [N, I]
decltype(ops::matmul_backward) matmul_backward;

}  // namespace dflash::cuda
