// AdamW and global-norm clipping, CPU float32 (see include/dflash/optim.h; the lr schedule is in
// src/drafter/lr_schedule.cpp).
#include "dflash/optim.h"

#include <algorithm>
#include <cmath>

#include "dflash/stochastic_round.h"
#include "ops/op_checks.h"

namespace dflash {

const char* optimizer_state_name(OptimizerState s) { return s == OptimizerState::Bf16 ? "bf16" : "fp32"; }

int optimizer_state_bytes_per_param(OptimizerState s, Device device) {
  if (device != Device::CUDA) return 16;  // fp32 weights, gradients, m, v (bf16 mode: fp32 storage of bf16 values)
  // fp32: weights, gradients, m, v + the bf16 copy the forward reads; bf16: the bf16 weights, fp32
  // gradients (the allreduce bucket), bf16 m and v (src/drafter/cuda/drafter_step.cu allocates them)
  return s == OptimizerState::Bf16 ? 2 + 4 + 2 + 2 : 4 * 4 + 2;
}

}  // namespace dflash

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
  if (ctx.device == Device::CUDA) return cuda::library_for("adamw_step").adamw_step(ctx, params, grads, m, v, hp, step);
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

namespace {

// The bf16 state's element access on the CPU: F32 storage holding bf16 values (the CPU engine) or BF16.
template <class T> float load_state(const T* x, int64_t i);
template <> float load_state<float>(const float* x, int64_t i) { return x[i]; }
template <> float load_state<uint16_t>(const uint16_t* x, int64_t i) { return sr::bf16_bits_f32(x[i]); }
inline void store_state(float* x, int64_t i, uint16_t h) { x[i] = sr::bf16_bits_f32(h); }
inline void store_state(uint16_t* x, int64_t i, uint16_t h) { x[i] = h; }

template <class T>
void adamw_bf16_loop(T* p, const float* g, T* m, T* v, int64_t n, const sr::AdamScalars& a, uint64_t key) {
  for (int64_t i = 0; i < n; ++i) {
    const sr::Bf16State s = sr::adamw_bf16_update(load_state(p, i), load_state(m, i), load_state(v, i), g[i], a,
                                                  sr::element_bits(key, static_cast<uint64_t>(i)));
    store_state(p, i, s.p);
    store_state(m, i, s.m);
    store_state(v, i, s.v);
  }
}

}  // namespace

void adamw_step_bf16state(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                          const AdamWHyper& hp, int64_t step, uint64_t seed) {
  const char* op = "adamw_step_bf16state";
  const int64_t n = static_cast<int64_t>(params.numel());
  for (const Tensor* t : {&params, &grads, &m, &v}) {
    detail::check_tensor(op, "params/grads/m/v", *t, ctx, 1);
    detail::check_shape(op, "params/grads/m/v", *t, {n});
  }
  DF_CHECK(grads.dtype == DType::F32, Internal, op << ": grads must be F32");
  DF_CHECK(params.dtype == m.dtype && params.dtype == v.dtype, Internal, op << ": params, m and v in one dtype");
  DF_CHECK(step >= 1, Internal, op << ": step " << step << " (1-based)");
  if (ctx.device == Device::CUDA)
    return cuda::library_for("adamw_step_bf16state").adamw_step_bf16state(ctx, params, grads, m, v, hp, step, seed);
  DF_CHECK(params.dtype == DType::F32 || params.dtype == DType::BF16, Internal,
           op << ": the CPU state is F32 (holding bf16 values) or BF16, got " << dtype_name(params.dtype));
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(step));
  const sr::AdamScalars a{hp.beta1, hp.beta2, hp.eps, static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay),
                          static_cast<float>(hp.lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2))};
  const uint64_t key = sr::step_key(seed, static_cast<uint64_t>(step));
  if (params.dtype == DType::F32)
    adamw_bf16_loop(params.ptr<float>(), grads.ptr<float>(), m.ptr<float>(), v.ptr<float>(), n, a, key);
  else
    adamw_bf16_loop(static_cast<uint16_t*>(params.data), grads.ptr<float>(), static_cast<uint16_t*>(m.data),
                    static_cast<uint16_t*>(v.data), n, a, key);
}

void round_to_bf16_inplace(const Tensor& x) {
  DF_CHECK(x.device == Device::CPU && x.dtype == DType::F32, Internal, "round_to_bf16_inplace: F32 host storage");
  float* p = x.ptr<float>();
  for (size_t i = 0, n = x.numel(); i < n; ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
}

double grad_sumsq(const Ctx& ctx, const Tensor& grads) {
  detail::check_tensor("grad_sumsq", "grads", grads, ctx, 1);
  if (ctx.device == Device::CUDA) return cuda::library_for("grad_sumsq").grad_sumsq(ctx, grads);
  const float* g = grads.ptr<float>();
  const size_t n = grads.numel();
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
  return s;
}

void scale_inplace(const Ctx& ctx, const Tensor& grads, float factor) {
  detail::check_tensor("scale_inplace", "grads", grads, ctx, 1);
  if (ctx.device == Device::CUDA) return cuda::library_for("scale_inplace").scale_inplace(ctx, grads, factor);
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
