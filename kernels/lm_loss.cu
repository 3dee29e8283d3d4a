// Chunked lm_head loss on CUDA; see lm_loss.cuh. Shapes: R rows, H hidden, V vocabulary, C rows per chunk.
#include "lm_loss.cuh"

#include <cuda_bf16.h>

#include <algorithm>

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
};

// One CTA per chunk row c = blockIdx.x. x: drafter logits (fp32 row of V), t: teacher logits or null.
// With a gradient, each tile of kThreads elements is read, then (after a barrier) its bf16 gradient is
// written at element offsets of the same tile in a bf16 view of the row: bf16 element i occupies bytes
// [2i, 2i + 2), inside fp32 elements already read, so no unread logit is overwritten.
__global__ void __launch_bounds__(kThreads) loss_rows_kernel(RowArgs p, float* __restrict__ ws,
                                                             const float* __restrict__ ws_t) {
  __shared__ Stats red_q[kThreads / 32];
  __shared__ TeacherStats red_p[kThreads / 32];
  const int64_t c = blockIdx.x, r = p.r0 + c, V = p.V;
  float* x = ws + c * V;
  const float* t = ws_t ? ws_t + c * V : nullptr;
  Stats sq{-INFINITY, 0.f, 0};
  TeacherStats sp{-INFINITY, 0.f, 0.f, 0};
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float xi = x[i];
    stats_add(sq, xi, int(i));
    if (t) tstats_add(sp, t[i], xi, int(i));
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
  }
  if (!p.row_weight) return;
  __syncthreads();  // x[label] was read above before any gradient lands on the row
  const float w = p.row_weight[r];
  __nv_bfloat16* g = reinterpret_cast<__nv_bfloat16*>(x);
  for (int64_t i0 = 0; i0 < V; i0 += kThreads) {
    const int64_t i = i0 + threadIdx.x;
    float gi = 0.f;
    if (i < V) {
      const float qi = __expf(x[i] - lse_q);
      if (p.kl_grad)
        gi = w * (qi - __expf(t[i] - lse_p));
      else
        gi = w * (qi - (i == label ? 1.f : 0.f));
    }
    __syncthreads();
    if (i < V) g[i] = __float2bfloat16_rn(gi);
  }
}

void run(const Ctx& ctx, const ops::LmLossRowsOut* out, const Tensor& h, const Tensor& lm_head,
         const Tensor& labels, const Tensor& teacher, const Tensor& workspace, int64_t chunk_rows, const Tensor& dh,
         const Tensor& row_weight, ops::LossObjective objective, bool use_teacher) {
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
  for (int64_t r0 = 0; r0 < R; r0 += chunk_rows) {
    const int64_t C = std::min(R, r0 + chunk_rows) - r0;
    // logits^T [V, C] (column-major, ld V) = W [V, H] · h_c^T
    gemm_bf16(ctx, true, false, V, C, H, 1.f, {W, H, 0}, {hp + r0 * H, H, 0}, 0.f, ws, true, V, 0);
    if (use_teacher) gemm_bf16(ctx, true, false, V, C, H, 1.f, {W, H, 0}, {tp + r0 * H, H, 0}, 0.f, ws_t, true, V, 0);
    p.r0 = r0;
    loss_rows_kernel<<<unsigned(C), kThreads, 0, stream_of(ctx)>>>(p, ws, ws_t);
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
  DF_CHECK(logit.identity() && out.topk_ids.empty() && out.label_logit.empty(), Internal,
           "lm_loss_forward on CUDA: the logit transform and top-K outputs are not built yet");
  run(ctx, &out, h, lm_head, labels, teacher, workspace, chunk_rows, dh, row_weight, objective, !teacher.empty());
}

void lm_loss_backward(const Ctx& ctx, const Tensor& dh, const Tensor& row_weight, ops::LossObjective objective,
                      const Tensor& h, const Tensor& lm_head, const Tensor& labels, const Tensor& teacher,
                      const Tensor& workspace, int64_t chunk_rows, const ops::LogitSpec& logit,
                      const Tensor& extra_ids, const Tensor& extra_dz) {
  DF_CHECK(logit.identity() && extra_ids.empty() && extra_dz.empty(), Internal,
           "lm_loss_backward on CUDA: the logit transform and the sparse addend are not built yet");
  run(ctx, nullptr, h, lm_head, labels, teacher, workspace, chunk_rows, dh, row_weight, objective,
      objective == ops::LossObjective::KL);
}

}  // namespace dflash::cuda
