// Gated RMSNorm (Qwen3_5RMSNormGated): the Gated DeltaNet output norm, per value head.
#pragma once
#include "dflash/tensor.h"
#include "ops/gated_delta.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// out, in, z [N, C] (BF16; out may alias in); w [C] (BF16 or F32; a plain weight, not zero-centred);
// 1 <= C <= 1024. Per row, in fp32: out = in * rsqrt(mean(in^2) + eps) * w * silu(z).
decltype(ops::gated_rmsnorm_forward) gated_rmsnorm_forward;

}  // namespace dflash::cuda
