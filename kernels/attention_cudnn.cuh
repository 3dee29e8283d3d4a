// The target's varlen causal GQA attention through cuDNN's fused flash attention (SDPA), the alternative to
// the project's own kernel (attention.cu) where cuDNN runs it faster: on Hopper it uses wgmma/TMA kernels
// that mma.sync cannot match (measured: bench/README.md). Same contract as attention_varlen_causal_forward.
//
// The packed batch is cuDNN's THD layout: Q/K/V/O are [b, heads, S, hd] with strides {-, hd, heads·hd, 1}
// and per-sequence element offsets ("ragged offsets", cu_seqlens[i] · heads · hd) in place of the batch
// stride, a padding mask from the per-sequence lengths, and a top-left causal mask. S is a bound on the
// longest sequence; the kernel's tiles past a sequence's end exit early.
#pragma once
#include <cstdint>

#include "dflash/tensor.h"

namespace dflash::cuda {

// Whether this build has the cuDNN path (cuDNN's frontend headers were found at configure time).
bool attention_cudnn_compiled();

// Runs attention through cuDNN. Returns false, having launched nothing, when cuDNN cannot serve this shape
// on this device (the graph fails to build: a head dim or GPU generation the installed cuDNN lacks, a batch
// whose element offsets overflow int32); the caller runs its own kernel then. The first failure for a shape
// is reported once on stderr with cuDNN's reason. Graphs are built once per (sequence-count bucket, S bucket,
// heads, hd, scale) and kept, with their workspace and offset arrays, for the process's lifetime: the first call of a
// new shape takes tens of milliseconds, later ones none. max_seqlen: the longest sequence's length if the
// caller knows it, else 0 (S is then bounded by T).
// out [T, nh, hd]; q [T, nh, hd]; k, v [T, nkv, hd] (BF16); cu_seqlens [nseq + 1] (I32, device memory).
bool attention_cudnn_forward(const Ctx& ctx, const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& cu_seqlens, float scale, int64_t max_seqlen);

// The graph's per-batch inputs from cu_seqlens, on ctx's stream (attention_cudnn.cu): seq_len[i] = length of
// sequence i, q_off[i] = cu_seqlens[i] · q_elems_per_token, kv_off[i] = cu_seqlens[i] · kv_elems_per_token,
// for i < nseq; entries nseq <= i < b are empty sequences at the end (length 0, offsets of cu_seqlens[nseq]).
// cu_seqlens [nseq + 1]; seq_len [b]; q_off, kv_off [b + 1] (all I32, device memory); b >= nseq.
void attention_cudnn_ragged(const Ctx& ctx, const int32_t* cu_seqlens, int nseq, int b, int32_t q_elems_per_token,
                            int32_t kv_elems_per_token, int32_t* seq_len, int32_t* q_off, int32_t* kv_off);

}  // namespace dflash::cuda
