// Depthwise causal conv1d + SiLU over packed variable-length sequences (the Gated DeltaNet's short conv).
#pragma once
#include "dflash/tensor.h"
#include "ops/gated_delta.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// out, in [T, C] (BF16; out must not alias in); w [C, K] (BF16, 1 <= K <= 8); cu_seqlens [nseq + 1] (I32 in
// device memory, running 0..T and non-decreasing, as attention_varlen_causal_forward takes it: the kernel
// trusts it, a host check would cost a sync). Per token t of the sequence starting at s0, in fp32:
//   out[t, c] = silu(sum_{j<K} w[c, j] * in[t - (K-1) + j, c]),  taps before s0 read zero.
decltype(ops::causal_conv1d_silu_forward) causal_conv1d_silu_forward;

}  // namespace dflash::cuda
