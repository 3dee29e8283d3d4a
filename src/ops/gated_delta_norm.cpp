// The two gates of the Qwen3.5 hybrid on the CPU (float32): the Gated DeltaNet output norm
// (RMSNorm then * silu(z)) and the full-attention output gate (* sigmoid(gate)). CUDA twins:
// kernels/gated_rmsnorm.cu, kernels/sigmoid_gate.cu.
#include <cmath>

#include "ops/gated_delta.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Every tensor is [N, C] like `first`, float32 on the CPU.
void check_same_2d(const char* op, const Ctx& ctx, const Tensor& first, std::initializer_list<const Tensor*> ts) {
  detail::check_tensor(op, "in", first, ctx, 2);
  for (const Tensor* t : ts) {
    detail::check_tensor(op, "out/in/gate", *t, ctx, 2);
    detail::check_shape(op, "out/in/gate", *t, {first.shape[0], first.shape[1]});
  }
}

}  // namespace

void gated_rmsnorm_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& z, const Tensor& w,
                           float eps) {
  constexpr const char* op = "gated_rmsnorm_forward";
  check_same_2d(op, ctx, in, {&out, &z});
  const int64_t N = in.shape[0], C = in.shape[1];
  detail::check_tensor(op, "w", w, ctx, 1);
  detail::check_shape(op, "w", w, {C});
  if (ctx.device == Device::CUDA)
    return cuda::library_for("gated_rmsnorm_forward").gated_rmsnorm_forward(ctx, out, in, z, w, eps);
  for (const Tensor* t : {&out, &in, &z, &w}) detail::check_cpu_dtype(op, "out/in/z/w", *t, DType::F32);
  float* o = out.ptr<float>();
  const float *x = in.ptr<float>(), *zp = z.ptr<float>(), *wp = w.ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    const size_t r = static_cast<size_t>(n) * C;
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(x[r + c]) * x[r + c];
    const float rstd = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
    for (int64_t c = 0; c < C; ++c) {
      const float gz = zp[r + c];
      o[r + c] = (x[r + c] * rstd) * wp[c] * (gz * sigmoidf(gz));
    }
  }
}

void sigmoid_gate_forward(const Ctx& ctx, const Tensor& out, const Tensor& x, const Tensor& gate) {
  constexpr const char* op = "sigmoid_gate_forward";
  check_same_2d(op, ctx, x, {&out, &gate});
  if (ctx.device == Device::CUDA)
    return cuda::library_for("sigmoid_gate_forward").sigmoid_gate_forward(ctx, out, x, gate);
  for (const Tensor* t : {&out, &x, &gate}) detail::check_cpu_dtype(op, "out/x/gate", *t, DType::F32);
  float* o = out.ptr<float>();
  const float *xp = x.ptr<float>(), *gp = gate.ptr<float>();
  const size_t n = x.numel();
  for (size_t i = 0; i < n; ++i) o[i] = xp[i] * sigmoidf(gp[i]);
}

}  // namespace dflash::ops
