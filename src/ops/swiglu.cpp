// SwiGLU activation: out = silu(gate) * up, silu(g) = g * sigmoid(g).
#include <cmath>

#include "dflash/ops.h"
#include "ops/op_checks.h"
#ifdef DFLASH_HAVE_CUDA
#include "swiglu.cuh"
#endif

namespace dflash::ops {
namespace {

inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

void swiglu_forward_cpu(float* out, const float* gate, const float* up, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

// d/dg [g s(g)] = s (1 + g (1 - s))
void swiglu_backward_cpu(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                         size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i], s = sigmoid(g);
    dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = dout[i] * g * s;
  }
}

// Every tensor is [N, I] like `gate` (checked first, so its shape can be trusted).
void check_same_2d(const char* op, const Ctx& ctx, const Tensor& gate, std::initializer_list<const Tensor*> ts,
                   std::initializer_list<const char*> names) {
  detail::check_tensor(op, "gate", gate, ctx, 2);
  auto name = names.begin();
  for (const Tensor* t : ts) {
    detail::check_tensor(op, *name, *t, ctx, 2);
    detail::check_shape(op, *name, *t, {gate.shape[0], gate.shape[1]});
    if (ctx.device == Device::CPU) detail::check_cpu_dtype(op, *name, *t, DType::F32);
    ++name;
  }
}

}  // namespace

void swiglu_forward(const Ctx& ctx, const Tensor& out, const Tensor& gate, const Tensor& up) {
  constexpr const char* op = "swiglu_forward";
  check_same_2d(op, ctx, gate, {&out, &gate, &up}, {"out", "gate", "up"});
  DFLASH_DISPATCH_CUDA(ctx, op, cuda::swiglu_forward(ctx, out, gate, up));
  swiglu_forward_cpu(out.ptr<float>(), gate.ptr<float>(), up.ptr<float>(), gate.numel());
}

void swiglu_backward(const Ctx& ctx, const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  constexpr const char* op = "swiglu_backward";
  check_same_2d(op, ctx, gate, {&dgate, &dup, &dout, &gate, &up}, {"dgate", "dup", "dout", "gate", "up"});
  // No CUDA twin through the op layer: the CUDA drafter step calls cuda::swiglu_backward
  // (kernels/drafter_backward.cu) itself.
  DFLASH_DISPATCH_CUDA(ctx, op, detail::cuda_op_missing(op));
  swiglu_backward_cpu(dgate.ptr<float>(), dup.ptr<float>(), dout.ptr<float>(), gate.ptr<float>(), up.ptr<float>(),
                      gate.numel());
}

}  // namespace dflash::ops
