// Chunked lm_head loss on CUDA; see lm_loss.cuh. Shapes: R rows, H hidden, V vocabulary, C rows per chunk.
#include "lm_loss.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "drafter_blas.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 1024;  // one CTA per row of logits

// Online softmax statistics of a row: max, sum of exp(x - max), index of the (first) max.
// For the teacher also A = sum exp(t - max_t) (t - x), which gives KL(p || q) without a second pass.
struct Stats {
  float m, s;
  int idx;
};
struct TeacherStats {
  float m, s, A;
  int idx;
};

__device__ __forceinline__ void stats_add(Stats& a, float x, int i) {
  if (x > a.m) {
    a.s = a.s * __expf(a.m - x) + 1.f;
    a.m = x;
    a.idx = i;
  } else {
    a.s += __expf(x - a.m);
  }
}
__device__ __forceinline__ Stats stats_merge(Stats a, Stats b) {
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  Stats r;
  r.m = fmaxf(a.m, b.m);
  r.s = a.s * __expf(a.m - r.m) + b.s * __expf(b.m - r.m);
  r.idx = a.m > b.m ? a.idx : b.m > a.m ? b.idx : min(a.idx, b.idx);
  return r;
}
__device__ __forceinline__ void tstats_add(TeacherStats& a, float t, float x, int i) {
  if (t > a.m) {
    const float c = __expf(a.m - t);
    a.s = a.s * c + 1.f;
    a.A = a.A * c + (t - x);
    a.m = t;
    a.idx = i;
  } else {
    const float e = __expf(t - a.m);
    a.s += e;
    a.A += e * (t - x);
  }
}
__device__ __forceinline__ TeacherStats tstats_merge(TeacherStats a, TeacherStats b) {
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  TeacherStats r;
  r.m = fmaxf(a.m, b.m);
  const float ca = __expf(a.m - r.m), cb = __expf(b.m - r.m);
  r.s = a.s * ca + b.s * cb;
  r.A = a.A * ca + b.A * cb;
  r.idx = a.m > b.m ? a.idx : b.m > a.m ? b.idx : min(a.idx, b.idx);
  return r;
}

template <class T, class Merge>
__device__ __forceinline__ T block_reduce(T v, Merge merge, T* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    T other;
    const unsigned* src = reinterpret_cast<const unsigned*>(&v);
    unsigned* dst = reinterpret_cast<unsigned*>(&other);
#pragma unroll
    for (int k = 0; k < int(sizeof(T) / 4); ++k) dst[k] = __shfl_xor_sync(0xffffffffu, src[k], o);
    v = merge(v, other);
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = red[0];
  for (int w = 1; w < kThreads / 32; ++w) r = merge(r, red[w]);
  __syncthreads();
  return r;
}

// ---- DFlash2: a warp's top-K (K <= 64) of a row, value descending, ties by lower id ---------------------
// The list lives in registers across the warp: slot l in (v0, i0) of lane l, slot 32 + l in (v1, i1); empty
// slots hold (-inf, INT_MAX). Each element a lane sees is compared with the threshold (slot K-1); the few
// that beat it (~K ln(n / K) of n, for logits in random order) are inserted one at a time: a ballot gives the
// position, a shuffle shifts the slots behind it.
constexpr int kMaxTopK = 64;
struct WarpTopK {
  float v0, v1, tv;
  int i0, i1, ti;
};
__device__ __forceinline__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }
__device__ __forceinline__ void topk_init(WarpTopK& L) {
  L.v0 = L.v1 = L.tv = -INFINITY;
  L.i0 = L.i1 = L.ti = INT_MAX;
}
// (v, id), the same in every lane, beats the threshold: insert it. Every lane of the warp calls this.
__device__ __forceinline__ void topk_insert(WarpTopK& L, float v, int id, int K, int lane) {
  constexpr unsigned kAll = 0xffffffffu;
  const int pos = __popc(__ballot_sync(kAll, lane < K && better(L.v0, L.i0, v, id))) +
                  __popc(__ballot_sync(kAll, lane + 32 < K && better(L.v1, L.i1, v, id)));
  const float up_v0 = __shfl_up_sync(kAll, L.v0, 1), last_v0 = __shfl_sync(kAll, L.v0, 31);
  const int up_i0 = __shfl_up_sync(kAll, L.i0, 1), last_i0 = __shfl_sync(kAll, L.i0, 31);
  float up_v1 = __shfl_up_sync(kAll, L.v1, 1);
  int up_i1 = __shfl_up_sync(kAll, L.i1, 1);
  if (lane == 0) up_v1 = last_v0, up_i1 = last_i0;  // slot 32 takes slot 31
  if (lane == pos) L.v0 = v, L.i0 = id;
  else if (lane > pos) L.v0 = up_v0, L.i0 = up_i0;
  if (lane + 32 == pos) L.v1 = v, L.i1 = id;
  else if (lane + 32 > pos) L.v1 = up_v1, L.i1 = up_i1;
  const int tl = (K - 1) & 31;
  const bool hi = K - 1 >= 32;
  const float tv0 = __shfl_sync(kAll, L.v0, tl), tv1 = __shfl_sync(kAll, L.v1, tl);
  const int ti0 = __shfl_sync(kAll, L.i0, tl), ti1 = __shfl_sync(kAll, L.i1, tl);
  L.tv = hi ? tv1 : tv0;
  L.ti = hi ? ti1 : ti0;
}
// Each lane offers one element (-inf / INT_MAX when it has none); every lane of the warp calls this.
__device__ __forceinline__ void topk_offer(WarpTopK& L, float v, int id, int K, int lane) {
  unsigned m = __ballot_sync(0xffffffffu, better(v, id, L.tv, L.ti));
  while (m) {
    const int src = __ffs(m) - 1;
    m &= m - 1;
    const float cv = __shfl_sync(0xffffffffu, v, src);
    const int ci = __shfl_sync(0xffffffffu, id, src);
    if (better(cv, ci, L.tv, L.ti)) topk_insert(L, cv, ci, K, lane);
  }
}

struct RowArgs {
  int64_t V;
  int64_t r0;               // first global row of the chunk
  const int32_t* labels;    // [R]
  const float* row_weight;  // [R] or null (no gradient)
  float* ce;                // [R] or null
  float* kl;                // [R] or null
  int32_t* argmax_q;        // [R] or null
  int32_t* argmax_p;        // [R] or null
  bool kl_grad;             // gradient of KL (else CE)
  // DFlash2 (docs/dflash2.md 2.3): the drafter logits z = c tanh(m x / c) (c = softcap; m x when c == 0),
  // written over the raw logits in the workspace; the gradient is taken at z, then times dz/dx.
  float multiplier, softcap;
  int K;                     // top-K width (kTopK)
  int32_t* topk_ids;         // [R, K]
  float* topk_vals;          // [R, K]
  float* label_logit;        // [R]
  int extra_K;               // sparse addend width (kExtra)
  const int32_t* extra_ids;  // [R, extra_K]
  const float* extra_dz;     // [R, extra_K]
};

__device__ __forceinline__ float transform_logit(float x, float m, float c) {
  const float z = m * x;
  return c > 0.f ? c * tanhf(z / c) : z;
}
// dz/dx at the transformed logit z: m (1 - tanh^2) = m (1 - (z / c)^2), or m without a softcap.
__device__ __forceinline__ float transform_slope(float z, float m, float c) {
  if (c > 0.f) {
    const float th = z / c;
    return m * (1.f - th * th);
  }
  return m;
}

// One CTA per chunk row c = blockIdx.x. x: drafter logits (fp32 row of V), t: teacher logits or null.
// With a gradient, each tile of kThreads elements is read, then its bf16 gradient is written at element
// offsets of the same tile in a bf16 view of the row: bf16 element i occupies bytes [2i, 2i + 2), inside
// fp32 elements every thread has read by then (the barriers of the gradient loop), so no unread logit is
// overwritten.
//
// Template flags (the DFlash path, all false, compiles to the plain kernel):
//   kTransform: the first pass transforms each logit in place (so top-K, label_logit, the losses and the
//               gradient all see z) and the gradient is multiplied by dz/dx;
//   kTopK:      each warp keeps the top-K of the elements it reads (WarpTopK); warp 0 merges the 32 lists
//               from shared memory (16 KB) and writes topk_ids / topk_vals; label_logit = z[label];
//   kExtra:     the sparse addend extra_dz at extra_ids is added to the gradient at z (before dz/dx): the
//               row's <= 64 pairs go to shared memory and each thread keeps a bit mask of those whose id
//               falls on its columns (id % kThreads == threadIdx.x), so the tile loop pays nothing elsewhere.
template <bool kTransform, bool kTopK, bool kExtra>
__global__ void __launch_bounds__(kThreads) loss_rows_kernel(RowArgs p, float* __restrict__ ws,
                                                             const float* __restrict__ ws_t) {
  __shared__ Stats red_q[kThreads / 32];
  __shared__ TeacherStats red_p[kThreads / 32];
  __shared__ float tk_v[kTopK ? kThreads / 32 * kMaxTopK : 1];
  __shared__ int tk_i[kTopK ? kThreads / 32 * kMaxTopK : 1];
  __shared__ float ex_dz[kExtra ? kMaxTopK : 1];
  __shared__ int ex_id[kExtra ? kMaxTopK : 1];
  const int64_t c = blockIdx.x, r = p.r0 + c, V = p.V;
  float* x = ws + c * V;
  const float* t = ws_t ? ws_t + c * V : nullptr;
  Stats sq{-INFINITY, 0.f, 0};
  TeacherStats sp{-INFINITY, 0.f, 0.f, 0};
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  WarpTopK tk;
  if constexpr (kTopK) topk_init(tk);
  if constexpr (!kTransform && !kTopK) {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float xi = x[i];
      stats_add(sq, xi, int(i));
      if (t) tstats_add(sp, t[i], xi, int(i));
    }
  } else {
    // Tiles of kThreads elements, so every warp runs the same number of iterations (the top-K's ballots).
    for (int64_t i0 = 0; i0 < V; i0 += kThreads) {
      const int64_t i = i0 + threadIdx.x;
      float xi = -INFINITY;
      if (i < V) {
        xi = x[i];
        if constexpr (kTransform) {
          xi = transform_logit(xi, p.multiplier, p.softcap);
          x[i] = xi;
        }
        stats_add(sq, xi, int(i));
        if (t) tstats_add(sp, t[i], xi, int(i));
      }
      if constexpr (kTopK) topk_offer(tk, xi, i < V ? int(i) : INT_MAX, p.K, lane);
    }
  }
  sq = block_reduce(sq, stats_merge, red_q);
  if (t) sp = block_reduce(sp, tstats_merge, red_p);
  const float lse_q = sq.m + logf(sq.s);
  const float lse_p = t ? sp.m + logf(sp.s) : 0.f;
  const int32_t label = p.labels[r];
  const bool label_ok = label >= 0 && label < V;
  if (threadIdx.x == 0) {
    if (p.ce) p.ce[r] = label_ok ? lse_q - x[label] : NAN;
    if (p.argmax_q) p.argmax_q[r] = sq.idx;
    if (t && p.argmax_p) p.argmax_p[r] = sp.idx;
    if (t && p.kl) p.kl[r] = sp.A / sp.s - lse_p + lse_q;
    if constexpr (kTopK) p.label_logit[r] = label_ok ? x[label] : NAN;
  }
  if constexpr (kTopK) {
    const int K = p.K;
    if (lane < K) tk_v[warp * K + lane] = tk.v0, tk_i[warp * K + lane] = tk.i0;
    if (lane + 32 < K) tk_v[warp * K + lane + 32] = tk.v1, tk_i[warp * K + lane + 32] = tk.i1;
    __syncthreads();
    if (warp == 0) {  // warp 0's own list is in its registers: merge the other 31
      for (int b = K; b < kThreads / 32 * K; b += 32) {
        const int e = b + lane;
        const bool has = e < kThreads / 32 * K;
        topk_offer(tk, has ? tk_v[e] : -INFINITY, has ? tk_i[e] : INT_MAX, K, lane);
      }
      if (lane < K) p.topk_vals[r * K + lane] = tk.v0, p.topk_ids[r * K + lane] = tk.i0;
      if (lane + 32 < K) p.topk_vals[r * K + lane + 32] = tk.v1, p.topk_ids[r * K + lane + 32] = tk.i1;
    }
  }
  if (!p.row_weight) return;
  if constexpr (kExtra) {
    if (threadIdx.x < p.extra_K) {
      ex_id[threadIdx.x] = p.extra_ids[r * p.extra_K + threadIdx.x];
      ex_dz[threadIdx.x] = p.extra_dz[r * p.extra_K + threadIdx.x];
    }
  }
  __syncthreads();  // x[label] was read above before any gradient lands on the row
  unsigned long long mine = 0;  // kExtra: the addend entries on this thread's columns
  if constexpr (kExtra) {
    for (int e = 0; e < p.extra_K; ++e)
      if (ex_id[e] >= 0 && ex_id[e] < V && ex_id[e] % kThreads == int(threadIdx.x)) mine |= 1ull << e;
  }
  const float w = p.row_weight[r];
  __nv_bfloat16* g = reinterpret_cast<__nv_bfloat16*>(x);
  // The bf16 gradient of element i lands in fp32 element i / 2 (tile k's writes in tile k / 2), which must
  // have been read by every thread: a barrier before the writes of each of the first kSyncTiles tiles, then
  // one at the start of every group of kSyncTiles tiles (a group starting at tile k >= kSyncTiles writes
  // into tiles <= (2k - 1) / 2 < k, all read before that barrier). 149 barriers per 151936-wide row -> 24.
  constexpr int kSyncTiles = 16;
  int tile = 0;
  for (int64_t i0 = 0; i0 < V; i0 += kThreads, ++tile) {
    const int64_t i = i0 + threadIdx.x;
    float gi = 0.f;
    if (i < V) {
      const float xi = x[i];
      const float qi = __expf(xi - lse_q);
      if (p.kl_grad)
        gi = w * (qi - __expf(t[i] - lse_p));
      else
        gi = w * (qi - (i == label ? 1.f : 0.f));
      if constexpr (kExtra) {
        for (unsigned long long m = mine; m; m &= m - 1) {
          const int e = __ffsll(static_cast<long long>(m)) - 1;
          if (ex_id[e] == i) gi += ex_dz[e];  // a repeated id adds up
        }
      }
      if constexpr (kTransform) gi *= transform_slope(xi, p.multiplier, p.softcap);
    }
    if (tile < kSyncTiles || tile % kSyncTiles == 0) __syncthreads();  // uniform over the CTA
    if (i < V) g[i] = __float2bfloat16_rn(gi);
  }
}

using RowKernel = void (*)(RowArgs, float*, const float*);
template <bool kTransform, bool kTopK>
RowKernel pick_row_kernel(bool extra) {
  return extra ? loss_rows_kernel<kTransform, kTopK, true> : loss_rows_kernel<kTransform, kTopK, false>;
}
RowKernel pick_row_kernel(bool transform, bool topk, bool extra) {
  if (transform) return topk ? pick_row_kernel<true, true>(extra) : pick_row_kernel<true, false>(extra);
  return topk ? pick_row_kernel<false, true>(extra) : pick_row_kernel<false, false>(extra);
}

void run(const Ctx& ctx, const ops::LmLossRowsOut* out, const Tensor& h, const Tensor& lm_head,
         const Tensor& labels, const Tensor& teacher, const Tensor& workspace, int64_t chunk_rows, const Tensor& dh,
         const Tensor& row_weight, ops::LossObjective objective, bool use_teacher, const ops::LogitSpec& logit,
         const Tensor& extra_ids, const Tensor& extra_dz) {
  const char* op = "lm_loss (CUDA)";
  DF_CHECK(h.dtype == DType::BF16 && lm_head.dtype == DType::BF16, Internal, op << ": h and lm_head must be BF16");
  DF_CHECK(teacher.empty() || teacher.dtype == DType::BF16, Internal, op << ": teacher must be BF16");
  DF_CHECK(dh.empty() || dh.dtype == DType::BF16, Internal, op << ": dh must be BF16");
  DF_CHECK(dh.empty() || row_weight.dtype == DType::F32, Internal, op << ": row_weight must be F32");
  DF_CHECK(labels.dtype == DType::I32 && workspace.dtype == DType::F32, Internal,
           op << ": labels must be I32 and the workspace F32");
  const int64_t R = h.shape[0], H = h.shape[1], V = lm_head.shape[0];
  DF_CHECK(V < (int64_t(1) << 30), Internal, op << ": vocabulary of " << V);
  const bool grad = !dh.empty();
  float* ws = static_cast<float*>(workspace.data);
  float* ws_t = use_teacher ? ws + chunk_rows * V : nullptr;
  const auto* W = static_cast<const __nv_bfloat16*>(lm_head.data);
  const auto* hp = static_cast<const __nv_bfloat16*>(h.data);
  const auto* tp = use_teacher ? static_cast<const __nv_bfloat16*>(teacher.data) : nullptr;
  RowArgs p{};
  p.V = V;
  p.labels = static_cast<const int32_t*>(labels.data);
  p.row_weight = grad ? static_cast<const float*>(row_weight.data) : nullptr;
  if (out) {
    p.ce = out->ce.empty() ? nullptr : static_cast<float*>(out->ce.data);
    p.kl = out->kl.empty() ? nullptr : static_cast<float*>(out->kl.data);
    p.argmax_q = out->argmax_q.empty() ? nullptr : static_cast<int32_t*>(out->argmax_q.data);
    p.argmax_p = out->argmax_p.empty() ? nullptr : static_cast<int32_t*>(out->argmax_p.data);
  }
  p.kl_grad = objective == ops::LossObjective::KL;
  const bool transform = !logit.identity();
  DF_CHECK(std::isfinite(logit.multiplier) && logit.softcap >= 0.f, Internal,
           op << ": logit multiplier " << logit.multiplier << ", softcap " << logit.softcap);
  p.multiplier = logit.multiplier;
  p.softcap = logit.softcap;
  const bool topk = out && !out->topk_ids.empty();
  if (out) {
    DF_CHECK(out->topk_ids.empty() == out->topk_vals.empty() && out->topk_ids.empty() == out->label_logit.empty(),
             Internal, op << ": topk_ids, topk_vals and label_logit go together");
  }
  if (topk) {
    const Tensor &ids = out->topk_ids, &vals = out->topk_vals, &ll = out->label_logit;
    DF_CHECK(ids.ndim == 2 && ids.shape[0] == R && ids.dtype == DType::I32, Internal,
             op << ": topk_ids " << ids.shape_str() << " must be I32 [" << R << ", K]");
    p.K = int(ids.shape[1]);
    DF_CHECK(p.K >= 1 && p.K <= kMaxTopK && p.K <= V, Internal, op << ": top-K of " << p.K << " (1..64, <= V)");
    DF_CHECK(vals.dtype == DType::F32 && vals.numel() == ids.numel(), Internal, op << ": topk_vals " << vals.shape_str());
    DF_CHECK(ll.dtype == DType::F32 && ll.numel() == size_t(R), Internal, op << ": label_logit " << ll.shape_str());
    p.topk_ids = static_cast<int32_t*>(ids.data);
    p.topk_vals = static_cast<float*>(vals.data);
    p.label_logit = static_cast<float*>(ll.data);
  }
  DF_CHECK(extra_ids.empty() == extra_dz.empty(), Internal, op << ": extra_ids and extra_dz go together");
  const bool extra = !extra_ids.empty();
  if (extra) {
    DF_CHECK(grad, Internal, op << ": the sparse addend needs the gradient");
    DF_CHECK(extra_ids.ndim == 2 && extra_ids.shape[0] == R && extra_ids.dtype == DType::I32, Internal,
             op << ": extra_ids " << extra_ids.shape_str() << " must be I32 [" << R << ", K]");
    p.extra_K = int(extra_ids.shape[1]);
    DF_CHECK(p.extra_K >= 1 && p.extra_K <= kMaxTopK, Internal, op << ": sparse addend of " << p.extra_K << " (1..64)");
    DF_CHECK(extra_dz.dtype == DType::F32 && extra_dz.numel() == extra_ids.numel(), Internal,
             op << ": extra_dz " << extra_dz.shape_str());
    p.extra_ids = static_cast<const int32_t*>(extra_ids.data);
    p.extra_dz = static_cast<const float*>(extra_dz.data);
  }
  const RowKernel row_kernel = pick_row_kernel(transform, topk, extra);
  for (int64_t r0 = 0; r0 < R; r0 += chunk_rows) {
    const int64_t C = std::min(R, r0 + chunk_rows) - r0;
    // logits^T [V, C] (column-major, ld V) = W [V, H] · h_c^T
    gemm_bf16(ctx, true, false, V, C, H, 1.f, {W, H, 0}, {hp + r0 * H, H, 0}, 0.f, ws, true, V, 0);
    if (use_teacher) gemm_bf16(ctx, true, false, V, C, H, 1.f, {W, H, 0}, {tp + r0 * H, H, 0}, 0.f, ws_t, true, V, 0);
    p.r0 = r0;
    row_kernel<<<unsigned(C), kThreads, 0, stream_of(ctx)>>>(p, ws, ws_t);
    DF_CUDA_LAUNCH();
    // dh_c^T [H, C] = W^T [H, V] · grad^T [V, C]   (grad: bf16 rows of stride 2V inside the fp32 workspace)
    if (grad)
      gemm_bf16(ctx, false, false, H, C, V, 1.f, {W, H, 0}, {ws, 2 * V, 0}, 0.f,
                static_cast<__nv_bfloat16*>(dh.data) + r0 * H, false, H, 0);
  }
}

}  // namespace

void lm_loss_forward(const Ctx& ctx, const ops::LmLossRowsOut& out, const Tensor& h, const Tensor& lm_head,
                     const Tensor& labels, const Tensor& teacher, const Tensor& workspace, int64_t chunk_rows,
                     const Tensor& dh, const Tensor& row_weight, ops::LossObjective objective,
                     const ops::LogitSpec& logit) {
  run(ctx, &out, h, lm_head, labels, teacher, workspace, chunk_rows, dh, row_weight, objective, !teacher.empty(), logit,
      Tensor(), Tensor());
}

void lm_loss_backward(const Ctx& ctx, const Tensor& dh, const Tensor& row_weight, ops::LossObjective objective,
                      const Tensor& h, const Tensor& lm_head, const Tensor& labels, const Tensor& teacher,
                      const Tensor& workspace, int64_t chunk_rows, const ops::LogitSpec& logit,
                      const Tensor& extra_ids, const Tensor& extra_dz) {
  run(ctx, nullptr, h, lm_head, labels, teacher, workspace, chunk_rows, dh, row_weight, objective,
      objective == ops::LossObjective::KL, logit, extra_ids, extra_dz);
}

namespace {

// dh[r] += sum_i dz[r,i] slope(z[r,i]) lm_head[ids[r,i]]: one block a row, the K coefficients in shared memory,
// threads across H (coalesced reads of each lm_head row), one fp32 sum per element, rounded to bf16 once.
__global__ void sparse_backward_kernel(__nv_bfloat16* __restrict__ dh, const int32_t* __restrict__ ids,
                                       const float* __restrict__ z, const float* __restrict__ dz,
                                       const __nv_bfloat16* __restrict__ W, const __nv_bfloat16* __restrict__ extra,
                                       int64_t H, int K, int64_t V, float m, float c) {
  __shared__ float coef[64];
  __shared__ int64_t row[64];
  const int64_t r = blockIdx.x;
  if (threadIdx.x < K) {
    const int i = threadIdx.x;
    const float zi = z[r * K + i];
    const float slope = c > 0.f ? m * (1.f - (zi / c) * (zi / c)) : m;
    const int32_t v = ids[r * K + i];
    const bool ok = v >= 0 && v < V;
    coef[i] = ok ? dz[r * K + i] * slope : 0.f;
    row[i] = ok ? int64_t(v) * H : 0;
  }
  __syncthreads();
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = extra ? __bfloat162float(extra[r * H + h]) : 0.f;
    for (int i = 0; i < K; ++i) acc += coef[i] * __bfloat162float(W[row[i] + h]);
    dh[r * H + h] = __float2bfloat16_rn(__bfloat162float(dh[r * H + h]) + acc);
  }
}

}  // namespace

void lm_loss_sparse_backward(const Ctx& ctx, const Tensor& dh, const Tensor& ids, const Tensor& z, const Tensor& dz,
                             const Tensor& lm_head, const ops::LogitSpec& logit, const Tensor& extra) {
  DF_CHECK(extra.empty() || extra.dtype == DType::BF16, Internal, "lm_loss_sparse_backward (CUDA): extra BF16");
  DF_CHECK(dh.dtype == DType::BF16 && lm_head.dtype == DType::BF16 && ids.dtype == DType::I32 &&
               z.dtype == DType::F32 && dz.dtype == DType::F32,
           Internal, "lm_loss_sparse_backward (CUDA): dh/lm_head BF16, ids I32, z/dz F32");
  const int64_t R = dh.shape[0], H = dh.shape[1], K = ids.shape[1], V = lm_head.shape[0];
  DF_CHECK(K >= 1 && K <= 64, Internal, "lm_loss_sparse_backward (CUDA): K " << K);
  if (R == 0) return;
  sparse_backward_kernel<<<static_cast<unsigned>(R), 256, 0, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(dh.data), static_cast<const int32_t*>(ids.data), static_cast<const float*>(z.data),
      static_cast<const float*>(dz.data), static_cast<const __nv_bfloat16*>(lm_head.data),
      extra.empty() ? nullptr : static_cast<const __nv_bfloat16*>(extra.data), H, static_cast<int>(K), V,
      logit.multiplier, logit.softcap);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
