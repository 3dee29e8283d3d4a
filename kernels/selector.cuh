// DFlash2's candidate selector on CUDA (the twin of src/ops/selector.cpp; the serving walk stays on the CPU).
#pragma once
#include "dflash/drafter_ops.h"

namespace dflash::cuda {

// Same contracts as ops::selector_candidates / selector_forward / selector_backward
// (include/dflash/drafter_ops.h), in device memory: ids, labels, gold, argmax, cand, pred I32; covered U8;
// topk_vals, label_logit, unary, scores, ce, row_weight, d_unary F32; u, du F32; P, S (the fp32 master
// codebooks [V, r]) and dP, dS F32 (accumulated with atomics: rows repeat across the batch).
void selector_candidates(const Ctx& ctx, const Tensor& cand, const Tensor& unary, const Tensor& gold,
                         const Tensor& covered, const Tensor& topk_ids, const Tensor& topk_vals,
                         const Tensor& labels, const Tensor& label_logit);
void selector_forward(const Ctx& ctx, const Tensor& scores, const Tensor& ce, const Tensor& argmax, const Tensor& u,
                      const Tensor& unary, const Tensor& cand, const Tensor& pred, const Tensor& gold,
                      const Tensor& P, const Tensor& S);
void selector_backward(const Ctx& ctx, const Tensor& d_unary, const Tensor& du, const Tensor& dP, const Tensor& dS,
                       const Tensor& scores, const Tensor& row_weight, const Tensor& u, const Tensor& cand,
                       const Tensor& pred, const Tensor& gold, const Tensor& P, const Tensor& S);

}  // namespace dflash::cuda
