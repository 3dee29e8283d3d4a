// DFlash2's candidate selector on CUDA (the twin of src/ops/selector.cpp; the serving walk stays on the CPU).
#pragma once
#include "dflash/drafter_ops.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// Same contracts as ops::selector_candidates / selector_forward / selector_backward
// (include/dflash/drafter_ops.h), in device memory: ids, labels, gold, argmax, cand, pred I32; covered U8;
// topk_vals, label_logit, unary, scores, ce, row_weight, d_unary F32; u, du F32; P, S (the fp32 master
// codebooks [V, r]) and dP, dS F32 (accumulated with atomics: rows repeat across the batch).
decltype(ops::selector_candidates) selector_candidates;
decltype(ops::selector_forward) selector_forward;
decltype(ops::selector_backward) selector_backward;

}  // namespace dflash::cuda
