// Linear layers through cuBLASLt: bf16 operands, fp32 accumulation, bf16 (or fp32) results.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// out [N, O] (BF16 or F32) = in [N, I] (BF16) · W [O, I]^T (BF16)  (+ out when acc == Accumulate::Yes)
void matmul_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& W, ops::Accumulate acc);
// out [N, O] (BF16) = residual [N, O] (BF16) + in [N, I] · W [O, I]^T: the add in the GEMM's fp32 epilogue
void matmul_residual_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& W,
                             const Tensor& residual);
// din [N, I] (BF16, overwritten; skipped when empty) = dout [N, O] · W [O, I]
// dW [O, I] (BF16 or F32, accumulated; skipped when empty) += dout^T · in [N, I]
void matmul_backward(const Ctx& ctx, const Tensor& din, const Tensor& dW, const Tensor& dout, const Tensor& in,
                     const Tensor& W);

}  // namespace dflash::cuda
