// The per-token gates of the gated delta rule: log-space decay g and write strength beta.
#pragma once
#include "dflash/tensor.h"
#include "ops/gated_delta.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// g, beta [T, nv] (F32: both feed the delta rule's exponentials and products, which bf16 would round to
// 3 digits); a, b [T, nv] (BF16 from the projections, or F32; the same dtype); A_log, dt_bias [nv] (F32 as
// the hybrid's weight loader keeps them, or BF16; the same dtype). Per element, in fp32:
//   g = -exp(A_log[h]) * softplus(a + dt_bias[h])  (torch softplus: linear above 20);  beta = sigmoid(b).
decltype(ops::gdn_gates_forward) gdn_gates_forward;

}  // namespace dflash::cuda
