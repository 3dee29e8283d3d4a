// Attention over packed variable-length sequences: causal inside each sequence, grouped-query heads.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// out [T, nh, hd]; q [T, nh, hd]; k, v [T, nkv, hd] (all BF16); cu_seqlens [nseq + 1] (I32, device memory);
// hd <= 128 and a multiple of 8; nh a multiple of nkv. FlashAttention-2 style: one block per (head,
// 128-query tile), K/V tiles of 64 streamed through shared memory, online softmax in fp32.
void attention_varlen_causal_forward(const Ctx& ctx, const Tensor& out, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& cu_seqlens, float scale);

}  // namespace dflash::cuda
