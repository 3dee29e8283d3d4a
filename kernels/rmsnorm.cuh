// RMSNorm over rows.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// out [N, C] (BF16) = in [N, C] (BF16) * rstd * w [C] (BF16); rstd [N] (F32) may be empty.
void rmsnorm_forward(const Ctx& ctx, const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& w,
                     float eps);

}  // namespace dflash::cuda
