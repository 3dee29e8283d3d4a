// Qwen3 QK-norm (RMSNorm over head_dim, weight shared by the heads) followed by neox-style RoPE.
//
// RoPE follows Hugging Face exactly: inv_freq[i] = 1 / theta^(2i/rotary_dim) in float32, angle =
// float32(pos) * inv_freq[i] in float32, then cos/sin; pairs (i, i + rotary_dim/2) rotate, dims at or
// beyond rotary_dim pass through (partial RoPE).
#include <cmath>

#include "dflash/ops.h"
#include "ops/op_checks.h"
#ifdef DFLASH_HAVE_CUDA
#include "head_norm_rope.cuh"
#endif

namespace dflash::ops {
namespace {

constexpr int64_t kMaxHeadDim = 1024;

struct RopeTables {
  float cos[kMaxHeadDim / 2];
  float sin[kMaxHeadDim / 2];
};

inline float inv_freq(int i, int rot, float theta) {
  const float e = static_cast<float>(2 * i) / static_cast<float>(rot);
  const float p = static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
  return 1.0f / p;
}

inline void rope_tables(RopeTables& tab, int32_t pos, int half, int rot, float theta) {
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq(i, rot, theta);
    tab.cos[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
    tab.sin[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
  }
}

inline float head_rstd(const float* x, int64_t hd, float eps) {
  double ss = 0.0;
  for (int64_t c = 0; c < hd; ++c) ss += static_cast<double>(x[c]) * x[c];
  return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(hd) + eps));
}

// out may alias in (the head is staged in y first).
void head_norm_rope_forward_cpu(float* out, float* rstd, const float* in, const float* w, const int32_t* pos,
                                int64_t N, int64_t nh, int64_t hd, RopeSpec rope, float eps) {
  const int rot = rope.rotary_dim, half = rot / 2;
  RopeTables tab;
  float y[kMaxHeadDim];
  for (int64_t n = 0; n < N; ++n) {
    rope_tables(tab, pos[n], half, rot, rope.theta);
    for (int64_t h = 0; h < nh; ++h) {
      const size_t off = (static_cast<size_t>(n) * nh + h) * hd;
      const float* x = in + off;
      const float r = head_rstd(x, hd, eps);
      if (rstd) rstd[n * nh + h] = r;
      for (int64_t c = 0; c < hd; ++c) y[c] = (x[c] * r) * w[c];
      float* o = out + off;
      for (int i = 0; i < half; ++i) {
        o[i] = y[i] * tab.cos[i] - y[i + half] * tab.sin[i];
        o[i + half] = y[i + half] * tab.cos[i] + y[i] * tab.sin[i];
      }
      for (int64_t c = rot; c < hd; ++c) o[c] = y[c];
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
  DFLASH_DISPATCH_CUDA(ctx, op, cuda::head_norm_rope_forward(ctx, out, rstd, in, w, pos, rope, eps));
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
  // (kernels/drafter_backward.cu) itself.
  DFLASH_DISPATCH_CUDA(ctx, op, detail::cuda_op_missing(op));
  detail::check_cpu_dtype(op, "dout", dout, DType::F32);
  if (!din.empty()) detail::check_cpu_dtype(op, "din", din, DType::F32);
  if (!dw.empty()) detail::check_cpu_dtype(op, "dw", dw, DType::F32);
  head_norm_rope_backward_cpu(din.empty() ? nullptr : din.ptr<float>(), dw.empty() ? nullptr : dw.ptr<float>(),
                              dout.ptr<float>(), in.ptr<float>(), w.ptr<float>(),
                              rstd.empty() ? nullptr : rstd.ptr<float>(), pos.ptr<int32_t>(), N, nh, hd, rope, eps);
}

}  // namespace dflash::ops
