// Gated RMSNorm (Qwen3_5RMSNormGated): the Gated DeltaNet output norm, per value head.
#pragma once
#include "dflash/tensor.h"

namespace dflash::cuda {

// out, in, z [N, C] (BF16; out may alias in); w [C] (BF16 or F32; a plain weight, not zero-centred);
// 1 <= C <= 1024. Per row, in fp32: out = in * rsqrt(mean(in^2) + eps) * w * silu(z).
void gated_rmsnorm_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& z, const Tensor& w,
                           float eps);

}  // namespace dflash::cuda
