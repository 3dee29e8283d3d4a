// Block-prefix attention (DFlash training) on CUDA; see block_attention.cuh for the scheme.
//
// Shapes: N blocks of B rows, chunk of Rc = (n1 - n0)·B rows over Tk context keys starting at k0;
// nh query heads, nkv key/value heads, G = nh / nkv, hd head dim, QD = nh·hd, KVD = nkv·hd.
// Per-chunk buffers: S [nh][Rc][Tk] fp32 scores, P [nh][Rc][Tk] bf16 probabilities (then dS in backward).
#include "block_attention.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"
#include "device_limits.cuh"
#include "drafter_blas.cuh"

namespace dflash::cuda {
namespace {

constexpr int kRowThreads = 128;                  // one CTA per (row, head) of the score matrix
int64_t g_score_budget = int64_t(192) << 20;  // score elements per chunk (768 MiB fp32 + 384 MiB bf16)
BlockAttentionImpl g_impl = BlockAttentionImpl::Default;

// Default: the fused kernels (8b CE step on the H200: 158.0 ms fused vs 186.9 ms chunked, bench/README-drafter.md);
// DFLASH_BLOCK_ATTENTION=chunked (or fused) overrides the default for benchmarks.
bool use_fused() {
  static const bool env_chunked = [] {
    const char* e = std::getenv("DFLASH_BLOCK_ATTENTION");
    return e != nullptr && std::string(e) == "chunked";
  }();
  return g_impl == BlockAttentionImpl::Fused || (g_impl == BlockAttentionImpl::Default && !env_chunked);
}
constexpr int64_t kMaxChunkRows = 8192;
constexpr int kMaxBlock = 64;

struct Geometry {
  int64_t N, B, nh, nkv, G, hd, T, QD, KVD;
  int window;
  bool full_block;
  int block_rows;  // the block keys each query may see: the first block_rows (BlockAttnSpec::visible_block_rows)
  float scale;
};

struct Chunk {
  int64_t n0, n1, k0, k1;  // blocks [n0, n1), context keys [k0, k1)
};
inline int64_t padded(int64_t Tk) { return (Tk + 31) / 32 * 32; }

// Context keys the block's first row may see (the widest range of any of its rows): [lo, hi).
inline void block_key_range(const Geometry& g, int32_t a, int32_t s0, int64_t& lo, int64_t& hi) {
  lo = s0;
  hi = a;
  if (g.window > 0) lo = std::max<int64_t>(s0, int64_t(a) - (g.window - 1));
  if (lo > hi) lo = hi;
}

void check_indices(const Geometry& g, const std::vector<int32_t>& an, const std::vector<int32_t>& sb) {
  for (int64_t n = 0; n < g.N; ++n)
    DF_CHECK(sb[n] >= 0 && sb[n] <= an[n] && an[n] < g.T, Internal,
             "block attention (CUDA): block " << n << " anchor " << an[n] << " seq_begin " << sb[n] << " T " << g.T);
}

std::vector<Chunk> plan_chunks(const Geometry& g, const std::vector<int32_t>& an, const std::vector<int32_t>& sb) {
  check_indices(g, an, sb);
  std::vector<Chunk> chunks;
  int64_t n = 0;
  while (n < g.N) {
    Chunk c{n, n, 0, 0};
    block_key_range(g, an[n], sb[n], c.k0, c.k1);
    c.n1 = n + 1;
    while (c.n1 < g.N) {
      int64_t lo, hi;
      block_key_range(g, an[c.n1], sb[c.n1], lo, hi);
      const int64_t k0 = std::min(c.k0, lo), k1 = std::max(c.k1, hi);
      const int64_t rows = (c.n1 + 1 - c.n0) * g.B;
      if (rows > kMaxChunkRows || rows * g.nh * padded(k1 - k0) > g_score_budget) break;
      c.k0 = k0;
      c.k1 = k1;
      ++c.n1;
    }
    if (c.k1 < c.k0) c.k1 = c.k0;
    chunks.push_back(c);
    n = c.n1;
  }
  return chunks;
}

// ---- CTA-wide reductions over kRowThreads threads ------------------------------------------------
// Online softmax statistics (max m, sum of exp(x - m)) merged across a CTA.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum maxsum_merge(MaxSum a, MaxSum b) {
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}
__device__ __forceinline__ void maxsum_add(MaxSum& a, float x) {
  if (x > a.m) {
    a.s = a.s * __expf(a.m - x) + 1.f;
    a.m = x;
  } else {
    a.s += __expf(x - a.m);
  }
}
__device__ __forceinline__ MaxSum block_maxsum(MaxSum v, MaxSum* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = maxsum_merge(v, other);
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  MaxSum r = red[0];
  for (int w = 1; w < kRowThreads / 32; ++w) r = maxsum_merge(r, red[w]);
  __syncthreads();
  return r;
}

// 4 bf16 stored as one 8-byte access.
__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* p, float a, float b, float c, float d) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  uint2 v;
  v.x = *reinterpret_cast<unsigned*>(&lo);
  v.y = *reinterpret_cast<unsigned*>(&hi);
  *reinterpret_cast<uint2*>(p) = v;
}
__device__ __forceinline__ float4 load_bf16x4(const __nv_bfloat16* p) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.y));
  return {lo.x, lo.y, hi.x, hi.y};
}

struct KernelArgs {
  int64_t n0, k0, Tk, Rc;
  int64_t ld;  // row stride of S and P: Tk rounded up to 32 (aligned rows keep cuBLAS on its vector paths)
  int B, nh, nkv, hd, window;
  bool full_block;  // sliding layers: the whole block visible (BlockAttnSpec::full_block)
  int block_rows;   // block keys at offsets >= block_rows are hidden (BlockAttnSpec::block_rows; forward only)
  float scale;
  const int32_t* anchors;    // [N] global
  const int32_t* seq_begin;  // [N] global
};

// Visible context keys of chunk row r, relative to k0: [jlo, jhi); visible block offsets [0, blk_hi).
__device__ __forceinline__ void row_visibility(const KernelArgs& p, int64_t r, int64_t& jlo, int64_t& jhi,
                                               int& blk_hi) {
  const int64_t n = p.n0 + r / p.B;
  const int o = static_cast<int>(r % p.B);
  const int64_t a = p.anchors[n], s0 = p.seq_begin[n];
  int64_t lo = s0, hi = a;
  blk_hi = p.B;
  if (p.window > 0) {
    const int64_t wlo = a + o - (p.window - 1);
    lo = s0 > wlo ? s0 : wlo;
    blk_hi = p.full_block ? p.B : o + 1;
  }
  if (blk_hi > p.block_rows) blk_hi = p.block_rows;
  if (lo > hi) lo = hi;
  jlo = lo - p.k0;
  jhi = hi - p.k0;
}

// Forward, one CTA per (chunk row r = blockIdx.x, head h = blockIdx.y): softmax over the row's visible
// context scores S (fp32, already scaled) and its block scores (computed here); writes P (bf16, zero
// outside the visible range), lse, and the block keys' share of the output into out32 (fp32).
__global__ void __launch_bounds__(kRowThreads) softmax_forward_kernel(
    KernelArgs p, const float* __restrict__ S, __nv_bfloat16* __restrict__ P, const __nv_bfloat16* __restrict__ q,
    const __nv_bfloat16* __restrict__ kb, const __nv_bfloat16* __restrict__ vb, float* __restrict__ out32,
    float* __restrict__ lse) {
  __shared__ float sblk[kMaxBlock];
  const int64_t r = blockIdx.x;
  const int h = blockIdx.y, g = h / (p.nh / p.nkv);
  const int64_t QD = int64_t(p.nh) * p.hd, KVD = int64_t(p.nkv) * p.hd;
  int64_t jlo, jhi;
  int blk_hi;
  row_visibility(p, r, jlo, jhi, blk_hi);
  const int64_t blk_row0 = (r / p.B) * p.B;  // chunk row of the block's first key
  const __nv_bfloat16* qv = q + r * QD + int64_t(h) * p.hd;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int b = warp; b < blk_hi; b += kRowThreads / 32) {
    const __nv_bfloat16* kv = kb + (blk_row0 + b) * KVD + int64_t(g) * p.hd;
    float s = 0.f;
    for (int d = lane; d < p.hd; d += 32) s += __bfloat162float(qv[d]) * __bfloat162float(kv[d]);
    s = warp_sum(s);
    if (lane == 0) sblk[b] = s * p.scale;
  }
  __syncthreads();
  // Rows are padded to p.ld (a multiple of 32), so 16-byte vectors cover them; columns outside the visible
  // range are skipped in the statistics and written as 0.
  const float4* srow4 = reinterpret_cast<const float4*>(S + (int64_t(h) * p.Rc + r) * p.ld);
  const int64_t n4 = p.ld / 4;
  __shared__ MaxSum red_ms[kRowThreads / 32];
  MaxSum st{-INFINITY, 0.f};
  for (int64_t i = threadIdx.x; i < n4; i += kRowThreads) {
    const float4 x = srow4[i];
    const int64_t j = 4 * i;
    if (j >= jlo && j < jhi) maxsum_add(st, x.x);
    if (j + 1 >= jlo && j + 1 < jhi) maxsum_add(st, x.y);
    if (j + 2 >= jlo && j + 2 < jhi) maxsum_add(st, x.z);
    if (j + 3 >= jlo && j + 3 < jhi) maxsum_add(st, x.w);
  }
  for (int b = threadIdx.x; b < blk_hi; b += kRowThreads) maxsum_add(st, sblk[b]);
  st = block_maxsum(st, red_ms);
  const float l = st.m + logf(st.s);
  __nv_bfloat16* prow = P + (int64_t(h) * p.Rc + r) * p.ld;
  for (int64_t i = threadIdx.x; i < n4; i += kRowThreads) {
    const float4 x = srow4[i];
    const int64_t j = 4 * i;
    store_bf16x4(prow + j, j >= jlo && j < jhi ? __expf(x.x - l) : 0.f,
                 j + 1 >= jlo && j + 1 < jhi ? __expf(x.y - l) : 0.f, j + 2 >= jlo && j + 2 < jhi ? __expf(x.z - l) : 0.f,
                 j + 3 >= jlo && j + 3 < jhi ? __expf(x.w - l) : 0.f);
  }
  for (int d = threadIdx.x; d < p.hd; d += kRowThreads) {
    float acc = 0.f;
    for (int b = 0; b < blk_hi; ++b)
      acc += __expf(sblk[b] - l) * __bfloat162float(vb[(blk_row0 + b) * KVD + int64_t(g) * p.hd + d]);
    out32[r * QD + int64_t(h) * p.hd + d] = acc;
  }
  if (threadIdx.x == 0) lse[r * p.nh + h] = l;
}

// fp32 -> bf16, n elements.
__global__ void to_bf16_kernel(__nv_bfloat16* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __float2bfloat16_rn(src[i]);
}

// Backward, one CTA per (block n = n0 + blockIdx.x, kv head g = blockIdx.y): the G·B query rows of the
// block that read kv head g against the block's own B keys. Computes D = rowsum(dout · out) for those rows
// (saved for the context part), overwrites dq32 with the block keys' share of dq, and writes dk_blk/dv_blk
// (no other block sees these keys, so they are complete here).
// Shared memory: fp32 P, dS [G·B][B] and D, lse [G·B], then k, v [B][hd+2] and (kRows ==
// RowsIn::Shared) q, dout [G·B][hd+2] as bf16 (exact copies of the inputs; rows padded by 4 bytes against
// bank conflicts). RowsIn::Global reads q and dout from global memory (L2) instead: the variant for devices
// whose shared memory does not hold them (sm_120's 99 KB at the 27B drafter's 96 x 256 rows).
enum class RowsIn { Shared, Global };
template <RowsIn kRows>
__global__ void __launch_bounds__(kRowThreads) block_keys_backward_kernel(
    KernelArgs p, const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ dout,
    const __nv_bfloat16* __restrict__ out, const float* __restrict__ lse, const __nv_bfloat16* __restrict__ kb,
    const __nv_bfloat16* __restrict__ vb, float* __restrict__ Dbuf, float* __restrict__ dq32,
    __nv_bfloat16* __restrict__ dkb, __nv_bfloat16* __restrict__ dvb) {
  extern __shared__ float smem[];
  const int G = p.nh / p.nkv, B = p.B, hd = p.hd, ld = hd + 2, GB = G * B;
  const int64_t QD = int64_t(p.nh) * hd, KVD = int64_t(p.nkv) * hd;
  float* Ps = smem;
  float* dSs = Ps + GB * B;
  float* Ds = dSs + GB * B;
  float* Ls = Ds + GB;
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(Ls + GB);
  __nv_bfloat16* vs = ks + B * ld;
  __nv_bfloat16* qs = vs + B * ld;
  __nv_bfloat16* dos = qs + GB * ld;
  const int64_t nl = blockIdx.x;  // block within the chunk
  const int g = blockIdx.y;
  const int64_t row0 = nl * B;   // chunk row of the block's first query
  // Row i of the tile: block offset o = i / G, head h = g·G + i % G.
  auto row_off = [&](int i) { return (row0 + i / G) * QD + int64_t(g * G + i % G) * hd; };
  if constexpr (kRows == RowsIn::Shared) {
    for (int idx = threadIdx.x; idx < GB * hd; idx += blockDim.x) {
      const int i = idx / hd, d = idx % hd;
      qs[i * ld + d] = q[row_off(i) + d];
      dos[i * ld + d] = dout[row_off(i) + d];
    }
  }
  auto q_at = [&](int i, int d) {
    if constexpr (kRows == RowsIn::Shared) return __bfloat162float(qs[i * ld + d]);
    else return __bfloat162float(q[row_off(i) + d]);
  };
  auto dout_at = [&](int i, int d) {
    if constexpr (kRows == RowsIn::Shared) return __bfloat162float(dos[i * ld + d]);
    else return __bfloat162float(dout[row_off(i) + d]);
  };
  for (int idx = threadIdx.x; idx < B * hd; idx += blockDim.x) {
    const int b = idx / hd, d = idx % hd;
    const int64_t off = (row0 + b) * KVD + int64_t(g) * hd + d;
    ks[b * ld + d] = kb[off];
    vs[b * ld + d] = vb[off];
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  for (int i = warp; i < GB; i += nwarps) {
    const int64_t row = row0 + i / G;
    const int h = g * G + i % G;
    float s = 0.f;
    for (int d = lane; d < hd; d += 32)
      s += __bfloat162float(dout[row * QD + int64_t(h) * hd + d]) * __bfloat162float(out[row * QD + int64_t(h) * hd + d]);
    s = warp_sum(s);
    if (lane == 0) {
      Ds[i] = s;
      Ls[i] = lse[row * p.nh + h];
      Dbuf[row * p.nh + h] = s;
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < GB * B; idx += blockDim.x) {
    const int i = idx / B, b = idx % B, o = i / G;
    float P = 0.f, dS = 0.f;
    if (p.window <= 0 || p.full_block || b <= o) {
      float s = 0.f, dp = 0.f;
      for (int d = 0; d < hd; ++d) {
        s += q_at(i, d) * __bfloat162float(ks[b * ld + d]);
        dp += dout_at(i, d) * __bfloat162float(vs[b * ld + d]);
      }
      P = __expf(s * p.scale - Ls[i]);
      dS = P * (dp - Ds[i]);
    }
    Ps[idx] = P;
    dSs[idx] = dS;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < GB * hd; idx += blockDim.x) {
    const int i = idx / hd, d = idx % hd;
    float acc = 0.f;
    for (int b = 0; b < B; ++b) acc += dSs[i * B + b] * __bfloat162float(ks[b * ld + d]);
    dq32[(row0 + i / G) * QD + int64_t(g * G + i % G) * hd + d] = acc * p.scale;
  }
  for (int idx = threadIdx.x; idx < B * hd; idx += blockDim.x) {
    const int b = idx / hd, d = idx % hd;
    float dk = 0.f, dv = 0.f;
    for (int i = 0; i < GB; ++i) {
      dk += dSs[i * B + b] * q_at(i, d);
      dv += Ps[i * B + b] * dout_at(i, d);
    }
    const int64_t off = (p.n0 * B + row0 + b) * KVD + int64_t(g) * hd + d;
    dkb[off] = __float2bfloat16_rn(dk * p.scale);
    dvb[off] = __float2bfloat16_rn(dv);
  }
}

// Backward, one CTA per (chunk row, head): P = exp(S - lse) on the visible context range, 0 elsewhere.
__global__ void __launch_bounds__(kRowThreads) probs_backward_kernel(KernelArgs p, const float* __restrict__ S,
                                                                    __nv_bfloat16* __restrict__ P,
                                                                    const float* __restrict__ lse) {
  const int64_t r = blockIdx.x;
  const int h = blockIdx.y;
  int64_t jlo, jhi;
  int blk_hi;
  row_visibility(p, r, jlo, jhi, blk_hi);
  const float l = lse[r * p.nh + h];
  const float4* srow4 = reinterpret_cast<const float4*>(S + (int64_t(h) * p.Rc + r) * p.ld);
  __nv_bfloat16* prow = P + (int64_t(h) * p.Rc + r) * p.ld;
  for (int64_t i = threadIdx.x; i < p.ld / 4; i += kRowThreads) {
    const float4 x = srow4[i];
    const int64_t j = 4 * i;
    store_bf16x4(prow + j, j >= jlo && j < jhi ? __expf(x.x - l) : 0.f,
                 j + 1 >= jlo && j + 1 < jhi ? __expf(x.y - l) : 0.f, j + 2 >= jlo && j + 2 < jhi ? __expf(x.z - l) : 0.f,
                 j + 3 >= jlo && j + 3 < jhi ? __expf(x.w - l) : 0.f);
  }
}

// Backward, one CTA per (chunk row, head): dS = P (dP - D), written over P (bf16).
__global__ void __launch_bounds__(kRowThreads) dscores_backward_kernel(KernelArgs p, const float* __restrict__ dP,
                                                                      __nv_bfloat16* __restrict__ P,
                                                                      const float* __restrict__ Dbuf) {
  const int64_t r = blockIdx.x;
  const int h = blockIdx.y;
  const float D = Dbuf[r * p.nh + h];
  const float4* dp4 = reinterpret_cast<const float4*>(dP + (int64_t(h) * p.Rc + r) * p.ld);
  __nv_bfloat16* prow = P + (int64_t(h) * p.Rc + r) * p.ld;
  for (int64_t i = threadIdx.x; i < p.ld / 4; i += kRowThreads) {
    const float4 d = dp4[i];
    const float4 pr = load_bf16x4(prow + 4 * i);
    const int64_t j = 4 * i;  // pad columns (>= Tk) hold no dP: written as 0
    store_bf16x4(prow + j, j < p.Tk ? pr.x * (d.x - D) : 0.f, j + 1 < p.Tk ? pr.y * (d.y - D) : 0.f,
                 j + 2 < p.Tk ? pr.z * (d.z - D) : 0.f, j + 3 < p.Tk ? pr.w * (d.w - D) : 0.f);
  }
}

void launch_to_bf16(const Ctx& ctx, void* dst, const float* src, int64_t n) {
  if (n <= 0) return;
  const unsigned blocks = grid_stride_blocks(ctx, n, 256, 16);
  to_bf16_kernel<<<blocks, 256, 0, stream_of(ctx)>>>(static_cast<__nv_bfloat16*>(dst), src, n);
  DF_CUDA_LAUNCH();
}

Geometry geometry_of(const Tensor& q, const Tensor& k_ctx, const Tensor& anchors, const ops::BlockAttnSpec& spec) {
  Geometry g{};
  g.N = anchors.shape[0];
  g.B = spec.block_size;
  g.nh = q.shape[1];
  g.hd = q.shape[2];
  g.nkv = k_ctx.shape[1];
  g.T = k_ctx.shape[0];
  g.G = g.nh / g.nkv;
  g.QD = g.nh * g.hd;
  g.KVD = g.nkv * g.hd;
  g.window = spec.window;
  g.full_block = spec.full_block;
  g.block_rows = spec.visible_block_rows();
  g.scale = spec.scale;
  DF_CHECK(g.B <= kMaxBlock, Internal, "block attention (CUDA): block size " << g.B << " > " << kMaxBlock);
  return g;
}

void check_bf16(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    DF_CHECK(t->dtype == DType::BF16, Internal, op << ": activations must be BF16 on CUDA, got " << dtype_name(t->dtype));
}

// anchors/seq_begin to the host (a small synchronous copy: the chunk plan is made on the host) and checked.
void host_indices(const Ctx& ctx, const Geometry& g, const Tensor& anchors, const Tensor& seq_begin,
                  std::vector<int32_t>& an, std::vector<int32_t>& sb) {
  DF_CHECK(anchors.dtype == DType::I32 && seq_begin.dtype == DType::I32, Internal,
           "block attention (CUDA): anchors/seq_begin must be I32");
  an.resize(static_cast<size_t>(g.N));
  sb.resize(static_cast<size_t>(g.N));
  copy_bytes(ctx, an.data(), anchors.data, sizeof(int32_t) * an.size());
  copy_bytes(ctx, sb.data(), seq_begin.data, sizeof(int32_t) * sb.size());
}

KernelArgs kernel_args(const Geometry& g, const Chunk& c, const Tensor& anchors, const Tensor& seq_begin) {
  KernelArgs p{};
  p.n0 = c.n0;
  p.k0 = c.k0;
  p.Tk = c.k1 - c.k0;
  p.ld = padded(p.Tk);
  p.Rc = (c.n1 - c.n0) * g.B;
  p.B = static_cast<int>(g.B);
  p.nh = static_cast<int>(g.nh);
  p.nkv = static_cast<int>(g.nkv);
  p.hd = static_cast<int>(g.hd);
  p.window = g.window;
  p.full_block = g.full_block;
  p.block_rows = static_cast<int>(g.block_rows);
  p.scale = g.scale;
  p.anchors = static_cast<const int32_t*>(anchors.data);
  p.seq_begin = static_cast<const int32_t*>(seq_begin.data);
  return p;
}

const __nv_bfloat16* bf(const Tensor& t) { return static_cast<const __nv_bfloat16*>(t.data); }
__nv_bfloat16* bf_mut(const Tensor& t) { return static_cast<__nv_bfloat16*>(t.data); }

// Per-head context products of one chunk, G batched calls of nkv problems each (head h = kv·G + r).
// scores [nh][Rc][Tk] (+)= alpha · X_h [Rc, hd] · Y_kv [Tk, hd]^T          (X rows of QD, Y rows of KVD)
void heads_scores(const Ctx& ctx, const Geometry& g, const KernelArgs& p, const __nv_bfloat16* X,
                  const __nv_bfloat16* Y, float alpha, float* scores) {
  for (int64_t r = 0; r < g.G; ++r)
    gemm_bf16(ctx, true, false, p.Tk, p.Rc, g.hd, alpha, {Y, g.KVD, g.hd}, {X + r * g.hd, g.QD, g.G * g.hd}, 0.f,
              scores + r * p.Rc * p.ld, true, p.ld, g.G * p.Rc * p.ld, g.nkv);
}
// out_h [Rc, hd] (rows of QD, fp32) += alpha · M_h [Rc, Tk] · Y_kv [Tk, hd]
void heads_rows(const Ctx& ctx, const Geometry& g, const KernelArgs& p, const __nv_bfloat16* M,
                const __nv_bfloat16* Y, float alpha, float* out) {
  for (int64_t r = 0; r < g.G; ++r)
    gemm_bf16(ctx, false, false, g.hd, p.Rc, p.Tk, alpha, {Y, g.KVD, g.hd}, {M + r * p.Rc * p.ld, p.ld, g.G * p.Rc * p.ld},
              1.f, out + r * g.hd, true, g.QD, g.G * g.hd, g.nkv);
}
// out_kv [Tk, hd] (rows of KVD, fp32) += alpha · sum over the G heads of kv: M_h^T [Tk, Rc] · X_h [Rc, hd]
void heads_keys(const Ctx& ctx, const Geometry& g, const KernelArgs& p, const __nv_bfloat16* M,
                const __nv_bfloat16* X, float alpha, float* out) {
  for (int64_t r = 0; r < g.G; ++r)
    gemm_bf16(ctx, false, true, g.hd, p.Tk, p.Rc, alpha, {X + r * g.hd, g.QD, g.G * g.hd},
              {M + r * p.Rc * p.ld, p.ld, g.G * p.Rc * p.ld}, 1.f, out, true, g.KVD, g.hd, g.nkv);
}

}  // namespace

void set_block_attention_impl(BlockAttentionImpl impl) { g_impl = impl; }

void set_block_attention_score_budget(int64_t elements) { g_score_budget = elements > 0 ? elements : (int64_t(192) << 20); }

void block_attention_forward(const Ctx& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                             const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk,
                             const Tensor& anchors, const Tensor& seq_begin, const ops::BlockAttnSpec& spec) {
  const Geometry g = geometry_of(q, k_ctx, anchors, spec);
  std::vector<int32_t> an, sb;
  if (g.N > 0) host_indices(ctx, g, anchors, seq_begin, an, sb);
  block_attention_forward(ctx, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, seq_begin, an, sb, spec);
}

void block_attention_forward(const Ctx& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                             const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk,
                             const Tensor& anchors, const Tensor& seq_begin, const std::vector<int32_t>& an,
                             const std::vector<int32_t>& sb, const ops::BlockAttnSpec& spec) {
  const char* op = "block_attention_forward (CUDA)";
  ops::check_block_rows(op, spec, ops::AttnPass::Forward);
  check_bf16(op, {&out, &q, &k_ctx, &v_ctx, &k_blk, &v_blk});
  DF_CHECK(lse.dtype == DType::F32, Internal, op << ": lse must be F32");
  const Geometry g = geometry_of(q, k_ctx, anchors, spec);
  if (g.N == 0) return;
  DF_CHECK(an.size() == size_t(g.N) && sb.size() == size_t(g.N), Internal, op << ": host anchors/seq_begin of size " << g.N);
  if (use_fused() && block_attention_fused_supported(g.nh, g.nkv, g.hd, g.B) &&
      block_attention_fused_usable({&out, &q, &k_ctx, &v_ctx, &k_blk, &v_blk})) {
    check_indices(g, an, sb);
    return block_attention_fused_forward(ctx, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, seq_begin, spec);
  }
  const std::vector<Chunk> chunks = plan_chunks(g, an, sb);
  int64_t max_scores = 1, max_rows = 1;
  for (const Chunk& c : chunks) {
    max_scores = std::max(max_scores, (c.n1 - c.n0) * g.B * g.nh * padded(c.k1 - c.k0));
    max_rows = std::max(max_rows, (c.n1 - c.n0) * g.B);
  }
  float* S = static_cast<float*>(scratch(ctx, ScratchSlot::AttnScores, sizeof(float) * max_scores));
  auto* P = static_cast<__nv_bfloat16*>(scratch(ctx, ScratchSlot::AttnProbs, 2 * max_scores));
  float* out32 = static_cast<float*>(scratch(ctx, ScratchSlot::AttnOut32, sizeof(float) * max_rows * g.QD));
  for (const Chunk& c : chunks) {
    const KernelArgs p = kernel_args(g, c, anchors, seq_begin);
    const int64_t row0 = c.n0 * g.B;
    const __nv_bfloat16* qc = bf(q) + row0 * g.QD;
    if (p.Tk > 0) heads_scores(ctx, g, p, qc, bf(k_ctx) + c.k0 * g.KVD, g.scale, S);
    softmax_forward_kernel<<<dim3(unsigned(p.Rc), unsigned(g.nh)), kRowThreads, 0, stream_of(ctx)>>>(
        p, S, P, qc, bf(k_blk) + row0 * g.KVD, bf(v_blk) + row0 * g.KVD, out32,
        static_cast<float*>(lse.data) + row0 * g.nh);
    DF_CUDA_LAUNCH();
    if (p.Tk > 0) heads_rows(ctx, g, p, P, bf(v_ctx) + c.k0 * g.KVD, 1.f, out32);
    launch_to_bf16(ctx, bf_mut(out) + row0 * g.QD, out32, p.Rc * g.QD);
  }
}

void block_attention_backward(const Ctx& ctx, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                              const Tensor& dk_blk, const Tensor& dv_blk, const Tensor& dout, const Tensor& out,
                              const Tensor& lse, const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx,
                              const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors,
                              const Tensor& seq_begin, const ops::BlockAttnSpec& spec) {
  const Geometry g = geometry_of(q, k_ctx, anchors, spec);
  std::vector<int32_t> an, sb;
  if (g.N > 0) host_indices(ctx, g, anchors, seq_begin, an, sb);
  block_attention_backward(ctx, dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx, v_ctx, k_blk, v_blk,
                           anchors, seq_begin, an, sb, spec);
}

void block_attention_backward(const Ctx& ctx, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                              const Tensor& dk_blk, const Tensor& dv_blk, const Tensor& dout, const Tensor& out,
                              const Tensor& lse, const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx,
                              const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors,
                              const Tensor& seq_begin, const std::vector<int32_t>& an, const std::vector<int32_t>& sb,
                              const ops::BlockAttnSpec& spec) {
  const char* op = "block_attention_backward (CUDA)";
  ops::check_block_rows(op, spec, ops::AttnPass::Backward);
  check_bf16(op, {&dq, &dk_ctx, &dv_ctx, &dk_blk, &dv_blk, &dout, &out, &q, &k_ctx, &v_ctx, &k_blk, &v_blk});
  DF_CHECK(lse.dtype == DType::F32, Internal, op << ": lse must be F32");
  const Geometry g = geometry_of(q, k_ctx, anchors, spec);
  if (use_fused() && block_attention_fused_supported(g.nh, g.nkv, g.hd, g.B) &&
      block_attention_fused_usable({&dq, &dk_ctx, &dv_ctx, &dk_blk, &dv_blk, &dout, &out, &q, &k_ctx, &v_ctx, &k_blk, &v_blk})) {
    DF_CHECK(an.size() == size_t(g.N) && sb.size() == size_t(g.N), Internal, op << ": host anchors/seq_begin of size " << g.N);
    check_indices(g, an, sb);
    return block_attention_fused_backward(ctx, dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx, v_ctx,
                                          k_blk, v_blk, anchors, seq_begin, spec);
  }
  cudaStream_t st = stream_of(ctx);
  float* dkv32 = static_cast<float*>(scratch(ctx, ScratchSlot::AttnDkv32, sizeof(float) * 2 * std::max<int64_t>(1, g.T) * g.KVD));
  float* dk32 = dkv32;
  float* dv32 = dkv32 + g.T * g.KVD;
  DF_CUDA(cudaMemsetAsync(dkv32, 0, sizeof(float) * 2 * g.T * g.KVD, st));
  if (g.N > 0) {
    DF_CHECK(an.size() == size_t(g.N) && sb.size() == size_t(g.N), Internal, op << ": host anchors/seq_begin of size " << g.N);
    const std::vector<Chunk> chunks = plan_chunks(g, an, sb);
    int64_t max_scores = 1, max_rows = 1;
    for (const Chunk& c : chunks) {
      max_scores = std::max(max_scores, (c.n1 - c.n0) * g.B * g.nh * padded(c.k1 - c.k0));
      max_rows = std::max(max_rows, (c.n1 - c.n0) * g.B);
    }
    float* S = static_cast<float*>(scratch(ctx, ScratchSlot::AttnScores, sizeof(float) * max_scores));
    auto* P = static_cast<__nv_bfloat16*>(scratch(ctx, ScratchSlot::AttnProbs, 2 * max_scores));
    float* dq32 = static_cast<float*>(scratch(ctx, ScratchSlot::AttnDq32, sizeof(float) * max_rows * g.QD));
    float* Dbuf = static_cast<float*>(scratch(ctx, ScratchSlot::AttnRowStats, sizeof(float) * max_rows * g.nh));
    // The block's own keys: q and dout staged in shared memory where the device holds them (RowsIn).
    const int GB = static_cast<int>(g.G * g.B), ld = static_cast<int>(g.hd + 2);
    const size_t smem_global = sizeof(float) * (size_t(2 * GB) * g.B + 2 * GB) + 2 * size_t(2 * g.B) * ld;
    const size_t smem_shared = smem_global + 2 * size_t(2 * GB) * ld;
    const int device = backend_of(ctx).device;
    const bool rows_shared = launch_fits(block_keys_backward_kernel<RowsIn::Shared>, kRowThreads, smem_shared, device);
    auto* keys_kernel = rows_shared ? block_keys_backward_kernel<RowsIn::Shared> : block_keys_backward_kernel<RowsIn::Global>;
    const size_t smem = rows_shared ? smem_shared : smem_global;
    fit_launch(keys_kernel, rows_shared ? "block_keys_backward_kernel" : "block_keys_backward_kernel (rows in global)",
               kRowThreads, smem, device);
    for (const Chunk& c : chunks) {
      const KernelArgs p = kernel_args(g, c, anchors, seq_begin);
      const int64_t row0 = c.n0 * g.B;
      const __nv_bfloat16* qc = bf(q) + row0 * g.QD;
      const __nv_bfloat16* doc = bf(dout) + row0 * g.QD;
      const float* lsec = static_cast<const float*>(lse.data) + row0 * g.nh;
      keys_kernel<<<dim3(unsigned(c.n1 - c.n0), unsigned(g.nkv)), kRowThreads, smem, st>>>(
          p, qc, doc, bf(out) + row0 * g.QD, lsec, bf(k_blk) + row0 * g.KVD, bf(v_blk) + row0 * g.KVD, Dbuf, dq32,
          bf_mut(dk_blk), bf_mut(dv_blk));
      DF_CUDA_LAUNCH();
      if (p.Tk > 0) {
        const __nv_bfloat16* kc = bf(k_ctx) + c.k0 * g.KVD;
        const __nv_bfloat16* vc = bf(v_ctx) + c.k0 * g.KVD;
        const dim3 rows(unsigned(p.Rc), unsigned(g.nh));
        heads_scores(ctx, g, p, qc, kc, g.scale, S);
        probs_backward_kernel<<<rows, kRowThreads, 0, st>>>(p, S, P, lsec);
        DF_CUDA_LAUNCH();
        heads_keys(ctx, g, p, P, doc, 1.f, dv32 + c.k0 * g.KVD);      // dV += P^T dO
        heads_scores(ctx, g, p, doc, vc, 1.f, S);                      // dP = dO V^T
        dscores_backward_kernel<<<rows, kRowThreads, 0, st>>>(p, S, P, Dbuf);
        DF_CUDA_LAUNCH();
        heads_rows(ctx, g, p, P, kc, g.scale, dq32);                   // dq += scale dS K
        heads_keys(ctx, g, p, P, qc, g.scale, dk32 + c.k0 * g.KVD);    // dK += scale dS^T q
      }
      launch_to_bf16(ctx, bf_mut(dq) + row0 * g.QD, dq32, p.Rc * g.QD);
    }
  }
  launch_to_bf16(ctx, dk_ctx.data, dk32, g.T * g.KVD);
  launch_to_bf16(ctx, dv_ctx.data, dv32, g.T * g.KVD);
}

}  // namespace dflash::cuda
