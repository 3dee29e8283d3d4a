// AdamW with global-norm clipping and a warmup + cosine schedule (torch.optim.AdamW semantics).
//
// Parameters, gradients and both moments each live in ONE flat fp32 buffer (views per tensor), so a
// step is a few passes over contiguous memory and the gradients are one bucket for one allreduce.
// Ctx + Tensor signatures like dflash/ops.h so a CUDA twin slots in; CPU versions in src/ops/optim.cpp
// (lr_schedule: src/drafter/lr_schedule.cpp).
#pragma once
#include <cstdint>

#include "dflash/tensor.h"

namespace dflash {

// --optimizer-state: how the drafter keeps its weights and AdamW moments between steps (docs/pipeline.md
// "Optimizer state"). Fp32: fp32 master weights and moments (on CUDA plus the bf16 copy the forward reads).
// Bf16: the weights and both moments are bf16, each update computed in fp32 and written back with
// stochastic rounding (dflash/stochastic_round.h); on CUDA the bf16 weights are the state and no fp32 copy
// exists, the CPU engine keeps fp32 storage holding bf16 values. Gradients are fp32 in both modes.
enum class OptimizerState : uint8_t { Fp32, Bf16 };
const char* optimizer_state_name(OptimizerState s);  // "fp32" | "bf16"
// Bytes per trainable parameter of the weights, gradients and moments as the engine of `device` allocates
// them (CUDA fp32 18: 4 each + the bf16 copy; CUDA bf16 10; the CPU 16 in both modes).
int optimizer_state_bytes_per_param(OptimizerState s, Device device);

}  // namespace dflash

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

// The same update on bf16 state (--optimizer-state bf16): each element computed in fp32 from p, m, v (bf16
// values) and grads (fp32, already clipped), then p, m and v written back stochastically rounded to bf16
// with the bits of sr::random16(seed, step, index, p/m/v) (dflash/stochastic_round.h, the one definition
// the CUDA twin shares). params, m, v: BF16 [n], or on the CPU F32 [n] storage holding bf16 values (the CPU
// engine's). CUDA: kernels/adamw.cuh (clip_adamw_step_bf16state fuses the clip, as clip_adamw_step).
void adamw_step_bf16state(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m,
                          const Tensor& v, const AdamWHyper& hyper, int64_t step, uint64_t seed);
// x [n] (F32 storage) rounded to the nearest bf16 value in place: the bf16 state's start from fp32 weights
// (a fresh init, a --drafter, a checkpoint).
void round_to_bf16_inplace(const Tensor& x);

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
// DFlash2's selector weight at 0-based `step` (the optimizer steps already completed), as SpecForge computes
// it (docs/dflash2.md 3.2 cites its code): W = int(total *
// warmup_ratio), Rp = int(total * ramp_ratio); 0 while step < W; then alpha * min(1, (step - W + 1) / Rp)
// (alpha itself when Rp = 0). total_steps 0 (no horizon) or alpha <= 0: alpha.
double selector_alpha_schedule(int64_t step, double alpha, double warmup_ratio, double ramp_ratio,
                               int64_t total_steps);

}  // namespace dflash
