// Gradient accumulation, CPU float32 (see include/dflash/optim.h): the reference of kernels/grad_accum.cu.
#include "dflash/optim.h"

#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

void check_pair(const char* op, const Ctx& ctx, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  detail::check_tensor(op, a_name, a, ctx, 1);
  detail::check_tensor(op, b_name, b, ctx, 1);
  detail::check_shape(op, b_name, b, {static_cast<int64_t>(a.numel())});
  // fp32 gradient buffers on every backend (the CUDA step keeps its gradients in fp32 too)
  for (const Tensor* t : {&a, &b})
    DF_CHECK(t->dtype == DType::F32, Internal, op << ": argument '" << (t == &a ? a_name : b_name) << "' is "
                                                  << dtype_name(t->dtype) << ", expected F32");
  DF_CHECK(!detail::overlaps(a, b), Internal, op << ": '" << a_name << "' and '" << b_name << "' overlap");
}

}  // namespace

void grad_accumulate(const Ctx& ctx, const Tensor& acc, const Tensor& g, float s, AccumInto into) {
  const char* op = "grad_accumulate";
  check_pair(op, ctx, acc, "acc", g, "g");
  if (ctx.device == Device::CUDA) return cuda::library_for("grad_accumulate").grad_accumulate(ctx, acc, g, s, into);
  float* a = acc.ptr<float>();
  const float* x = g.ptr<float>();
  const size_t n = acc.numel();
  if (into == AccumInto::Overwrite)
    for (size_t i = 0; i < n; ++i) a[i] = s * x[i];
  else
    for (size_t i = 0; i < n; ++i) a[i] += s * x[i];
}

void grad_fold(const Ctx& ctx, const Tensor& g, const Tensor& acc, float s) {
  const char* op = "grad_fold";
  check_pair(op, ctx, g, "g", acc, "acc");
  if (ctx.device == Device::CUDA) return cuda::library_for("grad_fold").grad_fold(ctx, g, acc, s);
  float* x = g.ptr<float>();
  const float* a = acc.ptr<float>();
  const size_t n = g.numel();
  if (s == 0.f)
    for (size_t i = 0; i < n; ++i) x[i] = a[i];
  else
    for (size_t i = 0; i < n; ++i) x[i] = s * x[i] + a[i];
}

}  // namespace dflash::ops
