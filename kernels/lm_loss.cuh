// lm_head + softmax + CE/KL loss over chunks of rows on CUDA (the twin of src/ops/lm_loss.cpp).
#pragma once
#include "dflash/drafter_ops.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// Same contracts as ops::lm_loss_forward / ops::lm_loss_backward (include/dflash/drafter_ops.h) with
// h, lm_head, teacher and dh BF16; labels I32, row_weight and the outputs F32/I32, all in device memory;
// workspace F32 [lm_loss_workspace_floats(chunk_rows, V, teacher given)].
//
// Per chunk of rows: fp32 logits through cuBLAS into the workspace (drafter, then teacher), one fused
// kernel per row (online max / sum / argmax / KL in a single pass over both rows, then the logits
// gradient w·(q - onehot) or w·(q - p) written as bf16 over the start of the same fp32 row), and
// dh = grad · lm_head straight from the workspace (leading dimension 2V). The logits never exist for
// more than chunk_rows rows; the gradient costs no extra memory.
// DFlash2: a non-identity LogitSpec transforms the drafter row in place in the row kernel's first pass
// (losses, argmax, top-K and the gradient all see z; the gradient is then times dz/dx); the top-K outputs
// come from the same pass (each warp a register list of K <= 64, merged by warp 0; ties by lower id);
// the backward's sparse addend (extra_ids / extra_dz, K <= 64 a row) is added at z in the gradient pass.
// The DFlash path (identity, no top-K, no addend) runs the same kernel as before (template flags off).
// A label outside [0, V) yields NaN for that row's CE (the data loader validates tokens first).
decltype(ops::lm_loss_forward) lm_loss_forward;
decltype(ops::lm_loss_backward) lm_loss_backward;

// ops::lm_loss_sparse_backward: dh BF16 [R, H] (read, fp32 sum, rounded once), lm_head BF16 [V, H], ids I32,
// z and dz F32 [R, K], K <= 64; one block a row.
decltype(ops::lm_loss_sparse_backward) lm_loss_sparse_backward;

}  // namespace dflash::cuda
