// Qwen3 per-head QK-norm fused with neox RoPE.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// out/in [N, nh, hd] (BF16; out may alias in), rstd [N, nh] (F32, may be empty), w [hd] (BF16),
// pos [N] (I32, device memory). hd <= 256, rotary_dim even and <= hd.
void head_norm_rope_forward(const Ctx& ctx, const Tensor& out, const Tensor& rstd, const Tensor& in,
                            const Tensor& w, const Tensor& pos, ops::RopeSpec rope, float eps);

}  // namespace dflash::cuda
