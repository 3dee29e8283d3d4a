// Block-prefix attention (DFlash training), CPU float32 reference.
//
// Each block's B queries see the context of their own sequence strictly before the anchor and the keys
// of their own block (see include/dflash/drafter_ops.h). The visible set of a query is two contiguous
// key ranges, so scores are computed over exactly those ranges: no [N*B, T + N*B] mask is built and the
// cost is proportional to the visible keys only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dflash/drafter_ops.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

struct Dims {
  int64_t N, B, nh, nkv, hd, T;
};

Dims check_args(const char* op, const Ctx& ctx, const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx,
                const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors, const Tensor& seq_begin,
                const BlockAttnSpec& spec) {
  using namespace detail;
  check_tensor(op, "q", q, ctx, 3);
  check_tensor(op, "k_ctx", k_ctx, ctx, 3);
  check_tensor(op, "v_ctx", v_ctx, ctx, 3);
  check_tensor(op, "k_blk", k_blk, ctx, 3);
  check_tensor(op, "v_blk", v_blk, ctx, 3);
  check_tensor(op, "anchors", anchors, ctx, 1);
  check_tensor(op, "seq_begin", seq_begin, ctx, 1);
  Dims d{};
  d.B = spec.block_size;
  DF_CHECK(d.B >= 1, Internal, op << ": block_size " << d.B);
  d.N = anchors.shape[0];
  d.nh = q.shape[1];
  d.hd = q.shape[2];
  d.nkv = k_ctx.shape[1];
  d.T = k_ctx.shape[0];
  check_shape(op, "q", q, {d.N * d.B, d.nh, d.hd});
  check_shape(op, "k_ctx", k_ctx, {d.T, d.nkv, d.hd});
  check_shape(op, "v_ctx", v_ctx, {d.T, d.nkv, d.hd});
  check_shape(op, "k_blk", k_blk, {d.N * d.B, d.nkv, d.hd});
  check_shape(op, "v_blk", v_blk, {d.N * d.B, d.nkv, d.hd});
  check_shape(op, "seq_begin", seq_begin, {d.N});
  DF_CHECK(d.nkv > 0 && d.nh % d.nkv == 0, Internal, op << ": nh " << d.nh << " not a multiple of nkv " << d.nkv);
  if (ctx.device == Device::CPU) {
    check_cpu_dtype(op, "anchors", anchors, DType::I32);
    check_cpu_dtype(op, "seq_begin", seq_begin, DType::I32);
    for (const Tensor* t : {&q, &k_ctx, &v_ctx, &k_blk, &v_blk}) check_cpu_dtype(op, "q/k/v", *t, DType::F32);
    const int32_t* an = anchors.ptr<int32_t>();
    const int32_t* sb = seq_begin.ptr<int32_t>();
    for (int64_t n = 0; n < d.N; ++n)
      DF_CHECK(sb[n] >= 0 && sb[n] <= an[n] && an[n] < d.T, Internal,
               op << ": block " << n << " anchor " << an[n] << " seq_begin " << sb[n] << " T " << d.T);
  }
  return d;
}

// The visible key ranges of the query at offset o of a block anchored at a (global) in a sequence
// starting at s0: context [ctx_lo, ctx_hi) and block offsets [0, blk_hi).
struct Visible {
  int64_t ctx_lo, ctx_hi, blk_hi;
};
inline Visible visible(int64_t a, int64_t s0, int64_t o, int64_t B, int window) {
  Visible v{s0, a, B};
  if (window > 0) {
    v.ctx_lo = std::max<int64_t>(s0, a + o - (window - 1));
    v.blk_hi = o + 1;
  }
  if (v.ctx_lo > v.ctx_hi) v.ctx_lo = v.ctx_hi;
  return v;
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
inline void axpy(float* y, float alpha, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Scores of one query over its visible keys, scaled: s[0 .. nctx) context, s[nctx ..) block.
// Grows the scratch vector only when a longer range appears (not per call).
thread_local std::vector<float> tl_scores;

void cpu_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx,
                 const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors, const Tensor& seq_begin,
                 const BlockAttnSpec& spec, const Dims& d) {
  const float* Q = q.ptr<float>();
  const float* Kc = k_ctx.ptr<float>();
  const float* Vc = v_ctx.ptr<float>();
  const float* Kb = k_blk.ptr<float>();
  const float* Vb = v_blk.ptr<float>();
  float* O = out.ptr<float>();
  float* L = lse.ptr<float>();
  const int32_t* an = anchors.ptr<int32_t>();
  const int32_t* sb = seq_begin.ptr<int32_t>();
  const int64_t group = d.nh / d.nkv, hd = d.hd, kv_stride = d.nkv * hd, q_stride = d.nh * hd;
  for (int64_t n = 0; n < d.N; ++n) {
    for (int64_t o = 0; o < d.B; ++o) {
      const int64_t row = n * d.B + o;
      const Visible vis = visible(an[n], sb[n], o, d.B, spec.window);
      const int64_t nctx = vis.ctx_hi - vis.ctx_lo, nkeys = nctx + vis.blk_hi;
      if (static_cast<int64_t>(tl_scores.size()) < nkeys) tl_scores.resize(static_cast<size_t>(nkeys));
      float* s = tl_scores.data();
      for (int64_t h = 0; h < d.nh; ++h) {
        const int64_t kvh = h / group;
        const float* qv = Q + static_cast<size_t>(row) * q_stride + h * hd;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < nctx; ++j) {
          s[j] = spec.scale * dot(qv, Kc + static_cast<size_t>(vis.ctx_lo + j) * kv_stride + kvh * hd, hd);
          m = std::max(m, s[j]);
        }
        for (int64_t b = 0; b < vis.blk_hi; ++b) {
          s[nctx + b] = spec.scale * dot(qv, Kb + static_cast<size_t>(n * d.B + b) * kv_stride + kvh * hd, hd);
          m = std::max(m, s[nctx + b]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < nkeys; ++j) {
          s[j] = std::exp(s[j] - m);
          sum += s[j];
        }
        const float inv = static_cast<float>(1.0 / sum);
        float* ov = O + static_cast<size_t>(row) * q_stride + h * hd;
        std::memset(ov, 0, sizeof(float) * static_cast<size_t>(hd));
        for (int64_t j = 0; j < nctx; ++j)
          axpy(ov, s[j] * inv, Vc + static_cast<size_t>(vis.ctx_lo + j) * kv_stride + kvh * hd, hd);
        for (int64_t b = 0; b < vis.blk_hi; ++b)
          axpy(ov, s[nctx + b] * inv, Vb + static_cast<size_t>(n * d.B + b) * kv_stride + kvh * hd, hd);
        L[row * d.nh + h] = m + static_cast<float>(std::log(sum));
      }
    }
  }
}

void cpu_backward(const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx, const Tensor& dk_blk,
                  const Tensor& dv_blk, const Tensor& dout, const Tensor& out, const Tensor& lse, const Tensor& q,
                  const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk,
                  const Tensor& anchors, const Tensor& seq_begin, const BlockAttnSpec& spec, const Dims& d) {
  const float* Q = q.ptr<float>();
  const float* Kc = k_ctx.ptr<float>();
  const float* Vc = v_ctx.ptr<float>();
  const float* Kb = k_blk.ptr<float>();
  const float* Vb = v_blk.ptr<float>();
  const float* O = out.ptr<float>();
  const float* dO = dout.ptr<float>();
  const float* L = lse.ptr<float>();
  float* dQ = dq.ptr<float>();
  float* dKc = dk_ctx.ptr<float>();
  float* dVc = dv_ctx.ptr<float>();
  float* dKb = dk_blk.ptr<float>();
  float* dVb = dv_blk.ptr<float>();
  std::memset(dKc, 0, dk_ctx.nbytes());
  std::memset(dVc, 0, dv_ctx.nbytes());
  std::memset(dKb, 0, dk_blk.nbytes());
  std::memset(dVb, 0, dv_blk.nbytes());
  const int32_t* an = anchors.ptr<int32_t>();
  const int32_t* sb = seq_begin.ptr<int32_t>();
  const int64_t group = d.nh / d.nkv, hd = d.hd, kv_stride = d.nkv * hd, q_stride = d.nh * hd;
  for (int64_t n = 0; n < d.N; ++n) {
    for (int64_t o = 0; o < d.B; ++o) {
      const int64_t row = n * d.B + o;
      const Visible vis = visible(an[n], sb[n], o, d.B, spec.window);
      const int64_t nctx = vis.ctx_hi - vis.ctx_lo;
      for (int64_t h = 0; h < d.nh; ++h) {
        const int64_t kvh = h / group;
        const size_t qoff = static_cast<size_t>(row) * q_stride + h * hd;
        const float* qv = Q + qoff;
        const float* dov = dO + qoff;
        float* dqv = dQ + qoff;
        std::memset(dqv, 0, sizeof(float) * static_cast<size_t>(hd));
        const float Di = dot(dov, O + qoff, hd);  // sum_j p_j dP_j
        const float l = L[row * d.nh + h];
        // One key: p = softmax weight, dS = p (dP - D); dq += scale dS k; dk += scale dS q; dv += p dout.
        auto key = [&](const float* kv, const float* vv, float* dk, float* dv) {
          const float p = std::exp(spec.scale * dot(qv, kv, hd) - l);
          const float dS = p * (dot(dov, vv, hd) - Di);
          axpy(dqv, spec.scale * dS, kv, hd);
          axpy(dk, spec.scale * dS, qv, hd);
          axpy(dv, p, dov, hd);
        };
        for (int64_t j = 0; j < nctx; ++j) {
          const size_t off = static_cast<size_t>(vis.ctx_lo + j) * kv_stride + kvh * hd;
          key(Kc + off, Vc + off, dKc + off, dVc + off);
        }
        for (int64_t b = 0; b < vis.blk_hi; ++b) {
          const size_t off = static_cast<size_t>(n * d.B + b) * kv_stride + kvh * hd;
          key(Kb + off, Vb + off, dKb + off, dVb + off);
        }
      }
    }
  }
}

}  // namespace

void block_attention_forward(const Ctx& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                             const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk,
                             const Tensor& anchors, const Tensor& seq_begin, const BlockAttnSpec& spec) {
  const char* op = "block_attention_forward";
  const Dims d = check_args(op, ctx, q, k_ctx, v_ctx, k_blk, v_blk, anchors, seq_begin, spec);
  detail::check_tensor(op, "out", out, ctx, 3);
  detail::check_shape(op, "out", out, {d.N * d.B, d.nh, d.hd});
  detail::check_tensor(op, "lse", lse, ctx, 2);
  detail::check_shape(op, "lse", lse, {d.N * d.B, d.nh});
  if (ctx.device == Device::CUDA) {
#ifdef DFLASH_HAVE_CUDA
    detail::cuda_op_missing(op);
#else
    detail::no_cuda_build(op);
#endif
  }
  cpu_forward(out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, seq_begin, spec, d);
}

void block_attention_backward(const Ctx& ctx, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                              const Tensor& dk_blk, const Tensor& dv_blk, const Tensor& dout, const Tensor& out,
                              const Tensor& lse, const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx,
                              const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors,
                              const Tensor& seq_begin, const BlockAttnSpec& spec) {
  const char* op = "block_attention_backward";
  const Dims d = check_args(op, ctx, q, k_ctx, v_ctx, k_blk, v_blk, anchors, seq_begin, spec);
  for (const Tensor* t : {&dq, &dout, &out}) {
    detail::check_tensor(op, "dq/dout/out", *t, ctx, 3);
    detail::check_shape(op, "dq/dout/out", *t, {d.N * d.B, d.nh, d.hd});
  }
  for (const Tensor* t : {&dk_ctx, &dv_ctx}) {
    detail::check_tensor(op, "dk_ctx/dv_ctx", *t, ctx, 3);
    detail::check_shape(op, "dk_ctx/dv_ctx", *t, {d.T, d.nkv, d.hd});
  }
  for (const Tensor* t : {&dk_blk, &dv_blk}) {
    detail::check_tensor(op, "dk_blk/dv_blk", *t, ctx, 3);
    detail::check_shape(op, "dk_blk/dv_blk", *t, {d.N * d.B, d.nkv, d.hd});
  }
  detail::check_tensor(op, "lse", lse, ctx, 2);
  detail::check_shape(op, "lse", lse, {d.N * d.B, d.nh});
  if (ctx.device == Device::CUDA) {
#ifdef DFLASH_HAVE_CUDA
    detail::cuda_op_missing(op);
#else
    detail::no_cuda_build(op);
#endif
  }
  cpu_backward(dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors,
               seq_begin, spec, d);
}

}  // namespace dflash::ops
