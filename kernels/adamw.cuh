// AdamW and global-norm clipping on CUDA (the twins of src/ops/optim.cpp), over the trainer's flat
// fp32 buffers: params, grads, m and v are each ONE contiguous tensor, so the "multi-tensor" step is a
// single vectorised pass.
#pragma once
#include "dflash/optim.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// Same contracts as ops::adamw_step / grad_sumsq / scale_inplace (include/dflash/optim.h); every tensor
// F32 [n] in device memory. grad_sumsq synchronizes the stream (it returns a host value).
decltype(ops::adamw_step) adamw_step;
decltype(ops::grad_sumsq) grad_sumsq;
decltype(ops::scale_inplace) scale_inplace;

// The training step's fused optimizer: sum of squares of grads on the device, then ONE pass that clips
// (g *= min(1, clip / (||g|| + 1e-6)) when clip > 0; read on the device, no host round trip), updates m, v
// and params (torch.optim.AdamW semantics, as adamw_step) and, when params_bf16 [n] (BF16) is given,
// writes the bf16 copy of the new weights that the next forward reads. grads are left unclipped.
// The pre-clip norm is kept on the device; last_grad_norm() reads it (synchronizes).
void clip_adamw_step(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                     const ops::AdamWHyper& hyper, int64_t step, float clip, const Tensor& params_bf16);
double last_grad_norm(const Ctx& ctx);

// --optimizer-state bf16 (the twin of ops::adamw_step_bf16state, include/dflash/optim.h): params, m, v BF16
// [n] on the device are the state, grads F32 [n]; every element is updated in fp32 and written back
// stochastically rounded with the bits of sr::random16(seed, step, index, p/m/v). The clipped variant
// fuses the clip and keeps the norm as clip_adamw_step does (grads left unclipped; last_grad_norm reads it).
decltype(ops::adamw_step_bf16state) adamw_step_bf16state;
void clip_adamw_step_bf16state(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m,
                               const Tensor& v, const ops::AdamWHyper& hyper, int64_t step, float clip,
                               uint64_t seed);

}  // namespace dflash::cuda
