// RMSNorm over rows, and the target forward's fused residual add + RMSNorm.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// out [N, C] (BF16) = in [N, C] (BF16) * rstd * w [C] (BF16); rstd [N] (F32) may be empty.
void rmsnorm_forward(const Ctx& ctx, const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& w,
                     float eps);
// resid [N, C] += x [N, C]; out = rmsnorm(resid) * w (all BF16; the sum is rounded to bf16 before the
// norm, as a bf16 residual stream holds it); rstd [N] (F32) may be empty.
void residual_rmsnorm_forward(const Ctx& ctx, const Tensor& resid, const Tensor& out, const Tensor& rstd,
                              const Tensor& x, const Tensor& w, float eps);

}  // namespace dflash::cuda
