// Qwen3 per-head QK-norm fused with neox RoPE.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// out/in [N, nh, hd] (BF16; out may alias in), rstd [N, nh] (F32, may be empty), w [hd] (BF16),
// pos [N] (I32, device memory). hd <= 256, rotary_dim even and <= hd.
decltype(ops::head_norm_rope_forward) head_norm_rope_forward;

}  // namespace dflash::cuda
