// DFlash2's candidate selector on CUDA (training side); see selector.cuh and docs/dflash2.md 2.4 and 3.
// Shapes: R rows, K candidates a row (K <= 64), rank r (r <= 1024), codebooks P, S [V, r] fp32.
//   candidates: one thread a row.
//   forward:    one CTA of 128 threads a row: a = P[pred] * u in shared memory (r floats), each warp takes
//               every 4th candidate (a warp-wide dot product with its S row), then warp 0 does the row's
//               logsumexp / CE / argmax over the K <= 64 scores (two a lane).
//   backward:   one CTA of 256 threads a row: warp 0 puts g = w (softmax - onehot) and the candidate ids in
//               shared memory; then each thread takes rank columns q: e_q = sum_i g_i S[cand_i, q],
//               du = P[pred] e, and fp32 atomicAdds into dP[pred] (u e) and dS[cand_i] (g_i P[pred] u).
//               Rows of zero weight skip the atomics (their terms are zero).
// A pred or candidate id outside [0, V) sets kBadTokenId in the backend's error flags (checked after the
// step's sync) and gives NaN scores for the row instead of reading out of bounds.
#include "selector.cuh"

#include <cmath>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

constexpr int kMaxK = 64;
constexpr int kMaxRank = 1024;
constexpr int kFwdThreads = 128;
constexpr int kBwdThreads = 256;

__global__ void candidates_kernel(int64_t R, int K, int32_t* __restrict__ cand, float* __restrict__ unary,
                                  int32_t* __restrict__ gold, uint8_t* __restrict__ covered,
                                  const int32_t* __restrict__ ids, const float* __restrict__ vals,
                                  const int32_t* __restrict__ labels, const float* __restrict__ label_logit,
                                  bool insert) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < R; r += int64_t(gridDim.x) * blockDim.x) {
    const int32_t y = labels[r];
    int slot = -1;
    for (int i = 0; i < K; ++i) {
      const int32_t id = ids[r * K + i];
      cand[r * K + i] = id;
      unary[r * K + i] = vals[r * K + i];
      if (slot < 0 && id == y) slot = i;
    }
    if (slot < 0 && insert) {
      cand[r * K + K - 1] = y;
      unary[r * K + K - 1] = label_logit[r];
    }
    gold[r] = slot >= 0 ? slot : insert ? K - 1 : -1;  // -1: no selector term (strict)
    covered[r] = slot < 0 ? 0 : 1;
  }
}

struct SelArgs {
  int64_t V;
  int K, rank;
  const float* u;         // [R, r]
  const float* unary;     // [R, K]
  const int32_t* cand;    // [R, K]
  const int32_t* pred;    // [R]
  const int32_t* gold;    // [R] or null
  const float* P;         // [V, r]
  const float* S;         // [V, r]
  int* error_flags;
};

// Warp-wide best (value, slot) of the row's K <= 64 scores held two a lane: the max, ties to the lower slot.
__device__ __forceinline__ void warp_argmax(float& v, int& idx) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) v = ov, idx = oi;
  }
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__global__ void __launch_bounds__(kFwdThreads) selector_fwd_kernel(SelArgs p, float* __restrict__ scores,
                                                                    float* __restrict__ ce, int32_t* __restrict__ argmax) {
  __shared__ float a[kMaxRank];
  __shared__ float sc[kMaxK];
  const int64_t row = blockIdx.x;
  const int r = p.rank, K = p.K;
  const int32_t pr = p.pred[row];
  const bool pred_ok = pr >= 0 && pr < p.V;
  if (!pred_ok && threadIdx.x == 0) atomicOr(p.error_flags, kBadTokenId);
  for (int q = threadIdx.x; q < r; q += kFwdThreads)
    a[q] = pred_ok ? p.P[int64_t(pr) * r + q] * p.u[row * r + q] : NAN;
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = warp; i < K; i += kFwdThreads / 32) {
    const int32_t id = p.cand[row * K + i];
    const bool ok = id >= 0 && id < p.V;
    float s = 0.f;
    if (ok) {
      const float* Srow = p.S + int64_t(id) * r;
      for (int q = lane; q < r; q += 32) s += a[q] * __ldg(Srow + q);
    }
    s = warp_sum(s);
    if (lane == 0) {
      if (!ok) atomicOr(p.error_flags, kBadTokenId);
      sc[i] = ok ? p.unary[row * K + i] + s : NAN;
    }
  }
  __syncthreads();
  if (warp != 0) return;
  const float v0 = lane < K ? sc[lane] : -INFINITY, v1 = lane + 32 < K ? sc[lane + 32] : -INFINITY;
  if (lane < K) scores[row * K + lane] = v0;
  if (lane + 32 < K) scores[row * K + lane + 32] = v1;
  float best = v0;
  int idx = lane;
  if (v1 > v0) best = v1, idx = lane + 32;
  warp_argmax(best, idx);
  if (lane == 0) argmax[row] = idx;
  if (!ce) return;
  const float m = warp_max(fmaxf(v0, v1));
  const float s = warp_sum((lane < K ? expf(v0 - m) : 0.f) + (lane + 32 < K ? expf(v1 - m) : 0.f));
  if (lane == 0) {
    const int32_t g = p.gold[row];
    ce[row] = g < 0 ? 0.f : g < K ? m + logf(s) - sc[g] : NAN;  // g = -1: no selector term (strict)
  }
}

__global__ void __launch_bounds__(kBwdThreads) selector_bwd_kernel(SelArgs p, float* __restrict__ d_unary,
                                                                    float* __restrict__ du, float* __restrict__ dP,
                                                                    float* __restrict__ dS,
                                                                    const float* __restrict__ scores,
                                                                    const float* __restrict__ row_weight) {
  __shared__ float gsh[kMaxK];
  __shared__ int32_t ids[kMaxK];
  __shared__ int all_ok;
  const int64_t row = blockIdx.x;
  const int r = p.rank, K = p.K;
  const float w = p.gold[row] < 0 ? 0.f : row_weight[row];  // gold -1: no selector term (strict candidates)
  const int32_t pr = p.pred[row];
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) {
    const int32_t gold = p.gold[row];
    const float v0 = lane < K ? scores[row * K + lane] : -INFINITY;
    const float v1 = lane + 32 < K ? scores[row * K + lane + 32] : -INFINITY;
    const float m = warp_max(fmaxf(v0, v1));
    const float e0 = lane < K ? expf(v0 - m) : 0.f, e1 = lane + 32 < K ? expf(v1 - m) : 0.f;
    const float inv = 1.f / warp_sum(e0 + e1);
    bool ok = pr >= 0 && pr < p.V;
    if (lane < K) {
      const float g = w * (e0 * inv - (lane == gold ? 1.f : 0.f));
      gsh[lane] = g;
      if (d_unary) d_unary[row * K + lane] = g;
      ids[lane] = p.cand[row * K + lane];
      ok = ok && ids[lane] >= 0 && ids[lane] < p.V;
    }
    if (lane + 32 < K) {
      const float g = w * (e1 * inv - (lane + 32 == gold ? 1.f : 0.f));
      gsh[lane + 32] = g;
      if (d_unary) d_unary[row * K + lane + 32] = g;
      ids[lane + 32] = p.cand[row * K + lane + 32];
      ok = ok && ids[lane + 32] >= 0 && ids[lane + 32] < p.V;
    }
    ok = __all_sync(0xffffffffu, ok);
    if (lane == 0) {
      all_ok = ok;
      if (!ok) atomicOr(p.error_flags, kBadTokenId);
    }
  }
  __syncthreads();
  if (!all_ok) {
    for (int q = threadIdx.x; q < r; q += kBwdThreads) du[row * r + q] = NAN;
    return;
  }
  const bool live = w != 0.f;  // a zero-weight row's g is zero: nothing to accumulate
  for (int q = threadIdx.x; q < r; q += kBwdThreads) {
    const float Pq = p.P[int64_t(pr) * r + q], uq = p.u[row * r + q], pu = Pq * uq;
    float e = 0.f;
    for (int i = 0; i < K; ++i) {
      const int64_t off = int64_t(ids[i]) * r + q;
      e += gsh[i] * __ldg(p.S + off);
      if (live) atomicAdd(dS + off, gsh[i] * pu);
    }
    du[row * r + q] = Pq * e;
    if (live) atomicAdd(dP + int64_t(pr) * r + q, uq * e);
  }
}

void check_f32(const char* op, const char* name, const Tensor& t, size_t numel) {
  DF_CHECK(t.dtype == DType::F32 && t.numel() == numel, Internal,
           op << ": " << name << " must be F32 of " << numel << " elements, is " << t.shape_str());
}
void check_i32(const char* op, const char* name, const Tensor& t, size_t numel) {
  DF_CHECK(t.dtype == DType::I32 && t.numel() == numel, Internal,
           op << ": " << name << " must be I32 of " << numel << " elements, is " << t.shape_str());
}

// R, K, r from cand [R, K] and u [R, r], the codebooks checked against them.
SelArgs sel_args(const Ctx& ctx, const char* op, const Tensor& u, const Tensor& unary, const Tensor& cand,
                 const Tensor& pred, const Tensor& gold, const Tensor& P, const Tensor& S) {
  DF_CHECK(cand.ndim == 2 && u.ndim == 2 && P.ndim == 2 && cand.shape[0] == u.shape[0], Internal,
           op << ": cand " << cand.shape_str() << ", u " << u.shape_str() << ", P " << P.shape_str());
  const int64_t R = cand.shape[0], K = cand.shape[1], r = u.shape[1], V = P.shape[0];
  DF_CHECK(K >= 1 && K <= kMaxK && r >= 1 && r <= kMaxRank, Internal,
           op << ": K " << K << " (1..64) and rank " << r << " (1..1024)");
  check_i32(op, "cand", cand, size_t(R * K));
  check_f32(op, "u", u, size_t(R * r));
  check_f32(op, "unary", unary, size_t(R * K));
  check_i32(op, "pred", pred, size_t(R));
  if (!gold.empty()) check_i32(op, "gold", gold, size_t(R));
  check_f32(op, "P", P, size_t(V * r));
  check_f32(op, "S", S, size_t(V * r));
  DF_CHECK(V < (int64_t(1) << 31), Internal, op << ": vocabulary of " << V);
  SelArgs a{};
  a.V = V;
  a.K = int(K);
  a.rank = int(r);
  a.u = static_cast<const float*>(u.data);
  a.unary = static_cast<const float*>(unary.data);
  a.cand = static_cast<const int32_t*>(cand.data);
  a.pred = static_cast<const int32_t*>(pred.data);
  a.gold = gold.empty() ? nullptr : static_cast<const int32_t*>(gold.data);
  a.P = static_cast<const float*>(P.data);
  a.S = static_cast<const float*>(S.data);
  a.error_flags = backend_of(ctx).error_flags_dev;
  return a;
}

}  // namespace

void selector_candidates(const Ctx& ctx, const Tensor& cand, const Tensor& unary, const Tensor& gold,
                         const Tensor& covered, const Tensor& topk_ids, const Tensor& topk_vals,
                         const Tensor& labels, const Tensor& label_logit, SelectorCandidates mode) {
  const char* op = "selector_candidates (CUDA)";
  backend_of(ctx);
  DF_CHECK(topk_ids.ndim == 2, Internal, op << ": topk_ids " << topk_ids.shape_str());
  const int64_t R = topk_ids.shape[0], K = topk_ids.shape[1];
  DF_CHECK(K >= 1, Internal, op << ": K " << K);
  check_i32(op, "topk_ids", topk_ids, size_t(R * K));
  check_i32(op, "cand", cand, size_t(R * K));
  check_f32(op, "topk_vals", topk_vals, size_t(R * K));
  check_f32(op, "unary", unary, size_t(R * K));
  check_i32(op, "labels", labels, size_t(R));
  check_i32(op, "gold", gold, size_t(R));
  check_f32(op, "label_logit", label_logit, size_t(R));
  DF_CHECK(covered.dtype == DType::U8 && covered.numel() == size_t(R), Internal,
           op << ": covered must be U8 [" << R << "], is " << covered.shape_str());
  if (R == 0) return;
  constexpr int kThreads = 128;
  candidates_kernel<<<grid_stride_blocks(ctx, R, kThreads, 8), kThreads, 0, stream_of(ctx)>>>(
      R, int(K), static_cast<int32_t*>(cand.data), static_cast<float*>(unary.data), static_cast<int32_t*>(gold.data),
      static_cast<uint8_t*>(covered.data), static_cast<const int32_t*>(topk_ids.data),
      static_cast<const float*>(topk_vals.data), static_cast<const int32_t*>(labels.data),
      static_cast<const float*>(label_logit.data), mode == SelectorCandidates::Insert);
  DF_CUDA_LAUNCH();
}

void selector_forward(const Ctx& ctx, const Tensor& scores, const Tensor& ce, const Tensor& argmax, const Tensor& u,
                      const Tensor& unary, const Tensor& cand, const Tensor& pred, const Tensor& gold,
                      const Tensor& P, const Tensor& S) {
  const char* op = "selector_forward (CUDA)";
  const SelArgs a = sel_args(ctx, op, u, unary, cand, pred, gold, P, S);
  const int64_t R = cand.shape[0];
  check_f32(op, "scores", scores, size_t(R * a.K));
  check_i32(op, "argmax", argmax, size_t(R));
  DF_CHECK(ce.empty() == gold.empty(), Internal, op << ": ce and gold go together");
  if (!ce.empty()) check_f32(op, "ce", ce, size_t(R));
  if (R == 0) return;
  DF_CHECK(R <= 0x7fffffff, Internal, op << ": " << R << " rows");
  selector_fwd_kernel<<<unsigned(R), kFwdThreads, 0, stream_of(ctx)>>>(
      a, static_cast<float*>(scores.data), ce.empty() ? nullptr : static_cast<float*>(ce.data),
      static_cast<int32_t*>(argmax.data));
  DF_CUDA_LAUNCH();
}

void selector_backward(const Ctx& ctx, const Tensor& d_unary, const Tensor& du, const Tensor& dP, const Tensor& dS,
                       const Tensor& scores, const Tensor& row_weight, const Tensor& u, const Tensor& cand,
                       const Tensor& pred, const Tensor& gold, const Tensor& P, const Tensor& S) {
  const char* op = "selector_backward (CUDA)";
  // unary is not read by the backward: scores stands in for its shape check.
  const SelArgs a = sel_args(ctx, op, u, scores, cand, pred, gold, P, S);
  DF_CHECK(!gold.empty(), Internal, op << ": gold is required");
  const int64_t R = cand.shape[0];
  if (!d_unary.empty()) check_f32(op, "d_unary", d_unary, size_t(R * a.K));
  check_f32(op, "du", du, size_t(R * a.rank));
  check_f32(op, "row_weight", row_weight, size_t(R));
  check_f32(op, "dP", dP, P.numel());
  check_f32(op, "dS", dS, S.numel());
  if (R == 0) return;
  DF_CHECK(R <= 0x7fffffff, Internal, op << ": " << R << " rows");
  selector_bwd_kernel<<<unsigned(R), kBwdThreads, 0, stream_of(ctx)>>>(
      a, d_unary.empty() ? nullptr : static_cast<float*>(d_unary.data), static_cast<float*>(du.data),
      static_cast<float*>(dP.data), static_cast<float*>(dS.data), static_cast<const float*>(scores.data),
      static_cast<const float*>(row_weight.data));
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
