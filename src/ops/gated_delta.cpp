// Gated DeltaNet ops on the CPU (float32): causal depthwise conv + SiLU, the decay/beta gates, and the
// gated delta rule as a plain sequential recurrence per sequence and value head.
//
// Hugging Face runs the delta rule chunked (torch_chunk_gated_delta_rule, a UT-transform rewrite of the
// same recurrence); the golden files were made that way in float64. The recurrence below is the
// definition (torch_recurrent_gated_delta_rule), so the two agree to rounding.
#include "ops/gated_delta.h"

#include <cmath>

#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

constexpr int64_t kMaxGdnHeadDim = 1024;  // per-token head vectors are staged on the stack

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float siluf(float x) { return x * sigmoidf(x); }
// torch.nn.functional.softplus(x) with beta 1, threshold 20.
inline float softplusf(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// cu_seqlens must be host I32 running from 0 to T, non-decreasing; returns the sequence count.
int check_cu_seqlens(const char* op, const Tensor& cu_seqlens, int64_t T) {
  DF_CHECK(!cu_seqlens.empty() && cu_seqlens.ndim == 1 && cu_seqlens.shape[0] >= 1 && cu_seqlens.dtype == DType::I32,
           Internal, op << ": cu_seqlens must be a non-empty I32 vector, got " << cu_seqlens.shape_str());
  DF_CHECK(cu_seqlens.device == Device::CPU, Internal, op << ": cu_seqlens must be in host memory on the CPU");
  const int32_t* cu = cu_seqlens.ptr<int32_t>();
  const int nseq = static_cast<int>(cu_seqlens.shape[0]) - 1;
  DF_CHECK(cu[0] == 0 && cu[nseq] == T, Internal,
           op << ": cu_seqlens must run from 0 to T=" << T << ", got " << cu[0] << ".." << cu[nseq]);
  for (int s = 0; s < nseq; ++s) DF_CHECK(cu[s] <= cu[s + 1], Internal, op << ": cu_seqlens decreases at " << s);
  return nseq;
}

void causal_conv1d_silu_cpu(float* out, const float* in, const float* w, const int32_t* cu, int nseq, int64_t C,
                            int64_t K) {
  for (int s = 0; s < nseq; ++s) {
    const int64_t s0 = cu[s], s1 = cu[s + 1];
    for (int64_t t = s0; t < s1; ++t) {
      float* o = out + static_cast<size_t>(t) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = 0.0f;
      // Tap j reads token t - (K-1) + j; taps before the sequence start read the zero padding.
      for (int64_t j = 0; j < K; ++j) {
        const int64_t u = t - (K - 1) + j;
        if (u < s0) continue;
        const float* x = in + static_cast<size_t>(u) * C;
        for (int64_t c = 0; c < C; ++c) o[c] += w[c * K + j] * x[c];
      }
      for (int64_t c = 0; c < C; ++c) o[c] = siluf(o[c]);
    }
  }
}

// y = x / sqrt(sum x^2 + 1e-6) * scale (the FLA / transformers l2norm, eps inside the root).
inline void l2norm_scaled(float* y, const float* x, int64_t d, float scale) {
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = static_cast<float>(1.0 / std::sqrt(ss + 1e-6)) * scale;
  for (int64_t i = 0; i < d; ++i) y[i] = x[i] * r;
}

void gated_delta_rule_cpu(float* out, float* state, const float* qkv, const float* g, const float* beta,
                          const int32_t* cu, int nseq, GdnHeads hd) {
  const int64_t nk = hd.nk, dk = hd.dk, nv = hd.nv, dv = hd.dv;
  const int64_t row = hd.qkv_dim(), group = nv / nk;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  float q[kMaxGdnHeadDim], k[kMaxGdnHeadDim], delta[kMaxGdnHeadDim];
  for (int s = 0; s < nseq; ++s) {
    for (int64_t h = 0; h < nv; ++h) {
      const int64_t kh = h / group;
      float* S = state + static_cast<size_t>(h) * dk * dv;  // S[i, j]: key dim i, value dim j
      for (int64_t i = 0; i < dk * dv; ++i) S[i] = 0.0f;
      for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
        const float* x = qkv + static_cast<size_t>(t) * row;
        l2norm_scaled(q, x + kh * dk, dk, q_scale);
        l2norm_scaled(k, x + nk * dk + kh * dk, dk, 1.0f);
        const float* v = x + 2 * nk * dk + h * dv;
        const size_t gi = static_cast<size_t>(t) * nv + h;
        const float decay = std::exp(g[gi]), b = beta[gi];
        // Pass 1: decay S and read the memory at k: delta = beta (v - S^T k).
        for (int64_t j = 0; j < dv; ++j) delta[j] = 0.0f;
        for (int64_t i = 0; i < dk; ++i) {
          float* Si = S + i * dv;
          for (int64_t j = 0; j < dv; ++j) {
            Si[j] *= decay;
            delta[j] += Si[j] * k[i];
          }
        }
        for (int64_t j = 0; j < dv; ++j) delta[j] = (v[j] - delta[j]) * b;
        // Pass 2: write k delta^T, read the output at q.
        float* o = out + static_cast<size_t>(t) * nv * dv + h * dv;
        for (int64_t j = 0; j < dv; ++j) o[j] = 0.0f;
        for (int64_t i = 0; i < dk; ++i) {
          float* Si = S + i * dv;
          for (int64_t j = 0; j < dv; ++j) {
            Si[j] += k[i] * delta[j];
            o[j] += Si[j] * q[i];
          }
        }
      }
    }
  }
}

}  // namespace

void causal_conv1d_silu_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& w,
                                const Tensor& cu_seqlens) {
  constexpr const char* op = "causal_conv1d_silu_forward";
  detail::check_tensor(op, "in", in, ctx, 2);
  const int64_t T = in.shape[0], C = in.shape[1];
  detail::check_tensor(op, "out", out, ctx, 2);
  detail::check_shape(op, "out", out, {T, C});
  detail::check_tensor(op, "w", w, ctx, 2);
  detail::check_shape(op, "w", w, {C, -1});
  DF_CHECK(w.shape[1] >= 1, Internal, op << ": conv kernel size must be >= 1, got " << w.shape_str());
  DF_CHECK(out.data != in.data, Internal, op << ": out must not alias in");
  if (ctx.device == Device::CUDA)
    return cuda::library_for("causal_conv1d_silu_forward").causal_conv1d_silu_forward(ctx, out, in, w, cu_seqlens);
  for (const Tensor* t : {&out, &in, &w}) detail::check_cpu_dtype(op, "out/in/w", *t, DType::F32);
  const int nseq = check_cu_seqlens(op, cu_seqlens, T);
  causal_conv1d_silu_cpu(out.ptr<float>(), in.ptr<float>(), w.ptr<float>(), cu_seqlens.ptr<int32_t>(), nseq, C,
                         w.shape[1]);
}

void gdn_gates_forward(const Ctx& ctx, const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& b,
                       const Tensor& A_log, const Tensor& dt_bias) {
  constexpr const char* op = "gdn_gates_forward";
  detail::check_tensor(op, "a", a, ctx, 2);
  const int64_t T = a.shape[0], nv = a.shape[1];
  for (const Tensor* t : {&g, &beta, &b}) {
    detail::check_tensor(op, "g/beta/b", *t, ctx, 2);
    detail::check_shape(op, "g/beta/b", *t, {T, nv});
  }
  for (const Tensor* t : {&A_log, &dt_bias}) {
    detail::check_tensor(op, "A_log/dt_bias", *t, ctx, 1);
    detail::check_shape(op, "A_log/dt_bias", *t, {nv});
  }
  if (ctx.device == Device::CUDA)
    return cuda::library_for("gdn_gates_forward").gdn_gates_forward(ctx, g, beta, a, b, A_log, dt_bias);
  for (const Tensor* t : {&g, &beta, &a, &b, &A_log, &dt_bias})
    detail::check_cpu_dtype(op, "g/beta/a/b/A_log/dt_bias", *t, DType::F32);
  float* gp = g.ptr<float>();
  float* bp = beta.ptr<float>();
  const float *ap = a.ptr<float>(), *bin = b.ptr<float>();
  const float *A = A_log.ptr<float>(), *dt = dt_bias.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nv; ++h) {
      const size_t i = static_cast<size_t>(t) * nv + h;
      gp[i] = -std::exp(A[h]) * softplusf(ap[i] + dt[h]);
      bp[i] = sigmoidf(bin[i]);
    }
}

void gated_delta_rule_forward(const Ctx& ctx, const Tensor& out, const Tensor& state, const Tensor& qkv,
                              const Tensor& g, const Tensor& beta, const Tensor& cu_seqlens, GdnHeads heads,
                              const Tensor& workspace) {
  constexpr const char* op = "gated_delta_rule_forward";
  DF_CHECK(heads.nk > 0 && heads.dk > 0 && heads.nv > 0 && heads.dv > 0 && heads.nv % heads.nk == 0, Internal,
           op << ": bad heads nk=" << heads.nk << " dk=" << heads.dk << " nv=" << heads.nv << " dv=" << heads.dv
              << " (nv must be a multiple of nk)");
  DF_CHECK(heads.dk <= kMaxGdnHeadDim && heads.dv <= kMaxGdnHeadDim, Internal,
           op << ": head dims " << heads.dk << "/" << heads.dv << " above the supported " << kMaxGdnHeadDim);
  detail::check_tensor(op, "qkv", qkv, ctx, 2);
  const int64_t T = qkv.shape[0];
  detail::check_shape(op, "qkv", qkv, {T, heads.qkv_dim()});
  detail::check_tensor(op, "out", out, ctx, 2);
  detail::check_shape(op, "out", out, {T, heads.value_dim()});
  detail::check_tensor(op, "state", state, ctx, 3);
  detail::check_shape(op, "state", state, {heads.nv, heads.dk, heads.dv});
  for (const Tensor* t : {&g, &beta}) {
    detail::check_tensor(op, "g/beta", *t, ctx, 2);
    detail::check_shape(op, "g/beta", *t, {T, heads.nv});
  }
  DF_CHECK(out.data != qkv.data, Internal, op << ": out must not alias qkv");
  if (ctx.device == Device::CUDA)
    return cuda::library_for("gated_delta_rule_forward")
        .gated_delta_rule_forward(ctx, out, state, qkv, g, beta, cu_seqlens, heads, workspace);
  for (const Tensor* t : {&out, &state, &qkv, &g, &beta})
    detail::check_cpu_dtype(op, "out/state/qkv/g/beta", *t, DType::F32);
  const int nseq = check_cu_seqlens(op, cu_seqlens, T);
  gated_delta_rule_cpu(out.ptr<float>(), state.ptr<float>(), qkv.ptr<float>(), g.ptr<float>(), beta.ptr<float>(),
                       cu_seqlens.ptr<int32_t>(), nseq, heads);
}

}  // namespace dflash::ops
