// Block-prefix attention of DFlash training on CUDA (the twin of src/ops/block_attention.cpp).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "dflash/drafter_ops.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// Same contract as ops::block_attention_forward/backward (include/dflash/drafter_ops.h), with
// q/k/v/out/dout and every gradient BF16, lse F32, anchors/seq_begin I32 in device memory.
//
// How (fused path, the default where it applies): see block_attention_fused_common.cuh (the design, and
// which file holds which kernel).
// How (chunked path): blocks are cut into chunks whose context key range [min visible start, max anchor) and row count
// keep the score matrix under a fixed budget; per chunk and head the context part is a dense product
// through cuBLAS (scores in fp32, probabilities in bf16, masked to each query's visible range by a
// softmax kernel), and the block's own B keys (seen by that block alone) are handled inside small kernels.
// With anchors in increasing order (the sampler's), a chunk's key range is close to what its blocks see.
decltype(ops::block_attention_forward) block_attention_forward;
decltype(ops::block_attention_backward) block_attention_backward;

// The same, with anchors/seq_begin also given in host memory (the training step has them there): no
// device-to-host copy, so no stream synchronization inside the op. Host and device copies must agree.
void block_attention_forward(const Ctx& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                             const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk,
                             const Tensor& anchors, const Tensor& seq_begin, const std::vector<int32_t>& anchors_host,
                             const std::vector<int32_t>& seq_begin_host, const ops::BlockAttnSpec& spec);
void block_attention_backward(const Ctx& ctx, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                              const Tensor& dk_blk, const Tensor& dv_blk, const Tensor& dout, const Tensor& out,
                              const Tensor& lse, const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx,
                              const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors,
                              const Tensor& seq_begin, const std::vector<int32_t>& anchors_host,
                              const std::vector<int32_t>& seq_begin_host, const ops::BlockAttnSpec& spec);

// Which implementation runs. Fused: the fused flash-style kernels (kernels/block_attention_fused_*.cu) where
// they apply (head dim 16/32/64/128 with G·B <= 64 query rows per kv head and block; head dim 256 with
// G·B <= 96 and B <= 32, the Qwen3.6-27B drafter's 24/4 heads x 256 with B 16; the current device's opt-in
// shared memory per block large enough for the kernels' tiles, which sm_90/sm_100 (227 KB) are and sm_120
// (99 KB) is not for head dims 128 and 256; 16-byte aligned tensors), else the chunked path. Chunked: the
// chunked cuBLAS path above. Default: Fused, because on the H200 the 8b step measured 158.0 ms with it and
// 186.9 ms with the chunked path (bench/README-drafter.md); the environment variable
// DFLASH_BLOCK_ATTENTION=fused|chunked overrides the default (benchmarks).
enum class BlockAttentionImpl : int { Default, Chunked, Fused };
void set_block_attention_impl(BlockAttentionImpl impl);
// Whether Fused runs the fused kernels for this shape on the current device (alignment aside).
bool block_attention_fused_supported(int64_t nh, int64_t nkv, int64_t hd, int64_t block_size);

// The fused kernels themselves (same contract; callers go through the functions above).
bool block_attention_fused_usable(std::initializer_list<const Tensor*> tensors);
void block_attention_fused_forward(const Ctx& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                                   const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk,
                                   const Tensor& anchors, const Tensor& seq_begin, const ops::BlockAttnSpec& spec);
void block_attention_fused_backward(const Ctx& ctx, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                                    const Tensor& dk_blk, const Tensor& dv_blk, const Tensor& dout, const Tensor& out,
                                    const Tensor& lse, const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx,
                                    const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors,
                                    const Tensor& seq_begin, const ops::BlockAttnSpec& spec);

// Testing knob: the score elements one chunk may hold (0 = the default, 192 Mi). Small budgets force many
// chunks, so tests cover the chunk loop on small shapes.
void set_block_attention_score_budget(int64_t elements);

}  // namespace dflash::cuda
