// RMSNorm (Qwen3: y = x * rstd * w, statistics in float32).
#include <cmath>
#include <vector>

#include "dflash/fp8.h"
#include "dflash/ops.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

// One row: out = in * rstd * w; returns rstd. Sum of squares accumulated in double so long rows keep
// full float32 accuracy.
inline float rmsnorm_row(float* out, const float* in, const float* w, int64_t C, float eps) {
  double ss = 0.0;
  for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(in[c]) * in[c];
  const float rstd = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
  for (int64_t c = 0; c < C; ++c) out[c] = (in[c] * rstd) * w[c];
  return rstd;
}

void rmsnorm_forward_cpu(float* out, float* rstd, const float* in, const float* w, int64_t N, int64_t C,
                         float eps) {
  for (int64_t n = 0; n < N; ++n) {
    const size_t row = static_cast<size_t>(n) * C;
    const float r = rmsnorm_row(out + row, in + row, w, C, eps);
    if (rstd) rstd[n] = r;
  }
}

// y = x r w, r = (mean(x^2) + eps)^-1/2:
//   dx = r (dy w) - x r^3 / C * sum(dy w x);   dw += sum_n dy x r
void rmsnorm_backward_cpu(float* din, float* dw, const float* dout, const float* in, const float* w,
                          const float* rstd, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const size_t row = static_cast<size_t>(n) * C;
    const float* x = in + row;
    const float* dy = dout + row;
    const float r = rstd[n];
    if (din) {
      double dot = 0.0;
      for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(dy[c]) * w[c] * x[c];
      const float k = static_cast<float>(dot * r * r * r / static_cast<double>(C));
      float* dx = din + row;
      for (int64_t c = 0; c < C; ++c) dx[c] = r * (dy[c] * w[c]) - x[c] * k;
    }
    if (dw)
      for (int64_t c = 0; c < C; ++c) dw[c] += dy[c] * x[c] * r;
  }
}

}  // namespace

void rmsnorm_forward(const Ctx& ctx, const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& w,
                     float eps) {
  constexpr const char* op = "rmsnorm_forward";
  detail::check_tensor(op, "in", in, ctx, 2);
  const int64_t N = in.shape[0], C = in.shape[1];
  detail::check_tensor(op, "out", out, ctx, 2);
  detail::check_shape(op, "out", out, {N, C});
  detail::check_tensor(op, "w", w, ctx, 1);
  detail::check_shape(op, "w", w, {C});
  if (!rstd.empty()) {
    detail::check_tensor(op, "rstd", rstd, ctx, 1);
    detail::check_shape(op, "rstd", rstd, {N});
  }
  if (ctx.device == Device::CUDA)
    return cuda::library_for("rmsnorm_forward").rmsnorm_forward(ctx, out, rstd, in, w, eps);
  detail::check_cpu_dtype(op, "in", in, DType::F32);
  detail::check_cpu_dtype(op, "out", out, DType::F32);
  detail::check_cpu_dtype(op, "w", w, DType::F32);
  if (!rstd.empty()) detail::check_cpu_dtype(op, "rstd", rstd, DType::F32);
  rmsnorm_forward_cpu(out.ptr<float>(), rstd.empty() ? nullptr : rstd.ptr<float>(), in.ptr<float>(),
                      w.ptr<float>(), N, C, eps);
}

void rmsnorm_fp8_forward(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales,
                         const Tensor& in, const Tensor& w, float eps) {
  constexpr const char* op = "rmsnorm_fp8_forward";
  detail::check_tensor(op, "in", in, ctx, 2);
  const int64_t N = in.shape[0], C = in.shape[1];
  if (!out.empty()) {
    detail::check_tensor(op, "out", out, ctx, 2);
    detail::check_shape(op, "out", out, {N, C});
  }
  DF_CHECK(!out.empty() || C <= kRmsNormFp8CodesOnlyWidth, Internal,
           op << ": rows of " << C << " need out (wider than " << kRmsNormFp8CodesOnlyWidth << ")");
  detail::check_tensor(op, "w", w, ctx, 1);
  detail::check_shape(op, "w", w, {C});
  detail::check_tensor(op, "codes", codes, ctx, 2);
  detail::check_shape(op, "codes", codes, {N, C});
  detail::check_tensor(op, "scales", scales, ctx, 1);
  detail::check_shape(op, "scales", scales, {N});
  DF_CHECK(codes.dtype == DType::F8E4M3 && scales.dtype == DType::F32, Internal,
           op << ": codes must be F8E4M3 and scales F32");
  if (ctx.device == Device::CUDA)
    return cuda::library_for(op).rmsnorm_fp8_forward(ctx, out, codes, scales, in, w, eps);
  detail::check_cpu_dtype(op, "in", in, DType::F32);
  detail::check_cpu_dtype(op, "w", w, DType::F32);
  if (!out.empty()) detail::check_cpu_dtype(op, "out", out, DType::F32);
  // The reference: the norm, then the row quantizer's host arithmetic over its output.
  std::vector<float> own(out.empty() ? static_cast<size_t>(N * C) : 0);
  float* y = out.empty() ? own.data() : out.ptr<float>();
  rmsnorm_forward_cpu(y, nullptr, in.ptr<float>(), w.ptr<float>(), N, C, eps);
  fp8::quantize_activation_groups(y, N, C, C, static_cast<uint8_t*>(codes.data), scales.ptr<float>());
}

void rmsnorm_backward(const Ctx& ctx, const Tensor& din, const Tensor& dw, const Tensor& dout, const Tensor& in,
                      const Tensor& w, const Tensor& rstd) {
  constexpr const char* op = "rmsnorm_backward";
  detail::check_tensor(op, "in", in, ctx, 2);
  const int64_t N = in.shape[0], C = in.shape[1];
  detail::check_tensor(op, "dout", dout, ctx, 2);
  detail::check_shape(op, "dout", dout, {N, C});
  detail::check_tensor(op, "w", w, ctx, 1);
  detail::check_shape(op, "w", w, {C});
  if (!din.empty()) {
    detail::check_tensor(op, "din", din, ctx, 2);
    detail::check_shape(op, "din", din, {N, C});
  }
  if (!dw.empty()) {
    detail::check_tensor(op, "dw", dw, ctx, 1);
    detail::check_shape(op, "dw", dw, {C});
  }
  DF_CHECK(!rstd.empty(), Internal, op << ": rstd from the forward is required");
  detail::check_tensor(op, "rstd", rstd, ctx, 1);
  detail::check_shape(op, "rstd", rstd, {N});
  // No CUDA twin through the op layer: the CUDA drafter step calls cuda::rmsnorm_backward
  // (src/drafter/cuda/drafter_backward.cu) itself.
  if (ctx.device == Device::CUDA) detail::cuda_op_missing(op);
  for (const Tensor* t : {&in, &dout, &w, &rstd}) detail::check_cpu_dtype(op, "in/dout/w/rstd", *t, DType::F32);
  if (!din.empty()) detail::check_cpu_dtype(op, "din", din, DType::F32);
  if (!dw.empty()) detail::check_cpu_dtype(op, "dw", dw, DType::F32);
  rmsnorm_backward_cpu(din.empty() ? nullptr : din.ptr<float>(), dw.empty() ? nullptr : dw.ptr<float>(),
                       dout.ptr<float>(), in.ptr<float>(), w.ptr<float>(), rstd.ptr<float>(), N, C);
}

}  // namespace dflash::ops
