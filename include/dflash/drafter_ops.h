// Drafter-specific ops: block-prefix attention and the chunked lm_head loss.
//
// Same conventions as dflash/ops.h: plain forward/backward functions over Tensor views, dispatched on
// ctx.device; the CPU float32 versions (src/ops/block_attention.cpp, src/ops/lm_loss.cpp) are the
// reference a CUDA twin is tested against.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

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
};
// The spec of drafter layer `layer`: the config's block size, head_dim^-0.5, and its sliding window when
// layer_types names that layer "sliding_attention". One rule for the CPU net and the CUDA step (both
// libraries link it: src/base/op_rules.cpp).
BlockAttnSpec drafter_attn_spec(const DrafterConfig& c, size_t layer);
// out [N*B, nh, hd]; lse [N*B, nh] (log-sum-exp of the scaled scores, saved for backward);
// q [N*B, nh, hd]; k_ctx, v_ctx [T, nkv, hd] (context keys/values of the whole packed batch);
// k_blk, v_blk [N*B, nkv, hd]; anchors, seq_begin [N] (I32, host memory on CPU).
// nh must be a multiple of nkv (GQA: query head h reads kv head h / (nh / nkv)).
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
struct LmLossRowsOut {
  Tensor ce;        // [R] F32
  Tensor kl;        // [R] F32, empty = skip (needs teacher)
  Tensor argmax_q;  // [R] I32
  Tensor argmax_p;  // [R] I32, empty = skip (needs teacher)
};
enum class LossObjective : uint8_t { CE, KL };
// Workspace [chunk_rows, V] F32 for the drafter logits and, when a teacher is given, the same again
// for the teacher logits: lm_loss_workspace_floats() says how many floats (src/base/op_rules.cpp: the
// CPU op and the CUDA step size it by this one rule).
size_t lm_loss_workspace_floats(int64_t chunk_rows, int64_t vocab, bool with_teacher);
// h [R, H]; lm_head [V, H]; labels [R] I32; teacher [R, H] or empty; workspace as above.
// Fused gradient (optional): when dh [R, H] is non-empty, also writes dh = d(sum_r w[r]·loss[r])/dh for the
// `objective` with row weights row_weight [R] (already divided by the global weight sum) in the same pass
// (no recompute). Used when the weights are known before the forward (no D-PACE).
void lm_loss_forward(const Ctx& ctx, const LmLossRowsOut& out, const Tensor& h, const Tensor& lm_head,
                     const Tensor& labels, const Tensor& teacher, const Tensor& workspace, int64_t chunk_rows,
                     const Tensor& dh = Tensor(), const Tensor& row_weight = Tensor(),
                     LossObjective objective = LossObjective::CE);
// dh [R, H] (overwritten) = d(sum_r row_weight[r] · loss[r]) / dh, recomputing the logits chunk by chunk.
// teacher is required for KL.
void lm_loss_backward(const Ctx& ctx, const Tensor& dh, const Tensor& row_weight, LossObjective objective,
                      const Tensor& h, const Tensor& lm_head, const Tensor& labels, const Tensor& teacher,
                      const Tensor& workspace, int64_t chunk_rows);

}  // namespace dflash::ops
