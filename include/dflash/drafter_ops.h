// Drafter-specific ops: block-prefix attention, the chunked lm_head loss, and DFlash2's grouped dynamic
// causal convolution and candidate selector (docs/dflash2.md sections 2-3 give the math they follow).
//
// Same conventions as dflash/ops.h: plain forward/backward functions over Tensor views, dispatched on
// ctx.device; the CPU float32 versions (src/ops/block_attention.cpp, src/ops/lm_loss.cpp) are the
// reference a CUDA twin is tested against.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "dflash/error.h"
#include "dflash/hf_config.h"
#include "dflash/tensor.h"

namespace dflash::ops {

// ---- block-prefix attention (DFlash training) -------------------------------------------------------
// N blocks of B query rows each. Block n belongs to the packed sequence that starts at global token
// seq_begin[n] and is anchored at global token anchors[n]. A query at block offset o sees
//   - context keys j of its own sequence strictly before the anchor: seq_begin[n] <= j < anchors[n]
//     (sliding window W > 0: also j >= anchors[n] + o - (W - 1)),
//   - keys of its own block: every offset (full attention) or offsets <= o (sliding window),
// and nothing of other blocks or sequences. No dense mask is ever built.
struct BlockAttnSpec {
  int block_size = 16;  // B
  int window = 0;       // sliding window W; 0 = full attention
  float scale = 1.0f;   // usually head_dim^-0.5
  // Sliding layers only: every query row sees its whole block (a DFlash2 release's is_causal: false; the
  // window then bounds the context alone). false = the block is causal in sliding layers (DFlash's rule).
  bool full_block = false;
  // Forward only: each block keeps its first block_rows rows (1..B): keys at later offsets of the block are
  // hidden from every query, as if the block were block_rows long. Speculative decoding's last block: the
  // official dflash_generate drafts only the tokens left before its limit (docs/recipe.md section 6).
  // Queries at those later offsets are still computed (from the same visible keys) and mean nothing.
  // 0 = the whole block (training; the backward takes nothing else).
  int block_rows = 0;
  int visible_block_rows() const { return block_rows > 0 ? block_rows : block_size; }
};
// The spec of drafter layer `layer`: the config's block size, head_dim^-0.5, and its sliding window when
// layer_types names that layer "sliding_attention". One rule for the CPU net and the CUDA step (inline: the
// two libraries share only the base one, a floor below the drafter's config).
inline BlockAttnSpec drafter_attn_spec(const DrafterConfig& c, size_t layer) {
  BlockAttnSpec s;
  s.block_size = c.block_size;
  s.scale = 1.0f / std::sqrt(static_cast<float>(c.layers.head_dim));
  const auto& types = c.layers.layer_types;
  if (layer < types.size() && types[layer] == "sliding_attention") {
    s.window = c.layers.sliding_window;
    s.full_block = c.is_causal == 0;  // config.json's is_causal: false (docs/dflash2.md 2.6)
  }
  return s;
}
// The one check of spec.block_rows, by every implementation's entry (the CPU ops and the CUDA launchers,
// which the drafter's CUDA step calls directly): 0..B for the forward; the whole block for the backward.
enum class AttnPass { Forward, Backward };
inline void check_block_rows(const char* op, const BlockAttnSpec& s, AttnPass pass) {
  DF_CHECK(s.block_rows >= 0 && s.block_rows <= s.block_size, Internal,
           op << ": block_rows " << s.block_rows << " outside 0.." << s.block_size);
  DF_CHECK(pass == AttnPass::Forward || s.visible_block_rows() == s.block_size, Internal,
           op << ": a backward over blocks of " << s.block_rows << " of " << s.block_size
              << " rows (block_rows is forward-only)");
}
// out [N*B, nh, hd]; lse [N*B, nh] (log-sum-exp of the scaled scores, saved for backward);
// q [N*B, nh, hd]; k_ctx, v_ctx [T, nkv, hd] (context keys/values of the whole packed batch);
// k_blk, v_blk [N*B, nkv, hd]; anchors, seq_begin [N] (I32, host memory on CPU).
// nh must be a multiple of nkv (GQA: query head h reads kv head h / (nh / nkv)).
// spec.block_rows in 0..B (forward); the backward requires the whole block (block_rows 0 or B).
void block_attention_forward(const Ctx& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                             const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk,
                             const Tensor& anchors, const Tensor& seq_begin, const BlockAttnSpec& spec);
// All input gradients are OVERWRITTEN: dq [N*B, nh, hd]; dk_ctx, dv_ctx [T, nkv, hd] (rows no block sees
// are zero); dk_blk, dv_blk [N*B, nkv, hd]. out and lse are the forward's outputs.
void block_attention_backward(const Ctx& ctx, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                              const Tensor& dk_blk, const Tensor& dv_blk, const Tensor& dout, const Tensor& out,
                              const Tensor& lse, const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx,
                              const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors,
                              const Tensor& seq_begin, const BlockAttnSpec& spec);

// ---- lm_head + softmax + loss, in chunks of rows -------------------------------------------------------
// R loss rows (only rows with a positive weight are passed). For each row r:
//   logits_q = h[r] · lm_head^T, q = softmax(logits_q)                  (the drafter)
//   logits_p = teacher[r] · lm_head^T, p = softmax(logits_p)            (the target; only if teacher given)
//   ce[r] = -log q[label[r]];  kl[r] = sum_i p_i (log p_i - log q_i)
// Logits exist for `chunk_rows` rows at a time (workspace), never for all R rows at once.
//
// The drafter's logits may be transformed first (DFlash2's compute_logits; the identity for DFlash):
//   logits_q = c * tanh(m * h[r] · lm_head^T / c)     (m = multiplier; the tanh only when softcap c > 0)
// The teacher's logits are never transformed (they are the target's own).
struct LogitSpec {
  float multiplier = 1.f;
  float softcap = 0.f;  // 0 = off
  bool identity() const { return multiplier == 1.f && softcap == 0.f; }
};
// A drafter config's compute_logits (DrafterConfig::output_multiplier, final_logit_softcapping).
inline LogitSpec logit_spec(const DrafterConfig& c) { return {c.output_multiplier, c.final_logit_softcapping}; }
// The transform of one drafter logits row of V entries, in place: z = c tanh(m x / c) (softcap c > 0), else
// m x. The CPU loss (src/ops/lm_loss.cpp) and speculative decoding's DFlash drafter rows
// (src/eval/spec_decode.cpp) both apply this one; kernels/lm_loss.cu is its CUDA twin.
inline void transform_logits_in_place(float* x, int64_t V, const LogitSpec& spec) {
  if (spec.identity()) return;
  const float m = spec.multiplier, c = spec.softcap;
  for (int64_t i = 0; i < V; ++i) x[i] = c > 0.f ? c * std::tanh(m * x[i] / c) : m * x[i];
}
struct LmLossRowsOut {
  Tensor ce;        // [R] F32
  Tensor kl;        // [R] F32, empty = skip (needs teacher)
  Tensor argmax_q;  // [R] I32
  Tensor argmax_p;  // [R] I32, empty = skip (needs teacher)
  // DFlash2's selector inputs, computed in the same chunked pass (empty = skip; all three or none):
  Tensor topk_ids;     // [R, K] I32: the K largest transformed drafter logits, descending, ties by lower id
  Tensor topk_vals;    // [R, K] F32: their values
  Tensor label_logit;  // [R] F32: the transformed drafter logit of labels[r]
};
enum class LossObjective : uint8_t { CE, KL };
// Workspace [chunk_rows, V] F32 for the drafter logits and, when a teacher is given, the same again
// for the teacher logits: lm_loss_workspace_floats() says how many floats (the CPU op and the CUDA step size
// it by this one rule).
inline size_t lm_loss_workspace_floats(int64_t chunk_rows, int64_t vocab, bool with_teacher) {
  return static_cast<size_t>(chunk_rows) * static_cast<size_t>(vocab) * (with_teacher ? 2u : 1u);
}
// h [R, H]; lm_head [V, H]; labels [R] I32; teacher [R, H] or empty; workspace as above.
// Fused gradient (optional): when dh [R, H] is non-empty, also writes dh = d(sum_r w[r]·loss[r])/dh for the
// `objective` with row weights row_weight [R] (already divided by the global weight sum) in the same pass
// (no recompute). Used when the weights are known before the forward (no D-PACE).
void lm_loss_forward(const Ctx& ctx, const LmLossRowsOut& out, const Tensor& h, const Tensor& lm_head,
                     const Tensor& labels, const Tensor& teacher, const Tensor& workspace, int64_t chunk_rows,
                     const Tensor& dh = Tensor(), const Tensor& row_weight = Tensor(),
                     LossObjective objective = LossObjective::CE, const LogitSpec& logit = LogitSpec());
// dh [R, H] (overwritten) = d(sum_r row_weight[r] · loss[r] + sum_{r,i} extra_dz[r, i] · logits_q[r, extra_ids[r, i]])
// / dh, recomputing the logits chunk by chunk. teacher is required for KL. extra_ids [R, K] I32 / extra_dz [R, K]
// F32 (optional, both or none): a sparse gradient at the transformed logits, already weighted (DFlash2's
// selector term), added before the transform's chain rule; a repeated id within a row adds up.
void lm_loss_backward(const Ctx& ctx, const Tensor& dh, const Tensor& row_weight, LossObjective objective,
                      const Tensor& h, const Tensor& lm_head, const Tensor& labels, const Tensor& teacher,
                      const Tensor& workspace, int64_t chunk_rows, const LogitSpec& logit = LogitSpec(),
                      const Tensor& extra_ids = Tensor(), const Tensor& extra_dz = Tensor());

// The sparse addend alone, for a gradient whose dense part came from lm_loss_forward's fused pass (DFlash2's
// selector term needs the top-K that pass produces, so it can only follow it):
//   dh[r] += sum_i dz[r, i] * slope(z[r, i]) * lm_head[ids[r, i]]        (ACCUMULATED)
// with z [R, K] the transformed logits at ids [R, K] I32 (the selector's unary scores) and slope the LogitSpec's
// derivative m (1 - (z / c)^2) (or m). R x K rows of lm_head are read: no logits are recomputed. `extra` [R, H]
// (optional) is added in the same pass (the selector's du W_h: on CUDA one bf16 rounding of dh instead of two).
void lm_loss_sparse_backward(const Ctx& ctx, const Tensor& dh, const Tensor& ids, const Tensor& z, const Tensor& dz,
                             const Tensor& lm_head, const LogitSpec& logit, const Tensor& extra = Tensor());

// ---- DFlash2: grouped dynamic causal convolution ------------------------------------------------------
// Rows are N blocks of B consecutive rows; row t sits at block offset t % B; no tap crosses a block.
// G = H / group_size groups of channels; one GroupedDynamicCausalConv has two sides (0 = prepare, before
// the sublayer; 1 = finish, after it), each with its own base kernel and half of the dynamic kernel:
//   out[t, c] = sum_{j < k, j <= t % B} (base[j, c] + dyn[t, side, j, c / group_size]) * in[t - j, c]
struct GroupedConvSpec {
  int block_size = 16;  // B
  int kernel_size = 2;  // k taps (tap j reaches j rows back; tap 0 is the row itself)
  int group_size = 16;  // channels per group
};
// out, in [R, H] (out must not alias in); dyn [R, 2 * k * G] (the kernel projection's output, both sides:
// column side*k*G + j*G + g); base [k, H] (base_kernel[side]). R a multiple of B.
void grouped_conv_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& dyn, int side,
                          const Tensor& base, const GroupedConvSpec& spec);
// din [R, H] OVERWRITTEN; d_dyn [R, 2kG]: its `side` half OVERWRITTEN (the other half untouched);
// dbase [k, H] ACCUMULATED.
//   din[t, c]            = sum_j (base[j, c] + dyn[t+j, side, j, g]) dout[t+j, c]   over t+j in t's block
//   d_dyn[t, side, j, g] = sum_{c in g} dout[t, c] in[t-j, c]                       (0 when j > t % B)
//   dbase[j, c]         += sum_t dout[t, c] in[t-j, c]                               (j <= t % B)
void grouped_conv_backward(const Ctx& ctx, const Tensor& din, const Tensor& d_dyn, const Tensor& dbase,
                           const Tensor& dout, const Tensor& in, const Tensor& dyn, int side, const Tensor& base,
                           const GroupedConvSpec& spec);

// ---- DFlash2: candidate selector ----------------------------------------------------------------------
// Training candidates from lm_loss_forward's top-K (the one place that applies SelectorCandidates):
// cand [R, K] I32 = topk_ids; unary [R, K] F32 = topk_vals (the transformed logits of cand); gold [R] I32
// the label's slot; covered [R] U8 = label within the top-K. A row whose label is missing gets
//   Insert: the label put into slot K-1 (cand), its label_logit there (unary), gold = K-1;
//   Strict: cand and unary untouched, gold = -1: the row has no selector term (selector_forward's ce is 0,
//           selector_backward gives it no gradient), as serving never sees that label among the candidates.
void selector_candidates(const Ctx& ctx, const Tensor& cand, const Tensor& unary, const Tensor& gold,
                         const Tensor& covered, const Tensor& topk_ids, const Tensor& topk_vals,
                         const Tensor& labels, const Tensor& label_logit, SelectorCandidates mode);
// u [R, r] = h W_h^T (the caller's matmul_forward). Per row, P and S the codebooks [V, r]:
//   scores[r, i] = unary[r, i] + sum_q P[pred[r], q] u[r, q] S[cand[r, i], q]
//   ce[r] = logsumexp_i scores[r, i] - scores[r, gold[r]] (0 where gold[r] = -1: no selector term);
//   argmax[r] = the best slot (ties: lower slot)
// scores [R, K] F32; ce [R] F32 and gold [R] (both empty = scores and argmax only); argmax [R] I32.
void selector_forward(const Ctx& ctx, const Tensor& scores, const Tensor& ce, const Tensor& argmax, const Tensor& u,
                      const Tensor& unary, const Tensor& cand, const Tensor& pred, const Tensor& gold,
                      const Tensor& P, const Tensor& S);
// The gradient of sum_r row_weight[r] ce[r], with g[r, i] = row_weight[r] (softmax(scores[r])_i - [i = gold[r]])
// (a row with gold[r] = -1 has none: its weight counts as 0):
//   d_unary[r, i] = g[r, i]                                         OVERWRITTEN (empty = skip)
//   du[r, q]      = P[pred[r], q] sum_i g[r, i] S[cand[r, i], q]     OVERWRITTEN
//   dP[pred[r]]  += u[r] * sum_i g[r, i] S[cand[r, i]]               ACCUMULATED (rows pred only)
//   dS[cand[r,i]]+= g[r, i] P[pred[r]] * u[r]                        ACCUMULATED (rows cand only)
// (dh += du W_h and dW_h += du^T h are the caller's matmul_backward.)
void selector_backward(const Ctx& ctx, const Tensor& d_unary, const Tensor& du, const Tensor& dP, const Tensor& dS,
                       const Tensor& scores, const Tensor& row_weight, const Tensor& u, const Tensor& cand,
                       const Tensor& pred, const Tensor& gold, const Tensor& P, const Tensor& S);
// The serving walk (official CandidateSelector.select), CPU only: per block n of N, rows k = 0..B-2
// (the block's positions 1..B-1), the predecessor starting at anchor[n]:
//   s_k(i) = unary[n, k, i] + < P[prev] * u[n, k], S[cand[n, k, i]] >
//   T == 0: i* = argmax_i s_k (ties: lower slot);  T > 0: q[n, k] = softmax(s_k / T), i* drawn from q by `uniform`
//   path[n, k] = cand[n, k, i*]; prev = path[n, k]
// path [N, B-1] I32; q [N, B-1, K] F32 (T > 0; may be empty at T == 0); cand/unary [N, B-1, K]; u [N, B-1, r];
// anchor [N] I32. `uniform` returns U[0, 1) draws (needed when T > 0).
void selector_walk(const Ctx& ctx, const Tensor& path, const Tensor& q, const Tensor& cand, const Tensor& unary,
                   const Tensor& u, const Tensor& anchor, const Tensor& P, const Tensor& S, float temperature,
                   const std::function<double()>& uniform = {});

}  // namespace dflash::ops
