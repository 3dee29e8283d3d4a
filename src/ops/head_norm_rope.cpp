// Qwen3 QK-norm (RMSNorm over head_dim, weight shared by the heads) followed by neox-style RoPE.
// The per-head arithmetic (and how RoPE follows Hugging Face) is in ops/norm_rope_cpu.h, shared with
// qkv_norm_rope_forward.
#include <cmath>

#include "dflash/ops.h"
#include "ops/norm_rope_cpu.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

using detail::head_rstd;
using detail::norm_rope_head;
using detail::rope_tables;
using detail::RopeTables;
constexpr int64_t kMaxHeadDim = detail::kCpuMaxHeadDim;

// out may alias in (norm_rope_head stages each head first).
void head_norm_rope_forward_cpu(float* out, float* rstd, const float* in, const float* w, const int32_t* pos,
                                int64_t N, int64_t nh, int64_t hd, RopeSpec rope, float eps) {
  const int rot = rope.rotary_dim, half = rot / 2;
  RopeTables tab;
  for (int64_t n = 0; n < N; ++n) {
    rope_tables(tab, pos[n], half, rot, rope.theta);
    for (int64_t h = 0; h < nh; ++h) {
      const size_t off = (static_cast<size_t>(n) * nh + h) * hd;
      const float r = norm_rope_head(out + off, in + off, w, tab, hd, rot, eps);
      if (rstd) rstd[n * nh + h] = r;
    }
  }
}

// Undo the rotation on dout (its transpose), then the RMSNorm backward per head:
//   dx = r (dy w) - x r^3 / hd * sum(dy w x);  dw += sum dy x r.   din may alias dout.
void head_norm_rope_backward_cpu(float* din, float* dw, const float* dout, const float* in, const float* w,
                                 const float* rstd, const int32_t* pos, int64_t N, int64_t nh, int64_t hd,
                                 RopeSpec rope, float eps) {
  const int rot = rope.rotary_dim, half = rot / 2;
  RopeTables tab;
  float dy[kMaxHeadDim];
  for (int64_t n = 0; n < N; ++n) {
    rope_tables(tab, pos[n], half, rot, rope.theta);
    for (int64_t h = 0; h < nh; ++h) {
      const size_t off = (static_cast<size_t>(n) * nh + h) * hd;
      const float* g = dout + off;
      const float* x = in + off;
      for (int i = 0; i < half; ++i) {
        dy[i] = g[i] * tab.cos[i] + g[i + half] * tab.sin[i];
        dy[i + half] = g[i + half] * tab.cos[i] - g[i] * tab.sin[i];
      }
      for (int64_t c = rot; c < hd; ++c) dy[c] = g[c];
      const float r = rstd ? rstd[n * nh + h] : head_rstd(x, hd, eps);
      if (dw)
        for (int64_t c = 0; c < hd; ++c) dw[c] += dy[c] * x[c] * r;
      if (din) {
        double dot = 0.0;
        for (int64_t c = 0; c < hd; ++c) dot += static_cast<double>(dy[c]) * w[c] * x[c];
        const float k = static_cast<float>(dot * r * r * r / static_cast<double>(hd));
        float* dx = din + off;
        for (int64_t c = 0; c < hd; ++c) dx[c] = r * (dy[c] * w[c]) - x[c] * k;
      }
    }
  }
}

// Shared argument checks; returns the resolved rotary_dim.
int check_args(const char* op, const Ctx& ctx, const Tensor& in, const Tensor& w, const Tensor& rstd,
               const Tensor& pos, RopeSpec rope) {
  detail::check_tensor(op, "in", in, ctx, 3);
  const int64_t N = in.shape[0], nh = in.shape[1], hd = in.shape[2];
  detail::check_tensor(op, "w", w, ctx, 1);
  detail::check_shape(op, "w", w, {hd});
  detail::check_tensor(op, "pos", pos, ctx, 1);
  detail::check_shape(op, "pos", pos, {N});
  DF_CHECK(pos.dtype == DType::I32, Internal, op << ": pos must be I32, got " << dtype_name(pos.dtype));
  if (!rstd.empty()) {
    detail::check_tensor(op, "rstd", rstd, ctx, 2);
    detail::check_shape(op, "rstd", rstd, {N, nh});
  }
  const int rot = rope.rotary_dim == 0 ? static_cast<int>(hd) : rope.rotary_dim;
  DF_CHECK(rot > 0 && rot <= hd && rot % 2 == 0, Internal,
           op << ": rotary_dim " << rot << " must be even and in (0, head_dim=" << hd << "]");
  DF_CHECK(hd <= kMaxHeadDim, Internal, op << ": head_dim " << hd << " above the supported " << kMaxHeadDim);
  if (ctx.device == Device::CPU) {
    detail::check_cpu_dtype(op, "in", in, DType::F32);
    detail::check_cpu_dtype(op, "w", w, DType::F32);
    if (!rstd.empty()) detail::check_cpu_dtype(op, "rstd", rstd, DType::F32);
  }
  return rot;
}

}  // namespace

void head_norm_rope_forward(const Ctx& ctx, const Tensor& out, const Tensor& rstd, const Tensor& in,
                            const Tensor& w, const Tensor& pos, RopeSpec rope, float eps) {
  constexpr const char* op = "head_norm_rope_forward";
  rope.rotary_dim = check_args(op, ctx, in, w, rstd, pos, rope);
  detail::check_tensor(op, "out", out, ctx, 3);
  detail::check_shape(op, "out", out, {in.shape[0], in.shape[1], in.shape[2]});
  if (ctx.device == Device::CUDA)
    return cuda::library_for("head_norm_rope_forward").head_norm_rope_forward(ctx, out, rstd, in, w, pos, rope, eps);
  detail::check_cpu_dtype(op, "out", out, DType::F32);
  head_norm_rope_forward_cpu(out.ptr<float>(), rstd.empty() ? nullptr : rstd.ptr<float>(), in.ptr<float>(),
                             w.ptr<float>(), pos.ptr<int32_t>(), in.shape[0], in.shape[1], in.shape[2], rope, eps);
}

void head_norm_rope_backward(const Ctx& ctx, const Tensor& din, const Tensor& dw, const Tensor& dout,
                             const Tensor& in, const Tensor& w, const Tensor& rstd, const Tensor& pos,
                             RopeSpec rope, float eps) {
  constexpr const char* op = "head_norm_rope_backward";
  rope.rotary_dim = check_args(op, ctx, in, w, rstd, pos, rope);
  const int64_t N = in.shape[0], nh = in.shape[1], hd = in.shape[2];
  detail::check_tensor(op, "dout", dout, ctx, 3);
  detail::check_shape(op, "dout", dout, {N, nh, hd});
  if (!din.empty()) {
    detail::check_tensor(op, "din", din, ctx, 3);
    detail::check_shape(op, "din", din, {N, nh, hd});
  }
  if (!dw.empty()) {
    detail::check_tensor(op, "dw", dw, ctx, 1);
    detail::check_shape(op, "dw", dw, {hd});
  }
  // No CUDA twin through the op layer: the CUDA drafter step calls cuda::head_norm_rope_backward
  // (src/drafter/cuda/drafter_backward.cu) itself.
  if (ctx.device == Device::CUDA) detail::cuda_op_missing(op);
  detail::check_cpu_dtype(op, "dout", dout, DType::F32);
  if (!din.empty()) detail::check_cpu_dtype(op, "din", din, DType::F32);
  if (!dw.empty()) detail::check_cpu_dtype(op, "dw", dw, DType::F32);
  head_norm_rope_backward_cpu(din.empty() ? nullptr : din.ptr<float>(), dw.empty() ? nullptr : dw.ptr<float>(),
                              dout.ptr<float>(), in.ptr<float>(), w.ptr<float>(),
                              rstd.empty() ? nullptr : rstd.ptr<float>(), pos.ptr<int32_t>(), N, nh, hd, rope, eps);
}

}  // namespace dflash::ops
