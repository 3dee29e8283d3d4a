// Attention over packed variable-length sequences: causal inside each sequence, grouped-query heads.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// The largest head dim the kernels hold (src/ops/attention_head_dim.h states the rule for the loader).
constexpr int kAttentionMaxHeadDim = 256;

// The kernel variants, all FlashAttention-2 style on mma.sync: one block per (head, query tile), K/V tiles
// streamed through double-buffered shared memory, online softmax in fp32. Auto (what the op uses) picks by
// head dim and by the device's shared memory per block; naming one is for tests and benchmarks.
//   Hd128       hd <= 128 (padded to 128): 4 warps x 32 query rows, K/V tiles of 64; 97 KB of shared memory.
//   Hd256       hd <= 256 (padded to 256): 8 warps x 16 rows, K/V tiles of 64; 193 KB (sm_90, sm_100).
//   Hd256Small  4 warps x 16 rows, K/V tiles of 32; 97 KB (fits sm_120's 99 KB per block).
// H200, 8 x 4096 tokens, causal (bench/results/h200-attention-hd256.txt): hd 256 with 24/4 heads 6.28 ms
// (263 TFLOP/s) on Hd256, 7.23 ms (228) on Hd256Small; hd 128 with 32/8 heads 3.67 ms (299) on Hd128.
//   Cudnn       cuDNN's fused flash attention (attention_cudnn.cuh), where this build has it and cuDNN serves
//               the shape on this device.
// Auto: Cudnn where it serves the shape (it measured faster on the H200: bench/README.md), else the
// project's kernel by head dim; DFLASH_ATTENTION=own keeps Auto on the project's kernels, =cudnn makes a
// shape cuDNN refuses fatal instead of falling back (benchmarks, tests).
enum class AttentionKernel : uint8_t { Auto, Hd128, Hd256, Hd256Small, Cudnn };
const char* attention_kernel_name(AttentionKernel kernel);

// The project's kernel for head dim hd on ctx's device (what Auto runs where cuDNN does not).
AttentionKernel attention_kernel_for(const Ctx& ctx, int hd);
// Whether `kernel` fits ctx's device (its shared memory within the per-block limit).
bool attention_kernel_fits(const Ctx& ctx, AttentionKernel kernel);

// out [T, nh, hd]; q [T, nh, hd]; k, v [T, nkv, hd] (all BF16); cu_seqlens [nseq + 1] (I32, device memory);
// hd a multiple of 8 and at most kAttentionMaxHeadDim (at most 128 for Hd128); nh a multiple of nkv.
// max_seqlen: the longest sequence if the caller knows it (sizes cuDNN's launch), else 0.
// Returns the variant that ran.
AttentionKernel attention_varlen_causal_forward(const Ctx& ctx, const Tensor& out, const Tensor& q, const Tensor& k,
                                                const Tensor& v, const Tensor& cu_seqlens, float scale,
                                                AttentionKernel kernel = AttentionKernel::Auto, int64_t max_seqlen = 0);

}  // namespace dflash::cuda
