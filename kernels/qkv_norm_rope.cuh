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

// The kernel of the register shapes (hd = rotary_dim = 64, 128, 256; kernels/qkv_norm_rope.cu): Default is
// Warp12 (DFLASH_QKV_NORM_ROPE=warp or unset); Block is the block-per-token kernel the warp kernel replaced,
// bit for bit the same outputs (the bench and the GPU test compare them); WarpN caps a warp's job at N
// 16-byte chunks a lane at hd 128 (hd 64 and 256 always take 8). Until this is called,
// DFLASH_QKV_NORM_ROPE=block|warp|warp6|warp12|warp24 decides.
enum class QkvNormRopeKernel : int { Default, Block, Warp6, Warp12, Warp24 };
void set_qkv_norm_rope_kernel(QkvNormRopeKernel kernel);

}  // namespace dflash::cuda
