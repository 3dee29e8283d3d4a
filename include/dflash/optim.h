// AdamW with global-norm clipping and a warmup + cosine schedule (torch.optim.AdamW semantics).
//
// Parameters, gradients and both moments each live in ONE flat fp32 buffer (views per tensor), so a
// step is a few passes over contiguous memory and the gradients are one bucket for one allreduce.
// Ctx + Tensor signatures like dflash/ops.h so a CUDA twin slots in; CPU versions in src/ops/optim.cpp
// (lr_schedule: src/drafter/lr_schedule.cpp).
#pragma once
#include <cstdint>

#include "dflash/tensor.h"

namespace dflash::ops {

struct AdamWHyper {
  float lr = 6e-4f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // torch.optim.AdamW's defaults
  float weight_decay = 0.0f;  // decoupled: p -= lr * wd * p, applied to every parameter (as the reference)
};

// One AdamW update of params [n] from grads [n] with moments m, v [n] (updated in place).
// `step` is the 1-based number of this update (bias corrections 1 - beta^step).
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
void adamw_step(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                const AdamWHyper& hyper, int64_t step);

// Sum of squares of grads [n], accumulated in double.
double grad_sumsq(const Ctx& ctx, const Tensor& grads);
// grads [n] *= factor.
void scale_inplace(const Ctx& ctx, const Tensor& grads, float factor);

// Gradient accumulation (--grad-accum, docs/pipeline.md "Gradient accumulation"): the micro-batches of one
// optimizer step summed as one large batch's gradient, each micro-batch's normalised gradient g weighted by
// its loss weight sum s. acc, g: F32 [n] on ctx's device (CPU: src/ops/grad_accum.cpp; CUDA:
// kernels/grad_accum.cu).
enum class AccumInto : uint8_t { Overwrite, Add };
// acc = s*g (Overwrite: the step's first micro-batch) or acc += s*g (Add: the later ones).
void grad_accumulate(const Ctx& ctx, const Tensor& acc, const Tensor& g, float s, AccumInto into);
// g = s*g + acc, element by element (the last micro-batch folded into the sum, range by range before the
// allreduce sees it). s == 0 reads acc only: g = acc, whatever g held (the end of the data mid-step).
void grad_fold(const Ctx& ctx, const Tensor& g, const Tensor& acc, float s);

// torch.nn.utils.clip_grad_norm_: norm = ||g||_2; if clip > 0, g *= min(1, clip / (norm + 1e-6)).
// Returns the norm before clipping.
double clip_grad_global_norm(const Ctx& ctx, const Tensor& grads, float clip);

}  // namespace dflash::ops

namespace dflash {

// Learning rate for the 0-based optimizer step `step`: linear warmup over warmup_steps ((step+1)/warmup),
// then cosine decay from lr to min_lr_ratio*lr at total_steps (total_steps <= warmup_steps: constant lr).
double lr_schedule(int64_t step, double lr, int warmup_steps, int64_t total_steps, double min_lr_ratio);

}  // namespace dflash
