// Ops of the Qwen3.5 / Qwen3.6 hybrid target (Gated DeltaNet linear attention and the gated full
// attention), forward only: the target is frozen. Same conventions as dflash/ops.h (plain functions over
// Tensor views, dispatched on ctx.device). CPU float32 implementations are the reference (every tensor F32).
// CUDA twins (kernels/causal_conv1d, gdn_gates, gated_delta_rule, gated_rmsnorm, sigmoid_gate; fp32 math,
// dtypes per op below) exist for every op here; the gated delta rule on CUDA also needs a workspace.
//
// Packed sequences: every op that mixes tokens takes cu_seqlens [nseq + 1] (I32, running 0..T) and starts
// each sequence from a zero state (zero conv history, zero recurrent state), which is what running each
// sequence on its own through Hugging Face's Qwen3_5ForCausalLM gives. cu_seqlens lives where the backend
// computes, as for attention_varlen_causal_forward: host memory on the CPU (checked there), device memory
// on CUDA (trusted by the kernels: the caller copies it from a checked PackedBatch, and a check would need
// a host sync).
//
// The zero-centred RMSNorm of Qwen3.5 (x * (1 + w)) needs no op of its own on either backend: the weight
// loader stores 1 + w, so rmsnorm_forward / head_norm_rope_forward run it as a plain RMSNorm. (On CUDA that
// stored 1 + w is bf16, a per-channel gain off by up to 2^-8 relative, where HF multiplies by 1 + w in fp32.)
#pragma once
#include "dflash/tensor.h"

namespace dflash::ops {

// Head layout of a Gated DeltaNet layer (config linear_*): nk key heads of dk dims (shared by q and k),
// nv value heads of dv dims; nv is a multiple of nk and value head h reads key head h / (nv / nk)
// (torch repeat_interleave). The fused projection `qkv` holds, per token, q [nk*dk] | k [nk*dk] | v [nv*dv].
struct GdnHeads {
  int64_t nk = 0, dk = 0, nv = 0, dv = 0;
  int64_t key_dim() const { return nk * dk; }
  int64_t value_dim() const { return nv * dv; }
  int64_t qkv_dim() const { return 2 * nk * dk + nv * dv; }
};

// Depthwise causal conv1d followed by SiLU, per channel c and token t of a sequence starting at s0:
//   out[t, c] = silu( sum_{j<K} w[c, j] * in[t - (K-1) + j, c] ),  in[u] = 0 for u < s0.
// out, in [T, C] (out must not alias in); w [C, K] (the checkpoint's conv1d.weight [C, 1, K]).
// CUDA: out, in, w BF16; K <= 8; any C (16-byte vectors over channels when C % 8 == 0).
void causal_conv1d_silu_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& w,
                                const Tensor& cu_seqlens);

// The per-token gates of the delta rule, per value head h:
//   g[t, h] = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h])   (log-space decay, <= 0)
//   beta[t, h] = sigmoid(b[t, h])                                (write strength)
// g, beta, a, b [T, nv]; A_log, dt_bias [nv]. softplus as torch (linear above 20).
// CUDA: g, beta F32 (they feed the delta rule's exp and products); a, b BF16 (the projections' dtype) or
// F32; A_log, dt_bias F32 (as the loader keeps them) or BF16.
void gdn_gates_forward(const Ctx& ctx, const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& b,
                       const Tensor& A_log, const Tensor& dt_bias);

// The gated delta rule (recurrent form), per sequence and value head h with key head kh = h / (nv / nk):
//   q = l2norm(q_kh) * dk^-1/2, k = l2norm(k_kh)     (l2norm(x) = x / sqrt(sum x^2 + 1e-6))
//   S = exp(g) S;  S += k (beta (v - S^T k))^T;  out = S^T q      (S [dk, dv], zero at sequence start)
// out [T, nv*dv]; qkv [T, heads.qkv_dim()] (after the conv); g, beta [T, nv];
// state [nv, dk, dv] is workspace (holds the last sequence's final state on return).
// CUDA (kernels/gated_delta_rule: chunked, UT transform, tensor cores): out, qkv BF16; g, beta F32 or BF16;
// state F32; dk, dv multiples of 8 up to 128. `workspace` is required there: BF16 with at least
// gated_delta_rule_workspace_elems(T, heads) elements (the per-chunk inverse of the UT system, 64 values per
// token and value head: 201 MB at T = 32768, nv = 48), allocated once by the caller for the largest T and
// reused by every layer. The CPU ignores it (may be empty).
void gated_delta_rule_forward(const Ctx& ctx, const Tensor& out, const Tensor& state, const Tensor& qkv,
                              const Tensor& g, const Tensor& beta, const Tensor& cu_seqlens, GdnHeads heads,
                              const Tensor& workspace = Tensor());
inline int64_t gated_delta_rule_workspace_elems(int64_t T, const GdnHeads& heads) { return T * heads.nv * 64; }

// Gated RMSNorm (Qwen3_5RMSNormGated; plain weight, not zero-centred), per row of C:
//   out = in * rsqrt(mean(in^2) + eps) * w * silu(z)
// out, in, z [N, C] (out may alias in); w [C].
// CUDA: out, in, z BF16; w BF16 or F32; C <= 1024.
void gated_rmsnorm_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& z, const Tensor& w,
                           float eps);

// Output gate of the gated full attention: out = x * sigmoid(gate). out, x, gate [N, C] (out may alias x).
// CUDA: all BF16.
void sigmoid_gate_forward(const Ctx& ctx, const Tensor& out, const Tensor& x, const Tensor& gate);

}  // namespace dflash::ops
