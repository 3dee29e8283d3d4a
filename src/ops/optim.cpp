// AdamW and global-norm clipping, CPU float32 (see include/dflash/optim.h; the lr schedule is in
// src/drafter/lr_schedule.cpp).
#include "dflash/optim.h"

#include <algorithm>
#include <cmath>

#include "ops/op_checks.h"

namespace dflash::ops {

void adamw_step(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                const AdamWHyper& hp, int64_t step) {
  const char* op = "adamw_step";
  const int64_t n = static_cast<int64_t>(params.numel());
  for (const Tensor* t : {&params, &grads, &m, &v}) {
    detail::check_tensor(op, "params/grads/m/v", *t, ctx, 1);
    detail::check_shape(op, "params/grads/m/v", *t, {n});
  }
  DF_CHECK(step >= 1, Internal, op << ": step " << step << " (1-based)");
  if (ctx.device == Device::CUDA) return cuda::adamw_step(ctx, params, grads, m, v, hp, step);
  float* p = params.ptr<float>();
  const float* g = grads.ptr<float>();
  float* mm = m.ptr<float>();
  float* vv = v.ptr<float>();
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(step));
  const float decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
  const float step_size = static_cast<float>(hp.lr / bc1);
  const float inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  const float b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    mm[i] = b1 * mm[i] + (1.f - b1) * gi;
    vv[i] = b2 * vv[i] + (1.f - b2) * gi * gi;
    const float denom = std::sqrt(vv[i]) * inv_bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * mm[i] / denom;
  }
}

double grad_sumsq(const Ctx& ctx, const Tensor& grads) {
  detail::check_tensor("grad_sumsq", "grads", grads, ctx, 1);
  if (ctx.device == Device::CUDA) return cuda::grad_sumsq(ctx, grads);
  const float* g = grads.ptr<float>();
  const size_t n = grads.numel();
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
  return s;
}

void scale_inplace(const Ctx& ctx, const Tensor& grads, float factor) {
  detail::check_tensor("scale_inplace", "grads", grads, ctx, 1);
  if (ctx.device == Device::CUDA) return cuda::scale_inplace(ctx, grads, factor);
  float* g = grads.ptr<float>();
  const size_t n = grads.numel();
  for (size_t i = 0; i < n; ++i) g[i] *= factor;
}

double clip_grad_global_norm(const Ctx& ctx, const Tensor& grads, float clip) {
  const double norm = std::sqrt(grad_sumsq(ctx, grads));
  if (clip > 0.f && std::isfinite(norm)) {
    const double coef = static_cast<double>(clip) / (norm + 1e-6);
    if (coef < 1.0) scale_inplace(ctx, grads, static_cast<float>(coef));
  }
  return norm;
}

}  // namespace dflash::ops
