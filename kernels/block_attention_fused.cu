// Block-prefix attention (DFlash training) on CUDA, fused flash-style kernels; see block_attention.cuh.
//
// One CTA holds the query rows of one (block n, kv head g): the G query heads sharing kv head g times the
// block's B rows (row i: head-in-group r = i / B, block offset o = i % B), padded to kRows = 64 with zero
// rows that are never written. Warp w owns rows [16w, 16w + 16). Keys stream through shared memory in
// tiles of kKeys = 64: the context tiles of the block's visible range, then one tile of the block's own B
// keys. Scores and probabilities live only in shared memory (per warp, so no CTA barrier around the
// softmax); bf16 tensor-core products through WMMA 16x16x16 with fp32 accumulation.
//
// Forward: two passes over the keys (pass 1: log-sum-exp per row; pass 2: P = exp(S - lse) is final, so
// the output accumulates in registers with no rescaling).
// Backward (FlashAttention-2 style, scores recomputed):
//   dq kernel, per (block, kv head): D = rowsum(dO o O) (saved), dq = scale · sum_tiles dS K, and for the
//     block's own keys (seen by this CTA's rows only) dk_blk = scale · dS^T Q, dv_blk = P^T dO, complete.
//   dkv kernel, per (context key tile, kv head, split of kSplitBlocks blocks): loops over the blocks that
//     see the tile, dk += dS^T Q, dv += P^T dO in registers, then fp32 atomics into a [T, nkv·hd] buffer
//     (splits keep the CTAs of the early, widely seen tiles short); converted to bf16 at the end.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <type_traits>

#include "backend.cuh"
#include "block_attention.cuh"
#include "cuda_check.cuh"
#include "drafter_blas.cuh"

namespace dflash::cuda {
namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int kRows = 64;     // query rows per CTA (G·B padded)
constexpr int kKeys = 64;     // keys per tile
constexpr int kThreads = 128;  // 4 warps
constexpr int kSplitBlocks = 64;  // blocks per dkv CTA
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct FusedArgs {
  const bf16 *q, *kc, *vc, *kb, *vb, *out, *dout;
  bf16 *o, *dq, *dkb, *dvb;
  float* lse;         // [N·B, nh] natural log
  float* D;           // [N·B, nh] rowsum(dO o O)
  float *dk32, *dv32;  // [T, nkv·hd]
  const int32_t *anchors, *seq_begin;
  int N, B, nh, nkv, G, M, window, T;
  int64_t QD, KVD;
  float scale, scale_log2;  // scale, scale·log2(e)
};

template <int HD> struct Layout {
  static constexpr int LDQ = HD + 8;     // bf16 row stride of [64][HD] tiles (16-byte pad against bank conflicts)
  static constexpr int LDS = kKeys + 4;  // fp32 score rows
  static constexpr int LDP = kKeys + 8;  // bf16 probability rows
  static constexpr size_t kTile = size_t(kRows) * LDQ * sizeof(bf16);
  static constexpr size_t kScores = size_t(kRows) * LDS * sizeof(float);
  static constexpr size_t kProbs = size_t(kRows) * LDP * sizeof(bf16);
};
static_assert(kRows == kKeys, "query and key tiles share one layout");

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAt = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;

// Context keys the block's widest row sees: [lo, a).
__device__ __forceinline__ int block_ctx_lo(const FusedArgs& p, int a, int s0) {
  int lo = s0;
  if (p.window > 0) lo = max(s0, a - (p.window - 1));
  return min(lo, a);
}

// Element offset of query row i of (block n, kv head g) in q/out/dout/dq ([N·B, nh, hd]).
__device__ __forceinline__ int64_t q_offset(const FusedArgs& p, int n, int g, int i, int hd) {
  const int r = i / p.B, o = i % p.B;
  return (int64_t(n) * p.B + o) * p.QD + int64_t(g * p.G + r) * hd;
}
__device__ __forceinline__ int64_t stat_index(const FusedArgs& p, int n, int g, int i) {
  const int r = i / p.B, o = i % p.B;
  return (int64_t(n) * p.B + o) * p.nh + g * p.G + r;
}

// 64 rows of HD bf16 into shared memory; row_ptr(i) == nullptr gives a zero row.
template <int HD, class RowPtr> __device__ __forceinline__ void load_rows(bf16* dst, RowPtr row_ptr) {
  constexpr int V = HD / 8;  // 16-byte vectors per row
  for (int idx = threadIdx.x; idx < kRows * V; idx += kThreads) {
    const int i = idx / V, v = idx % V;
    const bf16* src = row_ptr(i);
    uint4 x = make_uint4(0, 0, 0, 0);
    if (src != nullptr) x = reinterpret_cast<const uint4*>(src)[v];
    *reinterpret_cast<uint4*>(dst + i * Layout<HD>::LDQ + v * 8) = x;
  }
}

// Key tile t of block n (context tiles first, then the block's own keys): K (and V if Vs) into shared memory.
template <int HD> __device__ __forceinline__ void load_key_tile(const FusedArgs& p, int n, int g, bool is_blk, int j0,
                                                               int j1, bf16* Ks, bf16* Vs) {
  if (is_blk) {
    auto kp = [&](int i) -> const bf16* { return i < p.B ? p.kb + (int64_t(n) * p.B + i) * p.KVD + g * HD : nullptr; };
    auto vp = [&](int i) -> const bf16* { return i < p.B ? p.vb + (int64_t(n) * p.B + i) * p.KVD + g * HD : nullptr; };
    load_rows<HD>(Ks, kp);
    if (Vs) load_rows<HD>(Vs, vp);
  } else {
    auto kp = [&](int i) -> const bf16* { return j0 + i < j1 ? p.kc + int64_t(j0 + i) * p.KVD + g * HD : nullptr; };
    auto vp = [&](int i) -> const bf16* { return j0 + i < j1 ? p.vc + int64_t(j0 + i) * p.KVD + g * HD : nullptr; };
    load_rows<HD>(Ks, kp);
    if (Vs) load_rows<HD>(Vs, vp);
  }
}

// Warp w: S[16w.., 0..64) = A[16w.., :] · K^T (raw dot products, fp32, into Ss).
template <int HD> __device__ __forceinline__ void warp_scores(float* Ss, const bf16* As, const bf16* Ks, int w) {
  using L = Layout<HD>;
  Acc acc[kKeys / 16];
#pragma unroll
  for (int c = 0; c < kKeys / 16; ++c) wmma::fill_fragment(acc[c], 0.f);
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) {
    FragA a;
    wmma::load_matrix_sync(a, As + 16 * w * L::LDQ + 16 * k, L::LDQ);
#pragma unroll
    for (int c = 0; c < kKeys / 16; ++c) {
      FragBt b;
      wmma::load_matrix_sync(b, Ks + 16 * c * L::LDQ + 16 * k, L::LDQ);
      wmma::mma_sync(acc[c], a, b, acc[c]);
    }
  }
#pragma unroll
  for (int c = 0; c < kKeys / 16; ++c)
    wmma::store_matrix_sync(Ss + 16 * w * L::LDS + 16 * c, acc[c], L::LDS, wmma::mem_row_major);
}

// Warp w: acc[c] += X[16w.., 0..64) · Y[0..64, 16c..)   (X bf16 [64][LDP], Y bf16 [64][LDQ])
template <int HD> __device__ __forceinline__ void warp_rows_mma(Acc (&acc)[HD / 16], const bf16* Xs, const bf16* Ys,
                                                               int w) {
  using L = Layout<HD>;
#pragma unroll
  for (int k = 0; k < kKeys / 16; ++k) {
    FragA a;
    wmma::load_matrix_sync(a, Xs + 16 * w * L::LDP + 16 * k, L::LDP);
#pragma unroll
    for (int c = 0; c < HD / 16; ++c) {
      FragB b;
      wmma::load_matrix_sync(b, Ys + 16 * k * L::LDQ + 16 * c, L::LDQ);
      wmma::mma_sync(acc[c], a, b, acc[c]);
    }
  }
}

// Key rows kt: acc[c] += X[0..64, 16kt..)^T · Y[0..64, 16c..)   (X bf16 [64 rows][LDP keys], Y [64 rows][LDQ])
template <int HD> __device__ __forceinline__ void keys_mma(Acc (&acc)[HD / 16], const bf16* Xs, const bf16* Ys, int kt) {
  using L = Layout<HD>;
#pragma unroll
  for (int k = 0; k < kRows / 16; ++k) {
    FragAt a;
    wmma::load_matrix_sync(a, Xs + 16 * k * L::LDP + 16 * kt, L::LDP);
#pragma unroll
    for (int c = 0; c < HD / 16; ++c) {
      FragB b;
      wmma::load_matrix_sync(b, Ys + 16 * k * L::LDQ + 16 * c, L::LDQ);
      wmma::mma_sync(acc[c], a, b, acc[c]);
    }
  }
}

// Warp-owned staging of one 16x16 accumulator through stage (fp32, [16][LDS]); lane l handles row l / 2,
// columns (l % 2)·8 .. +8, and gets them in v[8] (multiplied by mul).
__device__ __forceinline__ void stage_fragment(const Acc& acc, float* stage, int ld, float mul, float (&v)[8]) {
  const int lane = threadIdx.x & 31;
  wmma::store_matrix_sync(stage, acc, ld, wmma::mem_row_major);
  __syncwarp();
  const float* src = stage + (lane >> 1) * ld + (lane & 1) * 8;
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = src[e] * mul;
  __syncwarp();
}
__device__ __forceinline__ void store_bf16x8(bf16* dst, const float (&v)[8]) {
  uint4 u;
  __nv_bfloat162 h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) h[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
  u.x = *reinterpret_cast<unsigned*>(&h[0]);
  u.y = *reinterpret_cast<unsigned*>(&h[1]);
  u.z = *reinterpret_cast<unsigned*>(&h[2]);
  u.w = *reinterpret_cast<unsigned*>(&h[3]);
  *reinterpret_cast<uint4*>(dst) = u;
}

// What one lane's query row sees (lane l of warp w: row i = 16w + l / 2; the lane pair splits the tile's
// columns: c = 2t + l % 2).
struct RowView {
  int i;
  bool ok;      // a real row (i < M)
  int ctx_lo;   // visible context keys [ctx_lo, a)
  int blk_hi;   // visible block keys [0, blk_hi)
  int a;
};
__device__ __forceinline__ RowView row_view(const FusedArgs& p, int w, int lane, int a, int s0) {
  RowView v;
  v.i = 16 * w + (lane >> 1);
  v.ok = v.i < p.M;
  const int o = v.ok ? v.i % p.B : 0;
  v.ctx_lo = p.window > 0 ? max(s0, a + o - (p.window - 1)) : s0;
  v.blk_hi = p.window > 0 ? o + 1 : p.B;
  v.a = a;
  if (!v.ok) {  // nothing visible
    v.ctx_lo = a;
    v.blk_hi = 0;
  }
  return v;
}
__device__ __forceinline__ bool visible(const RowView& v, bool is_blk, int j0, int c) {
  if (is_blk) return c < v.blk_hi;
  const int j = j0 + c;
  return j >= v.ctx_lo && j < v.a;
}

// P = exp(S·scale - lse) for the lane's row into Ps (bf16, 0 where hidden).
template <int HD> __device__ __forceinline__ void write_probs(const FusedArgs& p, const float* Ss, bf16* Ps,
                                                             const RowView& v, bool is_blk, int j0, float lse2) {
  using L = Layout<HD>;
  const int half = threadIdx.x & 1;
  const float* srow = Ss + v.i * L::LDS;
  bf16* prow = Ps + v.i * L::LDP;
#pragma unroll 8
  for (int t = 0; t < kKeys / 2; ++t) {
    const int c = 2 * t + half;
    prow[c] = __float2bfloat16_rn(visible(v, is_blk, j0, c) ? exp2f(srow[c] * p.scale_log2 - lse2) : 0.f);
  }
}
// dS = P (dP - D) for the lane's row: dP in Ss, P in Ps, into dSs (bf16).
template <int HD> __device__ __forceinline__ void write_dscores(const float* Ss, const bf16* Ps, bf16* dSs,
                                                               const RowView& v, float D) {
  using L = Layout<HD>;
  const int half = threadIdx.x & 1;
  const float* srow = Ss + v.i * L::LDS;
  const bf16* prow = Ps + v.i * L::LDP;
  bf16* drow = dSs + v.i * L::LDP;
#pragma unroll 8
  for (int t = 0; t < kKeys / 2; ++t) {
    const int c = 2 * t + half;
    drow[c] = __float2bfloat16_rn(__bfloat162float(prow[c]) * (srow[c] - D));
  }
}

// ---- forward ---------------------------------------------------------------------------------------------
template <int HD> __global__ void __launch_bounds__(kThreads) fused_forward_kernel(FusedArgs p) {
  using L = Layout<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = reinterpret_cast<bf16*>(smem + L::kTile);
  bf16* Vs = reinterpret_cast<bf16*>(smem + 2 * L::kTile);
  float* Ss = reinterpret_cast<float*>(smem + 3 * L::kTile);
  bf16* Ps = reinterpret_cast<bf16*>(smem + 3 * L::kTile + L::kScores);
  const int n = blockIdx.x, g = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int a = p.anchors[n], s0 = p.seq_begin[n];
  const int lo = block_ctx_lo(p, a, s0);
  const int ntiles = (a - lo + kKeys - 1) / kKeys + 1;  // context tiles + the block's own keys
  load_rows<HD>(Qs, [&](int i) -> const bf16* { return i < p.M ? p.q + q_offset(p, n, g, i, HD) : nullptr; });
  const RowView v = row_view(p, w, lane, a, s0);
  const int half = lane & 1;

  // pass 1: per-row max and sum of exp2(S·scale·log2e - max)
  float m = -INFINITY, s = 0.f;
  for (int t = 0; t < ntiles; ++t) {
    const bool is_blk = t == ntiles - 1;
    const int j0 = lo + t * kKeys;
    __syncthreads();  // Ks of the previous tile no longer read (and Qs written, first time)
    load_key_tile<HD>(p, n, g, is_blk, j0, a, Ks, nullptr);
    __syncthreads();
    warp_scores<HD>(Ss, Qs, Ks, w);
    __syncwarp();
    const float* srow = Ss + v.i * L::LDS;
    float tm = -INFINITY;
#pragma unroll 8
    for (int k = 0; k < kKeys / 2; ++k) {
      const int c = 2 * k + half;
      if (visible(v, is_blk, j0, c)) tm = fmaxf(tm, srow[c] * p.scale_log2);
    }
    if (tm > -INFINITY) {
      const float mn = fmaxf(m, tm);
      s *= exp2f(m - mn);
#pragma unroll 8
      for (int k = 0; k < kKeys / 2; ++k) {
        const int c = 2 * k + half;
        if (visible(v, is_blk, j0, c)) s += exp2f(srow[c] * p.scale_log2 - mn);
      }
      m = mn;
    }
  }
  {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, 1), s2 = __shfl_xor_sync(0xffffffffu, s, 1);
    const float mn = fmaxf(m, m2);
    if (mn > -INFINITY) {
      s = s * exp2f(m - mn) + s2 * exp2f(m2 - mn);
      m = mn;
    } else {
      m = 0.f;
      s = 1.f;
    }
  }
  const float lse2 = m + log2f(s);

  // pass 2: O = sum_tiles P V with the final P
  Acc acc[HD / 16];
#pragma unroll
  for (int c = 0; c < HD / 16; ++c) wmma::fill_fragment(acc[c], 0.f);
  for (int t = 0; t < ntiles; ++t) {
    const bool is_blk = t == ntiles - 1;
    const int j0 = lo + t * kKeys;
    __syncthreads();
    load_key_tile<HD>(p, n, g, is_blk, j0, a, Ks, Vs);
    __syncthreads();
    warp_scores<HD>(Ss, Qs, Ks, w);
    __syncwarp();
    write_probs<HD>(p, Ss, Ps, v, is_blk, j0, lse2);
    __syncwarp();
    warp_rows_mma<HD>(acc, Ps, Vs, w);
  }
  __syncwarp();
  float* stage = Ss + 16 * w * L::LDS;  // this warp's score rows, free now
  const int ri = 16 * w + (lane >> 1);
#pragma unroll
  for (int c = 0; c < HD / 16; ++c) {
    float val[8];
    stage_fragment(acc[c], stage, L::LDS, 1.f, val);
    if (ri < p.M) store_bf16x8(p.o + q_offset(p, n, g, ri, HD) + 16 * c + half * 8, val);
  }
  if (v.ok && half == 0) p.lse[stat_index(p, n, g, v.i)] = lse2 * kLn2;
}

// ---- backward: dq, D, and the block's own keys ------------------------------------------------------------
template <int HD> __global__ void __launch_bounds__(kThreads) fused_dq_kernel(FusedArgs p) {
  using L = Layout<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* dOs = reinterpret_cast<bf16*>(smem + L::kTile);
  bf16* Ks = reinterpret_cast<bf16*>(smem + 2 * L::kTile);
  bf16* Vs = reinterpret_cast<bf16*>(smem + 3 * L::kTile);
  float* Ss = reinterpret_cast<float*>(smem + 4 * L::kTile);
  bf16* Ps = reinterpret_cast<bf16*>(smem + 4 * L::kTile + L::kScores);
  bf16* dSs = reinterpret_cast<bf16*>(smem + 4 * L::kTile + L::kScores + L::kProbs);
  const int n = blockIdx.x, g = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31, half = lane & 1;
  const int a = p.anchors[n], s0 = p.seq_begin[n];
  const int lo = block_ctx_lo(p, a, s0);
  const int ntiles = (a - lo + kKeys - 1) / kKeys + 1;
  load_rows<HD>(Qs, [&](int i) -> const bf16* { return i < p.M ? p.q + q_offset(p, n, g, i, HD) : nullptr; });
  load_rows<HD>(dOs, [&](int i) -> const bf16* { return i < p.M ? p.dout + q_offset(p, n, g, i, HD) : nullptr; });
  const RowView v = row_view(p, w, lane, a, s0);
  // D = rowsum(dO o O) for the lane's row (the lane pair splits hd), lse in base 2
  float D = 0.f, lse2 = 0.f;
  if (v.ok) {
    const bf16* orow = p.out + q_offset(p, n, g, v.i, HD);
    const bf16* drow = p.dout + q_offset(p, n, g, v.i, HD);
    for (int e = half; e < HD; e += 2) D += __bfloat162float(orow[e]) * __bfloat162float(drow[e]);
    lse2 = p.lse[stat_index(p, n, g, v.i)] * kLog2e;
  }
  D += __shfl_xor_sync(0xffffffffu, D, 1);
  if (v.ok && half == 0) p.D[stat_index(p, n, g, v.i)] = D;

  Acc acc[HD / 16];
#pragma unroll
  for (int c = 0; c < HD / 16; ++c) wmma::fill_fragment(acc[c], 0.f);
  for (int t = 0; t < ntiles; ++t) {
    const bool is_blk = t == ntiles - 1;
    const int j0 = lo + t * kKeys;
    __syncthreads();
    load_key_tile<HD>(p, n, g, is_blk, j0, a, Ks, Vs);
    __syncthreads();
    warp_scores<HD>(Ss, Qs, Ks, w);
    __syncwarp();
    write_probs<HD>(p, Ss, Ps, v, is_blk, j0, lse2);
    __syncwarp();
    warp_scores<HD>(Ss, dOs, Vs, w);  // dP = dO V^T
    __syncwarp();
    write_dscores<HD>(Ss, Ps, dSs, v, D);
    __syncwarp();
    warp_rows_mma<HD>(acc, dSs, Ks, w);  // dq += dS K
  }
  // The block's own keys: every row that sees them is in this CTA, so dk_blk / dv_blk are complete here.
  __syncthreads();  // all rows' P and dS of the block tile written
  float* stage = Ss + 16 * w * L::LDS;
  const int ri = 16 * w + (lane >> 1);
  const int key_tiles = (p.B + 15) / 16;
  for (int f = w; f < key_tiles * (HD / 16); f += kThreads / 32) {
    const int kt = f / (HD / 16), c = f % (HD / 16);
    Acc dk, dv;
    wmma::fill_fragment(dk, 0.f);
    wmma::fill_fragment(dv, 0.f);
#pragma unroll
    for (int k = 0; k < kRows / 16; ++k) {
      FragAt x;
      FragB y;
      wmma::load_matrix_sync(y, Qs + 16 * k * L::LDQ + 16 * c, L::LDQ);
      wmma::load_matrix_sync(x, dSs + 16 * k * L::LDP + 16 * kt, L::LDP);
      wmma::mma_sync(dk, x, y, dk);
      wmma::load_matrix_sync(y, dOs + 16 * k * L::LDQ + 16 * c, L::LDQ);
      wmma::load_matrix_sync(x, Ps + 16 * k * L::LDP + 16 * kt, L::LDP);
      wmma::mma_sync(dv, x, y, dv);
    }
    const int b = 16 * kt + (lane >> 1);
    const int64_t off = (int64_t(n) * p.B + b) * p.KVD + g * HD + 16 * c + half * 8;
    float val[8];
    stage_fragment(dk, stage, L::LDS, p.scale, val);
    if (b < p.B) store_bf16x8(p.dkb + off, val);
    stage_fragment(dv, stage, L::LDS, 1.f, val);
    if (b < p.B) store_bf16x8(p.dvb + off, val);
  }
#pragma unroll
  for (int c = 0; c < HD / 16; ++c) {
    float val[8];
    stage_fragment(acc[c], stage, L::LDS, p.scale, val);
    if (ri < p.M) store_bf16x8(p.dq + q_offset(p, n, g, ri, HD) + 16 * c + half * 8, val);
  }
}

// ---- backward: context keys ---------------------------------------------------------------------------------
template <int HD> __global__ void __launch_bounds__(kThreads) fused_dkv_kernel(FusedArgs p) {
  using L = Layout<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = reinterpret_cast<bf16*>(smem + L::kTile);
  bf16* Qs = reinterpret_cast<bf16*>(smem + 2 * L::kTile);
  bf16* dOs = reinterpret_cast<bf16*>(smem + 3 * L::kTile);
  float* Ss = reinterpret_cast<float*>(smem + 4 * L::kTile);
  bf16* Ps = reinterpret_cast<bf16*>(smem + 4 * L::kTile + L::kScores);
  bf16* dSs = reinterpret_cast<bf16*>(smem + 4 * L::kTile + L::kScores + L::kProbs);
  const int j0 = blockIdx.x * kKeys, j1 = min(j0 + kKeys, p.T), g = blockIdx.y;
  const int n_begin = blockIdx.z * kSplitBlocks, n_end = min(p.N, n_begin + kSplitBlocks);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  Acc dk[HD / 16], dv[HD / 16];
#pragma unroll
  for (int c = 0; c < HD / 16; ++c) {
    wmma::fill_fragment(dk[c], 0.f);
    wmma::fill_fragment(dv[c], 0.f);
  }
  bool loaded = false;
  for (int n = n_begin; n < n_end; ++n) {
    const int a = p.anchors[n], s0 = p.seq_begin[n];
    if (a <= j0 || block_ctx_lo(p, a, s0) >= j1) continue;  // the block sees none of the tile (CTA-uniform)
    __syncthreads();  // previous block's tiles no longer read
    if (!loaded) {
      load_key_tile<HD>(p, n, g, false, j0, j1, Ks, Vs);
      loaded = true;
    }
    load_rows<HD>(Qs, [&](int i) -> const bf16* { return i < p.M ? p.q + q_offset(p, n, g, i, HD) : nullptr; });
    load_rows<HD>(dOs, [&](int i) -> const bf16* { return i < p.M ? p.dout + q_offset(p, n, g, i, HD) : nullptr; });
    const RowView v = row_view(p, w, lane, a, s0);
    const float lse2 = v.ok ? p.lse[stat_index(p, n, g, v.i)] * kLog2e : 0.f;
    const float D = v.ok ? p.D[stat_index(p, n, g, v.i)] : 0.f;
    __syncthreads();
    warp_scores<HD>(Ss, Qs, Ks, w);
    __syncwarp();
    write_probs<HD>(p, Ss, Ps, v, false, j0, lse2);
    __syncwarp();
    warp_scores<HD>(Ss, dOs, Vs, w);
    __syncwarp();
    write_dscores<HD>(Ss, Ps, dSs, v, D);
    __syncthreads();  // every row's P and dS written
    keys_mma<HD>(dv, Ps, dOs, w);   // dv += P^T dO    (this warp's 16 keys)
    keys_mma<HD>(dk, dSs, Qs, w);   // dk += dS^T Q
  }
  if (!loaded) return;
  __syncthreads();  // Ss free
  float* stage = Ss + 16 * w * L::LDS;
  const int j = j0 + 16 * w + (lane >> 1);
  const int half = lane & 1;
#pragma unroll
  for (int c = 0; c < HD / 16; ++c) {
    const int64_t off = int64_t(j) * p.KVD + g * HD + 16 * c + half * 8;
    float val[8];
    stage_fragment(dk[c], stage, L::LDS, p.scale, val);
    if (j < j1)
      for (int e = 0; e < 8; ++e) atomicAdd(p.dk32 + off + e, val[e]);
    stage_fragment(dv[c], stage, L::LDS, 1.f, val);
    if (j < j1)
      for (int e = 0; e < 8; ++e) atomicAdd(p.dv32 + off + e, val[e]);
  }
}

__global__ void f32_to_bf16_kernel(bf16* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __float2bfloat16_rn(src[i]);
}

bool aligned16(const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data) & 15u) == 0; }

FusedArgs make_args(const Tensor& q, const Tensor& k_ctx, const Tensor& anchors, const Tensor& seq_begin,
                    const ops::BlockAttnSpec& spec) {
  FusedArgs p{};
  p.N = static_cast<int>(anchors.shape[0]);
  p.B = spec.block_size;
  p.nh = static_cast<int>(q.shape[1]);
  p.nkv = static_cast<int>(k_ctx.shape[1]);
  p.G = p.nh / p.nkv;
  p.M = p.G * p.B;
  p.window = spec.window;
  p.T = static_cast<int>(k_ctx.shape[0]);
  p.QD = int64_t(p.nh) * q.shape[2];
  p.KVD = int64_t(p.nkv) * q.shape[2];
  p.scale = spec.scale;
  p.scale_log2 = spec.scale * kLog2e;
  p.anchors = static_cast<const int32_t*>(anchors.data);
  p.seq_begin = static_cast<const int32_t*>(seq_begin.data);
  return p;
}

template <int HD> void launch_forward(const Ctx& ctx, const FusedArgs& p) {
  using L = Layout<HD>;
  const size_t smem = 3 * L::kTile + L::kScores + L::kProbs;
  DF_CUDA(cudaFuncSetAttribute(fused_forward_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  fused_forward_kernel<HD><<<dim3(unsigned(p.N), unsigned(p.nkv)), kThreads, smem, stream_of(ctx)>>>(p);
  DF_CUDA_LAUNCH();
}
template <int HD> void launch_backward(const Ctx& ctx, const FusedArgs& p) {
  using L = Layout<HD>;
  const size_t smem = 4 * L::kTile + L::kScores + 2 * L::kProbs;
  DF_CUDA(cudaFuncSetAttribute(fused_dq_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  DF_CUDA(cudaFuncSetAttribute(fused_dkv_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  fused_dq_kernel<HD><<<dim3(unsigned(p.N), unsigned(p.nkv)), kThreads, smem, stream_of(ctx)>>>(p);
  DF_CUDA_LAUNCH();
  const unsigned key_tiles = unsigned((p.T + kKeys - 1) / kKeys), splits = unsigned((p.N + kSplitBlocks - 1) / kSplitBlocks);
  if (key_tiles > 0) {
    fused_dkv_kernel<HD><<<dim3(key_tiles, unsigned(p.nkv), splits), kThreads, smem, stream_of(ctx)>>>(p);
    DF_CUDA_LAUNCH();
  }
}

template <class F> void dispatch_hd(int64_t hd, F&& f) {
  switch (hd) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default: DF_CHECK(false, Internal, "block attention (fused): head dim " << hd << " not supported");
  }
}

}  // namespace

bool block_attention_fused_supported(int64_t nh, int64_t nkv, int64_t hd, int64_t block_size) {
  return (hd == 16 || hd == 32 || hd == 64 || hd == 128) && nkv > 0 && nh % nkv == 0 &&
         (nh / nkv) * block_size <= kRows && block_size >= 1;
}

bool block_attention_fused_usable(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (!aligned16(*t)) return false;
  return true;
}

void block_attention_fused_forward(const Ctx& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                                   const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk,
                                   const Tensor& anchors, const Tensor& seq_begin, const ops::BlockAttnSpec& spec) {
  FusedArgs p = make_args(q, k_ctx, anchors, seq_begin, spec);
  if (p.N == 0) return;
  p.q = static_cast<const bf16*>(q.data);
  p.kc = static_cast<const bf16*>(k_ctx.data);
  p.vc = static_cast<const bf16*>(v_ctx.data);
  p.kb = static_cast<const bf16*>(k_blk.data);
  p.vb = static_cast<const bf16*>(v_blk.data);
  p.o = static_cast<bf16*>(out.data);
  p.lse = static_cast<float*>(lse.data);
  dispatch_hd(q.shape[2], [&](auto hd) { launch_forward<decltype(hd)::value>(ctx, p); });
}

void block_attention_fused_backward(const Ctx& ctx, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                                    const Tensor& dk_blk, const Tensor& dv_blk, const Tensor& dout, const Tensor& out,
                                    const Tensor& lse, const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx,
                                    const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors,
                                    const Tensor& seq_begin, const ops::BlockAttnSpec& spec) {
  FusedArgs p = make_args(q, k_ctx, anchors, seq_begin, spec);
  cudaStream_t st = stream_of(ctx);
  const int64_t kv_elems = int64_t(p.T) * p.KVD;
  float* dkv32 = static_cast<float*>(scratch(ctx, ScratchSlot::AttnDkv32, sizeof(float) * 2 * std::max<int64_t>(1, kv_elems)));
  p.dk32 = dkv32;
  p.dv32 = dkv32 + kv_elems;
  DF_CUDA(cudaMemsetAsync(dkv32, 0, sizeof(float) * 2 * kv_elems, st));
  if (p.N > 0) {
    p.D = static_cast<float*>(scratch(ctx, ScratchSlot::AttnRowStats, sizeof(float) * size_t(p.N) * p.B * p.nh));
    p.q = static_cast<const bf16*>(q.data);
    p.kc = static_cast<const bf16*>(k_ctx.data);
    p.vc = static_cast<const bf16*>(v_ctx.data);
    p.kb = static_cast<const bf16*>(k_blk.data);
    p.vb = static_cast<const bf16*>(v_blk.data);
    p.out = static_cast<const bf16*>(out.data);
    p.dout = static_cast<const bf16*>(dout.data);
    p.lse = static_cast<float*>(lse.data);
    p.dq = static_cast<bf16*>(dq.data);
    p.dkb = static_cast<bf16*>(dk_blk.data);
    p.dvb = static_cast<bf16*>(dv_blk.data);
    dispatch_hd(q.shape[2], [&](auto hd) { launch_backward<decltype(hd)::value>(ctx, p); });
  }
  if (kv_elems > 0) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((kv_elems + 255) / 256, 132 * 16));
    f32_to_bf16_kernel<<<blocks, 256, 0, st>>>(static_cast<bf16*>(dk_ctx.data), p.dk32, kv_elems);
    DF_CUDA_LAUNCH();
    f32_to_bf16_kernel<<<blocks, 256, 0, st>>>(static_cast<bf16*>(dv_ctx.data), p.dv32, kv_elems);
    DF_CUDA_LAUNCH();
  }
}

}  // namespace dflash::cuda
