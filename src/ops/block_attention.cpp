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

// The hot loops are compiled for AVX-512 / AVX2 as well as the baseline and picked at load time (as in
// src/ops/matmul.cpp); helpers they call are always inlined so each clone gets its own copy.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DF_ATTN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DF_ATTN_CLONES
#endif
#define DF_ATTN_INLINE inline __attribute__((always_inline))
// The vector helpers are always inlined, so the AVX argument-passing ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

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

DF_ATTN_INLINE float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
DF_ATTN_INLINE void axpy(float* y, float alpha, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Work is organised per (block, kv head): the M = B * G query vectors of the block's B rows and the G
// query heads sharing that kv head see (almost) the same keys, so each key is loaded once and used for
// all M queries. Inner loops run over M or hd with independent lanes (vectorisable without reordering
// a floating-point reduction). Sliding-window layers take the union of the rows' context ranges and
// mask per row.
struct BlockKeys {
  int64_t ctx_lo, nctx, nkeys;
};
DF_ATTN_INLINE BlockKeys block_keys(int64_t a, int64_t s0, int64_t B, int window) {
  BlockKeys k;
  k.ctx_lo = window > 0 ? std::max<int64_t>(s0, a - (window - 1)) : s0;
  if (k.ctx_lo > a) k.ctx_lo = a;
  k.nctx = a - k.ctx_lo;
  k.nkeys = k.nctx + B;
  return k;
}
// Whether query row offset o sees key j of the block's key list (sliding windows only restrict).
DF_ATTN_INLINE bool key_visible(int64_t j, int64_t o, const BlockKeys& bk, int64_t a, int window, bool full_block) {
  if (window <= 0) return true;
  if (j < bk.nctx) return bk.ctx_lo + j >= a + o - (window - 1);
  return full_block || j - bk.nctx <= o;
}

struct Scratch {
  std::vector<float> qt, qc, doc_t, doc, s, ds, rowmax, rowsum, dsum, lse;
  std::vector<const float*> kp, vp;
  std::vector<float*> dkp, dvp;
  void reserve(size_t m, size_t hd, size_t keys) {
    auto grow = [](auto& v, size_t n) {
      if (v.size() < n) v.resize(n);
    };
    for (auto* v : {&qt, &qc, &doc_t, &doc}) grow(*v, m * hd);
    grow(s, m * keys);
    grow(ds, m * keys);
    for (auto* v : {&rowmax, &rowsum, &dsum, &lse}) grow(*v, m);
    grow(kp, keys);
    grow(vp, keys);
    grow(dkp, keys);
    grow(dvp, keys);
  }
};
// Grows only when a longer key range appears (not per call).
thread_local Scratch tl_scratch;

struct Geometry {
  const Dims& d;
  int64_t group, kv_stride, q_stride;
  explicit Geometry(const Dims& dims)
      : d(dims), group(dims.nh / dims.nkv), kv_stride(dims.nkv * dims.hd), q_stride(dims.nh * dims.hd) {}
  // query m of (block n, kv head kvh): row offset o = m / group, head kvh * group + m % group
  DF_ATTN_INLINE size_t q_off(int64_t n, int64_t kvh, int64_t m) const {
    return static_cast<size_t>(n * d.B + m / group) * q_stride + (kvh * group + m % group) * d.hd;
  }
  // Offset of key j of the block's key list (context keys first, then the block's own).
  DF_ATTN_INLINE size_t key_off(int64_t n, int64_t kvh, const BlockKeys& bk, int64_t j) const {
    const int64_t row = j < bk.nctx ? bk.ctx_lo + j : n * d.B + (j - bk.nctx);
    return static_cast<size_t>(row) * kv_stride + kvh * d.hd;
  }
};

constexpr int kLanes = 16;  // one AVX-512 register, two AVX2 registers
typedef float v16 __attribute__((vector_size(64), aligned(4)));  // unaligned loads allowed
DF_ATTN_INLINE v16 load16(const float* p) { return *reinterpret_cast<const v16*>(p); }
DF_ATTN_INLINE void store16(float* p, v16 v) { *reinterpret_cast<v16*>(p) = v; }
DF_ATTN_INLINE v16 splat16(float x) { return v16{} + x; }

// out[m] = scale * sum_e x[e] * yt[e*M + m] for m in [0, M)   (yt is [hd, M]: queries transposed)
DF_ATTN_INLINE void dot_columns(float* out, const float* x, const float* yt, int64_t hd, int64_t M, float scale) {
  int64_t m0 = 0;
  for (; m0 + kLanes <= M; m0 += kLanes) {
    v16 acc = {};
    for (int64_t e = 0; e < hd; ++e) acc += splat16(x[e]) * load16(yt + e * M + m0);
    store16(out + m0, acc * scale);
  }
  for (; m0 < M; ++m0) {
    float a = 0.f;
    for (int64_t e = 0; e < hd; ++e) a += x[e] * yt[e * M + m0];
    out[m0] = a * scale;
  }
}

// out[e] = scale * sum_j w[j * stride] * rows[j][e] for e in [0, hd)
DF_ATTN_INLINE void weighted_rows(float* out, const float* w, int64_t stride, const float* const* rows, int64_t n,
                                  int64_t hd, float scale) {
  int64_t e0 = 0;
  for (; e0 + kLanes <= hd; e0 += kLanes) {
    v16 acc = {};
    for (int64_t j = 0; j < n; ++j) acc += splat16(w[j * stride]) * load16(rows[j] + e0);
    store16(out + e0, acc * scale);
  }
  for (; e0 < hd; ++e0) {
    float a = 0.f;
    for (int64_t j = 0; j < n; ++j) a += w[j * stride] * rows[j][e0];
    out[e0] = a * scale;
  }
}

// out[e] += sum_m w[m] * rows[m*hd + e]   (rows contiguous [M, hd])
DF_ATTN_INLINE void accumulate_rows(float* out, const float* w, const float* rows, int64_t M, int64_t hd) {
  int64_t e0 = 0;
  for (; e0 + kLanes <= hd; e0 += kLanes) {
    v16 acc = {};
    for (int64_t m = 0; m < M; ++m) acc += splat16(w[m]) * load16(rows + m * hd + e0);
    store16(out + e0, load16(out + e0) + acc);
  }
  for (; e0 < hd; ++e0) {
    float a = 0.f;
    for (int64_t m = 0; m < M; ++m) a += w[m] * rows[m * hd + e0];
    out[e0] += a;
  }
}

// Gathers the block's queries (transposed [hd, M]) and key/value pointers; s[j*M + m] = scaled scores,
// -inf where a sliding window hides key j from query m.
DF_ATTN_INLINE void block_scores(const Geometry& geo, int64_t n, int64_t kvh, const BlockKeys& bk, int64_t a,
                                 const BlockAttnSpec& spec, const float* Kc, const float* Kb, Scratch& sc) {
  const int64_t M = geo.d.B * geo.group, hd = geo.d.hd;
  float* s = sc.s.data();
  for (int64_t j = 0; j < bk.nkeys; ++j) {
    const float* kp = (j < bk.nctx ? Kc : Kb) + geo.key_off(n, kvh, bk, j);
    sc.kp[j] = kp;
    dot_columns(s + j * M, kp, sc.qt.data(), hd, M, spec.scale);
    if (spec.window > 0)
      for (int64_t m = 0; m < M; ++m)
        if (!key_visible(j, m / geo.group, bk, a, spec.window, spec.full_block)) s[j * M + m] = -std::numeric_limits<float>::infinity();
  }
}

DF_ATTN_CLONES void cpu_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k_ctx,
                                const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors,
                                const Tensor& seq_begin, const BlockAttnSpec& spec, const Dims& d) {
  const float* Q = q.ptr<float>();
  const float* Kc = k_ctx.ptr<float>();
  const float* Vc = v_ctx.ptr<float>();
  const float* Kb = k_blk.ptr<float>();
  const float* Vb = v_blk.ptr<float>();
  float* O = out.ptr<float>();
  float* L = lse.ptr<float>();
  const int32_t* an = anchors.ptr<int32_t>();
  const int32_t* sb = seq_begin.ptr<int32_t>();
  const Geometry geo(d);
  const int64_t M = d.B * geo.group, hd = d.hd;
  Scratch& sc = tl_scratch;
  for (int64_t n = 0; n < d.N; ++n) {
    // The block's own keys come last in its key list: a block of block_rows rows is its first ones.
    const BlockKeys bk = block_keys(an[n], sb[n], spec.visible_block_rows(), spec.window);
    sc.reserve(static_cast<size_t>(M), static_cast<size_t>(hd), static_cast<size_t>(bk.nkeys));
    float* s = sc.s.data();
    for (int64_t kvh = 0; kvh < d.nkv; ++kvh) {
      for (int64_t m = 0; m < M; ++m) {
        const float* qm = Q + geo.q_off(n, kvh, m);
        for (int64_t e = 0; e < hd; ++e) sc.qt[e * M + m] = qm[e];
      }
      block_scores(geo, n, kvh, bk, an[n], spec, Kc, Kb, sc);
      for (int64_t j = 0; j < bk.nkeys; ++j) sc.vp[j] = (j < bk.nctx ? Vc : Vb) + geo.key_off(n, kvh, bk, j);
      float* mx = sc.rowmax.data();
      float* sum = sc.rowsum.data();
      for (int64_t m = 0; m < M; ++m) {
        mx[m] = -std::numeric_limits<float>::infinity();
        sum[m] = 0.f;
      }
      for (int64_t j = 0; j < bk.nkeys; ++j)
        for (int64_t m = 0; m < M; ++m) mx[m] = std::max(mx[m], s[j * M + m]);
      for (int64_t j = 0; j < bk.nkeys; ++j)
        for (int64_t m = 0; m < M; ++m) {
          const float p = std::exp(s[j * M + m] - mx[m]);
          s[j * M + m] = p;
          sum[m] += p;
        }
      for (int64_t m = 0; m < M; ++m) {
        weighted_rows(O + geo.q_off(n, kvh, m), s + m, M, sc.vp.data(), bk.nkeys, hd, 1.f / sum[m]);
        const int64_t row = n * d.B + m / geo.group, h = kvh * geo.group + m % geo.group;
        L[row * d.nh + h] = mx[m] + std::log(sum[m]);
      }
    }
  }
}

DF_ATTN_CLONES void cpu_backward(const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx, const Tensor& dk_blk,
                                 const Tensor& dv_blk, const Tensor& dout, const Tensor& out, const Tensor& lse,
                                 const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk,
                                 const Tensor& v_blk, const Tensor& anchors, const Tensor& seq_begin,
                                 const BlockAttnSpec& spec, const Dims& d) {
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
  const Geometry geo(d);
  const int64_t M = d.B * geo.group, hd = d.hd;
  Scratch& sc = tl_scratch;
  for (int64_t n = 0; n < d.N; ++n) {
    const BlockKeys bk = block_keys(an[n], sb[n], d.B, spec.window);
    sc.reserve(static_cast<size_t>(M), static_cast<size_t>(hd), static_cast<size_t>(bk.nkeys));
    float* s = sc.s.data();
    float* ds = sc.ds.data();
    for (int64_t kvh = 0; kvh < d.nkv; ++kvh) {
      float* Dm = sc.dsum.data();
      float* lm = sc.lse.data();
      for (int64_t m = 0; m < M; ++m) {
        const size_t off = geo.q_off(n, kvh, m);
        for (int64_t e = 0; e < hd; ++e) {
          sc.qt[e * M + m] = Q[off + e];
          sc.doc_t[e * M + m] = dO[off + e];
          sc.qc[m * hd + e] = Q[off + e];
          sc.doc[m * hd + e] = dO[off + e];
        }
        Dm[m] = dot(dO + off, O + off, hd);  // sum_j p_j dP_j
        lm[m] = L[(n * d.B + m / geo.group) * d.nh + kvh * geo.group + m % geo.group];
      }
      block_scores(geo, n, kvh, bk, an[n], spec, Kc, Kb, sc);
      for (int64_t j = 0; j < bk.nkeys; ++j) {
        const size_t off = geo.key_off(n, kvh, bk, j);
        const bool is_ctx = j < bk.nctx;
        const float* vp = (is_ctx ? Vc : Vb) + off;
        float* pj = s + j * M;  // scores -> probabilities
        float* dsj = ds + j * M;
        for (int64_t m = 0; m < M; ++m) pj[m] = std::exp(pj[m] - lm[m]);
        dot_columns(dsj, vp, sc.doc_t.data(), hd, M, 1.f);  // dP_jm = dO_m . v_j
        for (int64_t m = 0; m < M; ++m) dsj[m] = pj[m] * (dsj[m] - Dm[m]) * spec.scale;  // scale * dS
        accumulate_rows((is_ctx ? dVc : dVb) + off, pj, sc.doc.data(), M, hd);   // dv_j += sum_m p dO_m
        accumulate_rows((is_ctx ? dKc : dKb) + off, dsj, sc.qc.data(), M, hd);  // dk_j += sum_m scale dS q_m
      }
      for (int64_t m = 0; m < M; ++m)  // dq_m = sum_j scale dS_jm k_j
        weighted_rows(dQ + geo.q_off(n, kvh, m), ds + m, M, sc.kp.data(), bk.nkeys, hd, 1.f);
    }
  }
}

}  // namespace

void block_attention_forward(const Ctx& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                             const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk,
                             const Tensor& anchors, const Tensor& seq_begin, const BlockAttnSpec& spec) {
  const char* op = "block_attention_forward";
  const Dims d = check_args(op, ctx, q, k_ctx, v_ctx, k_blk, v_blk, anchors, seq_begin, spec);
  check_block_rows(op, spec, AttnPass::Forward);
  detail::check_tensor(op, "out", out, ctx, 3);
  detail::check_shape(op, "out", out, {d.N * d.B, d.nh, d.hd});
  detail::check_tensor(op, "lse", lse, ctx, 2);
  detail::check_shape(op, "lse", lse, {d.N * d.B, d.nh});
  if (ctx.device == Device::CUDA)
    return cuda::library_for("block_attention_forward")
        .block_attention_forward(ctx, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, seq_begin, spec);
  cpu_forward(out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, seq_begin, spec, d);
}

void block_attention_backward(const Ctx& ctx, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                              const Tensor& dk_blk, const Tensor& dv_blk, const Tensor& dout, const Tensor& out,
                              const Tensor& lse, const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx,
                              const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors,
                              const Tensor& seq_begin, const BlockAttnSpec& spec) {
  const char* op = "block_attention_backward";
  const Dims d = check_args(op, ctx, q, k_ctx, v_ctx, k_blk, v_blk, anchors, seq_begin, spec);
  check_block_rows(op, spec, AttnPass::Backward);
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
  if (ctx.device == Device::CUDA)
    return cuda::library_for("block_attention_backward")
        .block_attention_backward(ctx, dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx, v_ctx, k_blk,
                                  v_blk, anchors, seq_begin, spec);
  cpu_backward(dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors,
               seq_begin, spec, d);
}

}  // namespace dflash::ops
