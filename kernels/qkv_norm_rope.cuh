// The target's attention input from one fused q|k|v GEMM: QK-norm + neox RoPE on the q and k heads, v copied.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// qkv [T, (nh + 2 nkv) * hd] (BF16) -> q [T, nh, hd], k [T, nkv, hd] (normed and rotated), v [T, nkv, hd]
// (copied), all BF16 and not overlapping qkv; q_norm, k_norm [hd] (BF16), pos [T] (I32, device memory).
// hd <= 256, rotary_dim (resolved, not 0) even and <= hd.
decltype(ops::qkv_norm_rope_forward) qkv_norm_rope_forward;

}  // namespace dflash::cuda
