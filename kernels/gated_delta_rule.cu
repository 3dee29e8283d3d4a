// The gated delta rule, chunked as flash-linear-attention's chunk_gated_delta_rule (WY / UT transform), in
// two kernels on mma.sync (m16n8k16 bf16 -> fp32) with fp32 for the triangular solve and the state.
//
// The math (one sequence, one value head, chunks of C = 64 tokens; rows r, j index tokens of a chunk).
// q and k are never normalised in memory: the raw bf16 rows feed the tensor cores and the l2norm factors
//   rq_r = dk^-1/2 / sqrt(|q_r|^2 + 1e-6),   rk_r = 1 / sqrt(|k_r|^2 + 1e-6)
// are applied in fp32 to the products. With G = the inclusive cumsum of g inside the chunk (padding rows of
// a short last chunk get g = 0 and beta = 0, so G stays flat there and every padded row drops out), and S
// the state [dk, dv] at the chunk start, the recurrence S_t = e^{g_t} S_{t-1} + k_t (beta_t (v_t - e^{g_t}
// S_{t-1}^T k_t))^T unrolls to
//   A[r][j]  = beta_r e^{G_r - G_j} rk_r rk_j (k_r . k_j)   for j < r, else 0     (strictly lower)
//   X        = (I + A)^-1                                                          (unit lower)
//   R[r]     = beta_r (v_r - e^{G_r} rk_r (k_r^T S))                              (64 x dv)
//   v_new    = X R          (= u - w S of FLA, with u = X diag(beta) V, w = X diag(beta e^G) K)
//   out[r]   = e^{G_r} rq_r (q_r^T S) + sum_{j <= r} e^{G_r - G_j} rq_r rk_j (q_r . k_j) v_new[j]
//   S'       = e^{G_last} S + sum_j k_j (rk_j e^{G_last - G_j} v_new[j])^T
// Folding diag(beta) and the e^{G} K S term into R instead of precomputing w and u means the only per-chunk
// product that outlives the chunk-parallel kernel is X: 64 values per token and head (T * nv * 64 bf16 of
// workspace, 201 MB at T = 32768, nv = 48), instead of FLA's w and u (T * nv * (dk + dv), 805 MB), and the
// sequential kernel does one 64 x 64 x dv product (X R) in place of the 64 x dk x dv product w S.
//
// Kernel 1 (gdr_prepare, one block per (chunk, value head), all chunks in parallel): K K^T on the tensor
//   cores, A in fp32, X by blocked forward substitution in fp32 (16 x 16 diagonal blocks, then the
//   off-diagonal blocks by distance), X stored as bf16 (as FLA's solve_tril stores it). The fp32 X
//   reuses the key tile's bytes: 37 KB per block, 6 blocks per SM on sm_90.
// Kernel 2 (gdr_chunk_scan, one block per (sequence, value head, 64-column slice of dv), chunks in order):
//   the state slice S [dk, 64] lives in fp32 accumulator registers (a bf16 copy in shared memory feeds the
//   MMAs, as FLA's chunk_delta_h casts h for its dots); per chunk: K S and Q S, R, Q K^T masked, X R,
//   the output, the state update. Value columns are independent in the recurrence, so dv = 128 splits into
//   two blocks per (sequence, head): 768 blocks for 8 sequences x 48 heads. Two versions:
//   - gdr_chunk_scan_pipelined (sm_90 / sm_100, and sm_120 when dk, dv <= 64): the next chunk's tiles come
//     in by cp.async while the current chunk computes. Q and X rows are private to the warp that owns
//     them (A operands), so each warp copies its own next rows as soon as it is done with them; V goes in
//     after the barrier that ends X R; K, read by every warp up to the state update, has two stages; the
//     gates go through warp 0's registers. The q/k row norms come from shared memory after arrival (each
//     warp its own 16 rows; rk_j moves from the masked Q K^T into v_new so that every norm is used by its
//     own row's warp). 3 barriers per chunk; 106.5 KB of shared memory per block, still 2 blocks per SM;
//     255 registers, no spills;
//   - gdr_chunk_scan (sm_120 at dk or dv > 64, its 99 KB per block; or DFLASH_GDR_SCAN=sync): each chunk's
//     tiles loaded synchronously (plain 16-byte loads, row norms reduced on the fly), 4 barriers, 89 KB.
//
// Measured on one H200 (tests/gpu/test_gated_delta_rule_gpu.cpp, GpuGatedDeltaRuleTiming; CUDA events, median
// of 20 after 3 warm-ups), Qwen3.6-27B heads (nk 16, dk 128, nv 48, dv 128), T = 32768, both kernels
// (2026-12-01, one call; bench/results/hybrid/gdr-pipelined/): the kernels before this pipelined scan and
// the 6-blocks-per-SM gdr_prepare -> now:
//   8 x 4096 tokens 3.04 -> 2.33 ms;  32 x 1024 tokens 3.09 -> 2.32 ms;  1 x 32768 tokens 6.09 -> 4.12 ms
//   (96 scan blocks on 132 SMs). Of that, the pipelined scan gave 3.04 -> 2.39 ms at 8 x 4096 and
//   gdr_prepare's occupancy (4 -> 6 blocks per SM) 2.39 -> 2.33. In the 27B forward (bench_hybrid_forward
//   --model 27b, 48 layers, same call): 190.3 -> 150.8 ms.
// 8 x 4096 and 32 x 1024 cost the same although their chunk chains differ 4x: the scan is limited by how
// fast each block gets through a chunk (latency), not by the chain length.
// Where the time goes, and what is next (the 1 x 32768 case, 96 blocks alone on their SMs, still takes
// 6-8 us per chunk, 4.12 ms less kernel 1 over 512 chunks, for ~320 MMAs on the slowest warp: with the
// loads in flight behind the compute, what is left is latency of dependent MMA chains, 3 barriers and
// 4 warps per block):
//   - both slices of a head recompute Q K^T (a fifth of the slowest warp's MMAs) and load Q, K, X:
//     precomputing the masked Q K^T in kernel 1 (another T * nv * 64 bf16) or one block per head with
//     8 warps would remove that;
//   - kernel 1's solve runs on CUDA cores with ~7 block barriers (6 blocks per SM hide some of it); the
//     value heads of one key head share K K^T (nv / nk = 3 of them here), so one block per (chunk, key
//     head) would compute it once (its split of the 2.33 ms is not measured: no profiler on the machine).
#include "gated_delta_rule.cuh"

#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"
#include "mma_ptx.cuh"

namespace dflash::cuda {
namespace {
using namespace ptx;  // the shared tensor-core wrappers (mma_ptx.cuh)

constexpr int kChunk = 64;                // tokens per chunk (FLA's BT)
constexpr int kWarps = 4;                 // warp w owns chunk rows [16 w, 16 w + 16)
constexpr int kThreads = kWarps * 32;
constexpr int kBV = 64;                   // value columns per scan block
constexpr int kStride64 = kChunk + 8;     // bf16 row stride of 64-wide tiles: +16 B keeps ldmatrix conflict-free
constexpr int kFStride = kChunk + 1;      // fp32 row stride of the 64 x 64 solve matrices
constexpr int kMaxDevices = 64;

__device__ __forceinline__ void store_bf16x2(__nv_bfloat16* p, float lo, float hi) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(lo, hi);
}

// 16-byte async copy; src_bytes = 0 zero-fills the destination without reading.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Issues cp.async copies of rows [r0, r0 + kRows) of a W-wide bf16 tile (global row stride ld, shared row
// stride W + 8) by kThr threads (index t); rows >= valid_rows and columns >= valid_cols (a multiple of 8)
// are zero-filled. The caller commits the group.
template <int W, int kRows, int kThr>
__device__ __forceinline__ void async_rows(__nv_bfloat16* tile, const __nv_bfloat16* __restrict__ src, int64_t ld,
                                           int r0, int valid_rows, int valid_cols, int t) {
  constexpr int kCpr = W / 8;
  static_assert(kRows * kCpr % kThr == 0, "whole passes");
#pragma unroll
  for (int i = 0; i < kRows * kCpr / kThr; ++i) {
    const int e = t + i * kThr, r = r0 + e / kCpr, c = e % kCpr;
    const bool ok = r < valid_rows && c * 8 < valid_cols;
    cp_async16(smem_addr(tile + r * (W + 8) + c * 8), ok ? src + r * ld + c * 8 : src, ok ? 16 : 0);
  }
}

// Lane addresses of the ldmatrix x4 forms used below (tile row stride `stride` elements). With the mma
// fragment layouts: A row-major [m][k] (non-trans) gives a[0..3]; B stored [n][k] (non-trans) or [k][n]
// (trans) gives b0, b1 of n-tile 0 in r[0], r[1] and of n-tile 1 in r[2], r[3]; A stored [k][m] (trans)
// gives a[0..3] of A = stored^T.
__device__ __forceinline__ uint32_t a_rowmajor(const __nv_bfloat16* tile, int stride, int m0, int k0, int lane) {
  return smem_addr(tile + (m0 + (lane & 15)) * stride + k0 + (lane >> 4) * 8);
}
__device__ __forceinline__ uint32_t b_nk(const __nv_bfloat16* tile, int stride, int n0, int k0, int lane) {
  return smem_addr(tile + (n0 + (lane & 7) + (lane >> 4) * 8) * stride + k0 + ((lane >> 3) & 1) * 8);
}
__device__ __forceinline__ uint32_t b_kn(const __nv_bfloat16* tile, int stride, int k0, int n0, int lane) {
  return smem_addr(tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * stride + n0 + (lane >> 4) * 8);
}
__device__ __forceinline__ uint32_t a_km(const __nv_bfloat16* tile, int stride, int k0, int m0, int lane) {
  return smem_addr(tile + (k0 + (lane & 7) + (lane >> 4) * 8) * stride + m0 + ((lane >> 3) & 1) * 8);
}

// Zeroes an accumulator of N n-tiles (16 x 8 fp32 fragments).
template <int N> __device__ __forceinline__ void zero_acc(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
}

// acc = A B^T for the 16 rows [16 w, 16 w + 16) of A against the column tiles at or left of them (the rest
// stays zero): the causal products K K^T (gdr_prepare) and Q K^T (the scans), whose upper part is masked.
// A and B are [64][P + 8] bf16 tiles.
template <int P>
__device__ __forceinline__ void causal_rows_nk(float (&acc)[8][4], const __nv_bfloat16* sA, const __nv_bfloat16* sB,
                                               int warp, int lane) {
  zero_acc(acc);
#pragma unroll
  for (int kk = 0; kk < P / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, a_rowmajor(sA, P + 8, 16 * warp, 16 * kk, lane));
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      if (np > warp) break;
      uint32_t b[4];
      ldmatrix_x4(b, b_nk(sB, P + 8, 16 * np, 16 * kk, lane));
      mma_bf16(acc[2 * np], a, b[0], b[1]);
      mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

__device__ __forceinline__ float load_gate(const void* p, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// Copies 64 rows x W columns of bf16 (global row stride ld elements) into a shared tile of row stride
// W + 8, zero past valid_rows / valid_cols (a multiple of 8). With rnorm, also writes
// rnorm[r] = scale / sqrt(sum_c x[r][c]^2 + 1e-6), the l2norm factor of each row (fp32 sums of the bf16
// values: the 16-byte chunks of a row sit in consecutive lanes and are reduced by shuffles).
template <int W>
__device__ __forceinline__ void load_tile(__nv_bfloat16* tile, const __nv_bfloat16* __restrict__ src, int64_t ld,
                                          int valid_rows, int valid_cols, float* rnorm, float scale) {
  constexpr int kCpr = W / 8;                    // 16-byte chunks per row: 8 or 16, a divisor of 32
  constexpr int kRowsPerPass = kThreads / kCpr;  // 16 or 8
  constexpr int kPasses = kChunk / kRowsPerPass;
  const int c = threadIdx.x % kCpr, r0 = threadIdx.x / kCpr;
  const bool col_ok = c * 8 < valid_cols;
  uint4 v[kPasses];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {  // every load in flight before the first store
    const int r = r0 + p * kRowsPerPass;
    v[p] = make_uint4(0u, 0u, 0u, 0u);
    if (col_ok && r < valid_rows) v[p] = *reinterpret_cast<const uint4*>(src + r * ld + c * 8);
  }
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int r = r0 + p * kRowsPerPass;
    *reinterpret_cast<uint4*>(tile + r * (W + 8) + c * 8) = v[p];
    if (rnorm) {
      float f[8];
      unpack8(*reinterpret_cast<const Bf16x8*>(&v[p]), f);
      float ss = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += f[e] * f[e];
#pragma unroll
      for (int o = kCpr / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (c == 0) rnorm[r] = scale * rsqrtf(ss + 1e-6f);
    }
  }
}

// A chunk's raw gates in warp 0's registers: lane l holds rows 2l and 2l + 1; rows >= L get g = beta = 0.
struct GateRegs {
  float g0, g1, b0, b1;
};
__device__ __forceinline__ GateRegs fetch_gates(const void* g, const void* beta, bool g_bf16, bool b_bf16, int64_t t0,
                                                int L, int nv, int h) {
  const int r0 = 2 * (threadIdx.x % 32), r1 = r0 + 1;
  GateRegs v;
  v.g0 = r0 < L ? load_gate(g, g_bf16, (t0 + r0) * nv + h) : 0.f;
  v.g1 = r1 < L ? load_gate(g, g_bf16, (t0 + r1) * nv + h) : 0.f;
  v.b0 = r0 < L ? load_gate(beta, b_bf16, (t0 + r0) * nv + h) : 0.f;
  v.b1 = r1 < L ? load_gate(beta, b_bf16, (t0 + r1) * nv + h) : 0.f;
  return v;
}
// Warp 0: sG = inclusive cumsum of g over the chunk's rows, sBeta = beta.
__device__ __forceinline__ void store_gates(float* sG, float* sBeta, const GateRegs& v) {
  const int lane = threadIdx.x % 32;
  const int r0 = 2 * lane, r1 = r0 + 1;
  sBeta[r0] = v.b0;
  sBeta[r1] = v.b1;
  const float pair = v.g0 + v.g1;
  float incl = pair;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  sG[r0] = incl - pair + v.g0;
  sG[r1] = incl;
}
__device__ __forceinline__ void load_gates(float* sG, float* sBeta, const void* g, const void* beta, bool g_bf16,
                                           bool b_bf16, int64_t t0, int L, int nv, int h) {
  store_gates(sG, sBeta, fetch_gates(g, beta, g_bf16, b_bf16, t0, L, nv, h));
}

// Chunk id -> (first token t0, length L). Sequence s owns the ids [base(s), base(s) + ceil(len_s / 64)),
// base(s) = cu[s] / 64 + s: strictly increasing in s, with room for every chunk (a sequence starting
// mid-64 needs at most one more than floor), and base(nseq) = T / 64 + nseq ids in all. Some ids are
// unused: false. found: two ints of shared memory, dead once this returns.
__device__ bool find_chunk(const int32_t* __restrict__ cu, int nseq, int id, int64_t& t0, int& L, int* found) {
  if (threadIdx.x == 0) {
    int lo = 0, hi = nseq - 1;  // the largest s with base(s) <= id (base(0) = 0)
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (cu[mid] / kChunk + mid <= id) lo = mid; else hi = mid - 1;
    }
    const int begin = cu[lo], len = cu[lo + 1] - begin, c = id - (begin / kChunk + lo);
    found[0] = begin + c * kChunk;
    found[1] = c * kChunk < len ? min(kChunk, len - c * kChunk) : 0;
  }
  __syncthreads();
  t0 = found[0];
  L = found[1];
  return L > 0;
}

// X = (I + A)^-1 for the strictly lower 64 x 64 fp32 A (row stride kFStride); writes all of sX. Diagonal
// 16 x 16 blocks by forward substitution (one thread per column), then block (i, j), i > j, by distance
// d = i - j: X_ij = -X_ii sum_{j <= m < i} A_im X_mj, which reads only blocks of smaller distance.
__device__ void invert_unit_lower(const float* sA, float* sX, float* sT /* [3][16][16] */) {
  const int tid = threadIdx.x;
  for (int e = tid; e < kChunk * kChunk; e += kThreads) {
    const int r = e / kChunk, c = e % kChunk;
    if (r / 16 < c / 16) sX[r * kFStride + c] = 0.f;
  }
  if (tid < 64) {
    const int b = tid / 16, c = tid % 16;
    const float* Ab = sA + 16 * b * kFStride + 16 * b;
    float* Xb = sX + 16 * b * kFStride + 16 * b;
    float x[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      float v = r == c ? 1.f : 0.f;
#pragma unroll
      for (int m = 0; m < r; ++m) v -= Ab[r * kFStride + m] * x[m];  // x[m] = 0 for m < c
      x[r] = v;
      Xb[r * kFStride + c] = v;
    }
  }
  __syncthreads();
  for (int d = 1; d < 4; ++d) {
    const int n = (4 - d) * 256;  // (4 - d) blocks of 256 elements
    for (int e = tid; e < n; e += kThreads) {
      const int p = e / 256, r = (e / 16) % 16, c = e % 16, j = p, i = p + d;
      const float* Arow = sA + (16 * i + r) * kFStride;
      float acc = 0.f;
      for (int m = 16 * j; m < 16 * i; ++m) acc += Arow[m] * sX[m * kFStride + 16 * j + c];
      sT[p * 256 + r * 16 + c] = acc;
    }
    __syncthreads();
    for (int e = tid; e < n; e += kThreads) {
      const int p = e / 256, r = (e / 16) % 16, c = e % 16, j = p, i = p + d;
      const float* Xrow = sX + (16 * i + r) * kFStride + 16 * i;
      float acc = 0.f;
#pragma unroll
      for (int x = 0; x < 16; ++x) acc += Xrow[x] * sT[p * 256 + x * 16 + c];
      sX[(16 * i + r) * kFStride + 16 * j + c] = -acc;
    }
    __syncthreads();
  }
}

// sX shares its bytes with sK (K is dead once K K^T is in registers): 37888 B at P = 128, so that 6 blocks
// fill sm_90's 228 KB per SM (1 KB reserved per block) where 4 did with separate tiles and a 17-float sT
// stride; find_chunk's two ints sit in the unused padding of sK's row 0 (no static shared memory).
template <int P> struct PrepSmem {
  static constexpr size_t kK = size_t(kChunk) * (P + 8) * 2;
  static constexpr size_t kMat = size_t(kChunk) * kFStride * 4;
  static constexpr size_t kKX = kK > kMat ? kK : kMat;  // sK, later sX
  static constexpr size_t kT = 3 * 16 * 16 * 4;
  static constexpr size_t kBytes = kKX + kMat + kT + 3 * kChunk * 4;
};
static_assert(6 * (PrepSmem<128>::kBytes + 1024) <= 228 * 1024, "gdr_prepare: 6 blocks per SM on sm_90");

// One block per (chunk id, value head): X of that chunk into xw [T, nv, 64] (rows of the chunk's tokens).
template <int P>
__global__ void __launch_bounds__(kThreads)
    gdr_prepare_kernel(__nv_bfloat16* __restrict__ xw, const __nv_bfloat16* __restrict__ qkv, const void* g,
                       const void* beta, bool g_bf16, bool b_bf16, const int32_t* __restrict__ cu, int nseq, int nk,
                       int dk, int nv, int64_t row) {
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem);    // [64][P + 8]
  float* sX = reinterpret_cast<float*>(smem);                      // [64][65], over sK after K K^T
  float* sA = reinterpret_cast<float*>(smem + PrepSmem<P>::kKX);  // [64][65]
  float* sT = sA + kChunk * kFStride;                              // [3][16][16]
  float* sG = sT + 3 * 16 * 16;
  float* sBeta = sG + kChunk;
  float* sRk = sBeta + kChunk;

  int64_t t0;
  int L;
  if (!find_chunk(cu, nseq, blockIdx.x, t0, L, reinterpret_cast<int*>(sK + P))) return;
  const int h = blockIdx.y, kh = h / (nv / nk);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t4 = lane % 4;

  GateRegs gv{};  // the gate loads in flight with the key tile's
  if (warp == 0) gv = fetch_gates(g, beta, g_bf16, b_bf16, t0, L, nv, h);
  load_tile<P>(sK, qkv + t0 * row + int64_t(nk + kh) * dk, row, L, dk, sRk, 1.f);
  if (warp == 0) store_gates(sG, sBeta, gv);
  __syncthreads();

  // K K^T for this warp's 16 rows against the key tiles at or left of them (the rest of A is zero).
  float acc[8][4];
  causal_rows_nk<P>(acc, sK, sK, warp, lane);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = 16 * warp + gr + 8 * hh;
    const float fr = sBeta[r] * sRk[r], Gr = sG[r];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = 8 * n + 2 * t4 + e;
        sA[r * kFStride + j] = j < r ? fr * sRk[j] * __expf(Gr - sG[j]) * acc[n][2 * hh + e] : 0.f;
      }
  }
  __syncthreads();

  invert_unit_lower(sA, sX, sT);

  for (int e = threadIdx.x; e < kChunk * 8; e += kThreads) {
    const int r = e / 8, c = (e % 8) * 8;
    if (r >= L) continue;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = sX[r * kFStride + c + i];
    *reinterpret_cast<Bf16x8*>(xw + ((t0 + r) * nv + h) * kChunk + c) = pack8(v);
  }
}
// Shared memory of a scan block: sQ and kKStages x sK ([64][P + 8] bf16), sX, sV, sVn, sVs ([64][72] bf16),
// the bf16 state sS ([P][72]), kKStages x (sG, sBeta) and sRq, sRk (64 fp32 each). The synchronous scan
// has one stage; the pipelined one two of K and of the gates (the next chunk's land in the other).
template <int P, int kKStages> struct ScanSmem {
  static constexpr size_t kQK = size_t(kChunk) * (P + 8) * 2;    // sQ, and each sK stage
  static constexpr size_t k64 = size_t(kChunk) * kStride64 * 2;  // one of sX, sV, sVn, sVs
  static constexpr size_t kS = size_t(P) * kStride64 * 2;
  static constexpr size_t kBytes = (1 + kKStages) * kQK + 4 * k64 + kS + (2 * kKStages + 2) * kChunk * 4;
};
template <int P> using SyncSmem = ScanSmem<P, 1>;
template <int P> using PipeSmem = ScanSmem<P, 2>;

// A scan block's work: sequence s (tokens [seq0, seq0 + len)), value head h (key head kh) and its
// 64-column slice [col0, col0 + vcols) of dv.
struct ScanBlock {
  int s, h, kh, col0, vcols;
  int64_t seq0;
  int len;
};
__device__ __forceinline__ ScanBlock scan_block(const int32_t* __restrict__ cu, int nk, int nv, int dv, int slices) {
  const int s = blockIdx.x, h = blockIdx.y / slices, slice = blockIdx.y % slices, kh = h / (nv / nk);
  const int col0 = slice * kBV, vcols = min(kBV, dv - col0);
  return {s, h, kh, col0, vcols, cu[s], cu[s + 1] - cu[s]};
}

// ---- the phases of a scan chunk, shared by both scan kernels ---------------------------------------------
// Each is force-inlined into the kernel and takes the fragments by reference, so they stay in the kernel's
// registers. A thread's place in the fragments: warp w owns chunk rows [16 w, 16 w + 16) and dk rows
// [P/4 w, P/4 (w + 1)) of the state; the thread's chunk rows are r_lo = 16 w + gr and r_lo + 8 (gr =
// lane / 4), its columns 8 n + 2 t4 + {0, 1} (t4 = lane % 4). The kernel computes warp, lane, gr, t4 and
// r_lo once and hands them in as plain ints. Both kernels compile to the SASS they had with the phases
// written out (cuobjdump, sm_90a: the synchronous scan identical, the pipelined one up to 6 instructions
// in another order; same registers, no stack). That holds only as written: helpers that derived r_lo
// themselves, or took these in a struct, and r_lo declared above the pipelined scan's first-chunk loads,
// each gave that kernel at P = 128 (255 registers) a 64-byte stack frame.

// The state slice S [P][64] (fp32 fragments, P / 64 m-tiles per warp) and its bf16 copy sS, zeroed.
template <int P>
__device__ __forceinline__ void zero_state(float (&S)[P / 64][8][4], __nv_bfloat16* sS) {
#pragma unroll
  for (int mi = 0; mi < P / 64; ++mi) zero_acc(S[mi]);
  for (int e = threadIdx.x; e < P * kStride64 / 8; e += kThreads)
    reinterpret_cast<uint4*>(sS)[e] = make_uint4(0u, 0u, 0u, 0u);
}

// (1) K S and Q S for the warp's 16 rows (64 columns of the slice); the B fragments of S serve both.
template <int P>
__device__ __forceinline__ void state_products(float (&ks)[8][4], float (&qs)[8][4], const __nv_bfloat16* sQ,
                                               const __nv_bfloat16* sK, const __nv_bfloat16* sS, int warp, int lane) {
  zero_acc(ks);
  zero_acc(qs);
#pragma unroll
  for (int kk = 0; kk < P / 16; ++kk) {
    uint32_t ak[4], aq[4];
    ldmatrix_x4(ak, a_rowmajor(sK, P + 8, 16 * warp, 16 * kk, lane));
    ldmatrix_x4(aq, a_rowmajor(sQ, P + 8, 16 * warp, 16 * kk, lane));
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_kn(sS, kStride64, 16 * kk, 16 * np, lane));
      mma_bf16(ks[2 * np], ak, b[0], b[1]);
      mma_bf16(ks[2 * np + 1], ak, b[2], b[3]);
      mma_bf16(qs[2 * np], aq, b[0], b[1]);
      mma_bf16(qs[2 * np + 1], aq, b[2], b[3]);
    }
  }
}

// R = beta (v - e^G rk K S) over v in place (each thread rewrites the elements it read); qs becomes the
// output accumulator e^G rq Q S.
__device__ __forceinline__ void residual_in_place(__nv_bfloat16* sV, const float (&ks)[8][4], float (&qs)[8][4],
                                                  const float* sG, const float* sBeta, const float* sRq,
                                                  const float* sRk, int r_lo, int t4) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = r_lo + 8 * hh;
    const float eg = __expf(sG[r]), fk = eg * sRk[r], fq = eg * sRq[r], b = sBeta[r];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      __nv_bfloat16* pv = sV + r * kStride64 + 8 * n + 2 * t4;
      const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(pv));
      store_bf16x2(pv, b * (v.x - fk * ks[n][2 * hh]), b * (v.y - fk * ks[n][2 * hh + 1]));
      qs[n][2 * hh] *= fq;
      qs[n][2 * hh + 1] *= fq;
    }
  }
}

// (2) P[r][j] = rq_r [rk_j] e^{G_r - G_j} (q_r . k_j) for j <= r (the causal mask with the decay), from
// p = Q K^T (causal_rows_nk) to the bf16 A fragments of (4). kRkJ: rk_j is applied here (the synchronous
// scan); the pipelined scan moves it into v_new (sVn holds rk_j v_new[j]) so that every norm is read by
// its own row's warp.
template <bool kRkJ>
__device__ __forceinline__ void mask_qk(uint32_t (&pa)[4][4], float (&p)[8][4], const float* sG, const float* sRq,
                                        const float* sRk, int r_lo, int t4) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = r_lo + 8 * hh;
    const float fr = sRq[r], Gr = sG[r];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = 8 * n + 2 * t4 + e;
        p[n][2 * hh + e] = j <= r ? (kRkJ ? fr * sRk[j] : fr) * __expf(Gr - sG[j]) * p[n][2 * hh + e] : 0.f;
      }
  }
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    pa[kc][0] = pack_bf16(p[2 * kc][0], p[2 * kc][1]);
    pa[kc][1] = pack_bf16(p[2 * kc][2], p[2 * kc][3]);
    pa[kc][2] = pack_bf16(p[2 * kc + 1][0], p[2 * kc + 1][1]);
    pa[kc][3] = pack_bf16(p[2 * kc + 1][2], p[2 * kc + 1][3]);
  }
}

// acc += a · B over k-step kc (16 rows of a [64][72] tile, all 64 columns): the products with the X R
// shape, (3) and (4).
__device__ __forceinline__ void mma_step_kn(float (&acc)[8][4], const uint32_t (&a)[4], const __nv_bfloat16* sB,
                                            int kc, int lane) {
#pragma unroll
  for (int np = 0; np < 4; ++np) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, b_kn(sB, kStride64, 16 * kc, 16 * np, lane));
    mma_bf16(acc[2 * np], a, b[0], b[1]);
    mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
  }
}

// (3) v_new = X R for the warp's rows (X is lower triangular: only R rows up to the warp's last).
__device__ __forceinline__ void x_times_r(float (&vn)[8][4], const __nv_bfloat16* sX, const __nv_bfloat16* sV,
                                          int warp, int lane) {
  zero_acc(vn);
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    if (kc > warp) break;
    uint32_t a[4];
    ldmatrix_x4(a, a_rowmajor(sX, kStride64, 16 * warp, 16 * kc, lane));
    mma_step_kn(vn, a, sV, kc, lane);
  }
}
// v_new of the warp's rows into sVn, the B operand of (4) (kRkVn: times rk, see mask_qk), and
// rk e^{G_last - G} v_new into sVs, the B operand of (5).
template <bool kRkVn>
__device__ __forceinline__ void store_v_new(__nv_bfloat16* sVn, __nv_bfloat16* sVs, const float (&vn)[8][4],
                                            const float* sG, const float* sRk, int r_lo, int t4) {
  const float G_last = sG[kChunk - 1];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = r_lo + 8 * hh;
    const float fn = sRk[r], fs = fn * __expf(G_last - sG[r]);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const int o = r * kStride64 + 8 * n + 2 * t4;
      if constexpr (kRkVn) store_bf16x2(sVn + o, fn * vn[n][2 * hh], fn * vn[n][2 * hh + 1]);
      else store_bf16x2(sVn + o, vn[n][2 * hh], vn[n][2 * hh + 1]);
      store_bf16x2(sVs + o, fs * vn[n][2 * hh], fs * vn[n][2 * hh + 1]);
    }
  }
}

// (4) out = e^G rq Q S + P v_new (qs holds the first term on entry), rows r < L and columns inside dv.
__device__ __forceinline__ void store_output(__nv_bfloat16* __restrict__ out, float (&qs)[8][4],
                                             const uint32_t (&pa)[4][4], const __nv_bfloat16* sVn, int64_t t0, int L,
                                             int nv, int dv, int h, int col0, int vcols, int warp, int lane,
                                             int r_lo, int t4) {
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    if (kc > warp) break;
    mma_step_kn(qs, pa[kc], sVn, kc, lane);
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = r_lo + 8 * hh;
    if (r >= L) continue;
    __nv_bfloat16* po = out + (t0 + r) * int64_t(nv) * dv + int64_t(h) * dv + col0;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const int c = 8 * n + 2 * t4;
      if (c < vcols) store_bf16x2(po + c, qs[n][2 * hh], qs[n][2 * hh + 1]);
    }
  }
}

// (5) S = e^{G_last} S + K^T (rk e^{G_last - G} v_new) for the warp's dk rows; then its bf16 copy (every
// warp finished reading sS in (1), before the barrier after (2)).
template <int P>
__device__ __forceinline__ void update_state(float (&S)[P / 64][8][4], __nv_bfloat16* sS, const __nv_bfloat16* sK,
                                             const __nv_bfloat16* sVs, const float* sG, int warp, int lane, int gr,
                                             int t4) {
  constexpr int kMT = P / 64;
  const float decay = __expf(sG[kChunk - 1]);
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) S[mi][n][e] *= decay;
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    uint32_t a[kMT][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
      ldmatrix_x4_trans(a[mi], a_km(sK, P + 8, 16 * kc, 16 * (warp * kMT + mi), lane));
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_kn(sVs, kStride64, 16 * kc, 16 * np, lane));
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
        mma_bf16(S[mi][2 * np], a[mi], b[0], b[1]);
        mma_bf16(S[mi][2 * np + 1], a[mi], b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = 16 * (warp * kMT + mi) + gr + 8 * hh;
#pragma unroll
      for (int n = 0; n < 8; ++n)
        store_bf16x2(sS + r * kStride64 + 8 * n + 2 * t4, S[mi][n][2 * hh], S[mi][n][2 * hh + 1]);
    }
}

// The final state of the last sequence into `state` (zero when the sequence is empty), as the CPU leaves it.
template <int P>
__device__ __forceinline__ void store_final_state(float* __restrict__ state, const float (&S)[P / 64][8][4], int h,
                                                  int dk, int dv, int col0, int vcols, int warp, int gr, int t4) {
  constexpr int kMT = P / 64;
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = 16 * (warp * kMT + mi) + gr + 8 * hh;
      if (r >= dk) continue;
      float* ps = state + (int64_t(h) * dk + r) * dv + col0;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * n + 2 * t4 + e;
          if (c < vcols) ps[c] = S[mi][n][2 * hh + e];
        }
    }
}

// One block per (sequence, value head, 64-column slice of dv): the chunks of the sequence in order, each
// chunk's tiles loaded synchronously (the row norms reduced on the way in), 4 barriers per chunk.
template <int P>
__global__ void __launch_bounds__(kThreads, 2)
    gdr_chunk_scan_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ state,
                          const __nv_bfloat16* __restrict__ qkv, const __nv_bfloat16* __restrict__ xw, const void* g,
                          const void* beta, bool g_bf16, bool b_bf16, const int32_t* __restrict__ cu, int nseq,
                          int nk, int dk, int nv, int dv, int slices, int64_t row, float q_scale) {
  constexpr int kRow = P + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem);  // [64][P + 8] raw q
  __nv_bfloat16* sK = sQ + kChunk * kRow;                      // [64][P + 8] raw k
  __nv_bfloat16* sX = sK + kChunk * kRow;                      // [64][72] X
  __nv_bfloat16* sV = sX + kChunk * kStride64;                 // [64][72] v, then R in place
  __nv_bfloat16* sVn = sV + kChunk * kStride64;                // [64][72] v_new
  __nv_bfloat16* sVs = sVn + kChunk * kStride64;               // [64][72] rk e^{G_last-G} v_new
  __nv_bfloat16* sS = sVs + kChunk * kStride64;                // [P][72] bf16 state
  float* sG = reinterpret_cast<float*>(sS + P * kStride64);
  float* sBeta = sG + kChunk;
  float* sRq = sBeta + kChunk;
  float* sRk = sRq + kChunk;

  const auto [s, h, kh, col0, vcols, seq0, len] = scan_block(cu, nk, nv, dv, slices);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t4 = lane % 4;

  float S[P / 64][8][4];
  zero_state<P>(S, sS);
  const int r_lo = 16 * warp + gr;  // this thread's rows of the chunk: r_lo and r_lo + 8
  for (int c0 = 0; c0 < len; c0 += kChunk) {
    const int L = min(kChunk, len - c0);
    const int64_t t0 = seq0 + c0;
    const __nv_bfloat16* src = qkv + t0 * row;
    load_tile<P>(sQ, src + int64_t(kh) * dk, row, L, dk, sRq, q_scale);
    load_tile<P>(sK, src + int64_t(nk + kh) * dk, row, L, dk, sRk, 1.f);
    load_tile<kChunk>(sX, xw + (t0 * nv + h) * kChunk, int64_t(nv) * kChunk, L, kChunk, nullptr, 0.f);
    load_tile<kChunk>(sV, src + int64_t(2 * nk) * dk + int64_t(h) * dv + col0, row, L, vcols, nullptr, 0.f);
    if (warp == 0) load_gates(sG, sBeta, g, beta, g_bf16, b_bf16, t0, L, nv, h);
    __syncthreads();  // tiles, norms, gates, and sS from the previous chunk

    float ks[8][4], qs[8][4];
    state_products<P>(ks, qs, sQ, sK, sS, warp, lane);  // (1)
    residual_in_place(sV, ks, qs, sG, sBeta, sRq, sRk, r_lo, t4);
    uint32_t pa[4][4];
    {  // (2)
      float p[8][4];
      causal_rows_nk<P>(p, sQ, sK, warp, lane);
      mask_qk<true>(pa, p, sG, sRq, sRk, r_lo, t4);
    }
    __syncthreads();  // R complete

    {  // (3)
      float vn[8][4];
      x_times_r(vn, sX, sV, warp, lane);
      store_v_new<false>(sVn, sVs, vn, sG, sRk, r_lo, t4);
    }
    __syncthreads();  // v_new complete

    store_output(out, qs, pa, sVn, t0, L, nv, dv, h, col0, vcols, warp, lane, r_lo, t4);  // (4)
    update_state<P>(S, sS, sK, sVs, sG, warp, lane, gr, t4);                            // (5)
    __syncthreads();  // sS written; every tile read before the next chunk's loads overwrite it
  }
  if (s == nseq - 1) store_final_state<P>(state, S, h, dk, dv, col0, vcols, warp, gr, t4);
}

// gdr_chunk_scan_kernel with the next chunk's tiles loaded by cp.async while the current one computes.
// Which warps read what decides where each load can go:
//   - Q rows [16 w, 16 w + 16) and X rows of the same range are read only by warp w (A operands of (1), (2)
//     and (3)): warp w copies its own rows of the next chunk as soon as it has done with them (Q after (2),
//     X after (3)), no block barrier needed, and waits for them with cp.async.wait_group + __syncwarp;
//   - V rows of warp w are read by warp w (R, in place) and then, as R, by every warp at or below it in (3):
//     the next V goes in after the barrier that ends (3), by the owning warp;
//   - K is read by every warp up to (5): two stages, the next chunk's K issued at the top of the chunk;
//   - the gates of the next chunk are loaded into warp 0's registers at the top and scanned into the other
//     stage of sG / sBeta at the end.
// The row norms of q and k come from shared memory after arrival: warp w reduces its own 16 rows, and every
// use of a norm is by its own row's warp once rk_j moves from the masked Q K^T (2) into v_new (sVn holds
// rk_j v_new[j]). Barriers per chunk: 3 (tiles + state, R complete, v_new complete).
// Groups, per thread, committed in this order each chunk: K(next) at the top, Q(next) after (2), X(next)
// after (3), V(next) after the v_new barrier (empty groups past the last chunk). At the top of a chunk
// wait_group 2 leaves the X and V of that chunk in flight; before R wait_group 1 leaves only K(next).
template <int P>
__global__ void __launch_bounds__(kThreads, 2)
    gdr_chunk_scan_pipelined_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ state,
                                    const __nv_bfloat16* __restrict__ qkv, const __nv_bfloat16* __restrict__ xw,
                                    const void* g, const void* beta, bool g_bf16, bool b_bf16,
                                    const int32_t* __restrict__ cu, int nseq, int nk, int dk, int nv, int dv,
                                    int slices, int64_t row, float q_scale) {
  constexpr int kRow = P + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem);  // [64][P + 8] raw q
  __nv_bfloat16* sKb = sQ + kChunk * kRow;                     // 2 x [64][P + 8] raw k
  __nv_bfloat16* sX = sKb + 2 * kChunk * kRow;                 // [64][72] X
  __nv_bfloat16* sV = sX + kChunk * kStride64;                 // [64][72] v, then R in place
  __nv_bfloat16* sVn = sV + kChunk * kStride64;                // [64][72] rk v_new
  __nv_bfloat16* sVs = sVn + kChunk * kStride64;               // [64][72] rk e^{G_last-G} v_new
  __nv_bfloat16* sS = sVs + kChunk * kStride64;                // [P][72] bf16 state
  float* sGb = reinterpret_cast<float*>(sS + P * kStride64);   // 2 x [64]
  float* sBb = sGb + 2 * kChunk;                               // 2 x [64]
  float* sRq = sBb + 2 * kChunk;
  float* sRk = sRq + kChunk;

  const auto [s, h, kh, col0, vcols, seq0, len] = scan_block(cu, nk, nv, dv, slices);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t4 = lane % 4;
  const int64_t ldx = int64_t(nv) * kChunk;
  const __nv_bfloat16* qsrc = qkv + int64_t(kh) * dk;
  const __nv_bfloat16* ksrc = qkv + int64_t(nk + kh) * dk;
  const __nv_bfloat16* vsrc = qkv + int64_t(2 * nk) * dk + int64_t(h) * dv + col0;
  const __nv_bfloat16* xsrc = xw + int64_t(h) * kChunk;
  const int w0 = 16 * warp;  // this warp's rows of the chunk

  float S[P / 64][8][4];
  zero_state<P>(S, sS);
  if (len > 0) {  // the first chunk's groups: K, Q, X, V; its gates
    const int L = min(kChunk, len);
    async_rows<P, kChunk, kThreads>(sKb, ksrc + seq0 * row, row, 0, L, dk, threadIdx.x);
    cp_async_commit();
    async_rows<P, 16, 32>(sQ, qsrc + seq0 * row, row, w0, L, dk, lane);
    cp_async_commit();
    async_rows<kChunk, 16, 32>(sX, xsrc + seq0 * ldx, ldx, w0, L, kChunk, lane);
    cp_async_commit();
    async_rows<kChunk, 16, 32>(sV, vsrc + seq0 * row, row, w0, L, vcols, lane);
    cp_async_commit();
    if (warp == 0) store_gates(sGb, sBb, fetch_gates(g, beta, g_bf16, b_bf16, seq0, L, nv, h));
  }

  // This thread's rows of the chunk: r_lo and r_lo + 8. Declared after the first chunk's loads: above
  // them, ptxas gives this kernel a 64-byte stack frame at P = 128 (see the phases' comment).
  const int r_lo = w0 + gr;
  for (int c0 = 0, it = 0; c0 < len; c0 += kChunk, ++it) {
    const int L = min(kChunk, len - c0);
    const int64_t t0 = seq0 + c0, t1 = t0 + kChunk;
    const int L1 = min(kChunk, len - c0 - kChunk);  // the next chunk's length, <= 0 past the last
    const int p = it & 1;
    const __nv_bfloat16* sK = sKb + p * kChunk * kRow;
    const float* sG = sGb + p * kChunk;
    const float* sBeta = sBb + p * kChunk;

    cp_async_wait<2>();  // this chunk's K and this warp's Q rows have landed
    __syncthreads();     // K, gates and sS visible to all; every read of the other K stage is done
    if (L1 > 0) async_rows<P, kChunk, kThreads>(sKb + (p ^ 1) * kChunk * kRow, ksrc + t1 * row, row, 0, L1, dk, threadIdx.x);
    cp_async_commit();
    GateRegs ng{};
    if (warp == 0 && L1 > 0) ng = fetch_gates(g, beta, g_bf16, b_bf16, t1, L1, nv, h);

    // Row norms of this warp's 16 rows of q and k: lane l sums half a row (row l % 16, half l / 16).
    {
      const int r = w0 + (lane & 15), c = (lane >> 4) * (P / 2);
      float sq = 0.f, sk = 0.f;
#pragma unroll
      for (int i = 0; i < P / 16; ++i) {
        float f[8];
        unpack8(*reinterpret_cast<const Bf16x8*>(sQ + r * kRow + c + 8 * i), f);
#pragma unroll
        for (int e = 0; e < 8; ++e) sq += f[e] * f[e];
        unpack8(*reinterpret_cast<const Bf16x8*>(sK + r * kRow + c + 8 * i), f);
#pragma unroll
        for (int e = 0; e < 8; ++e) sk += f[e] * f[e];
      }
      sq += __shfl_xor_sync(0xffffffffu, sq, 16);
      sk += __shfl_xor_sync(0xffffffffu, sk, 16);
      if (lane < 16) {
        sRq[r] = q_scale * rsqrtf(sq + 1e-6f);
        sRk[r] = rsqrtf(sk + 1e-6f);
      }
    }

    float ks[8][4], qs[8][4];
    state_products<P>(ks, qs, sQ, sK, sS, warp, lane);  // (1)
    cp_async_wait<1>();  // this warp's X and V rows have landed (only K(next) may be in flight)
    __syncwarp();        // ... for every lane of the warp, as have the norms
    residual_in_place(sV, ks, qs, sG, sBeta, sRq, sRk, r_lo, t4);
    uint32_t pa[4][4];
    {  // (2), rk_j left to sVn
      float p[8][4];
      causal_rows_nk<P>(p, sQ, sK, warp, lane);
      mask_qk<false>(pa, p, sG, sRq, sRk, r_lo, t4);
    }
    __syncwarp();  // every lane's reads of this warp's Q rows are done: the next chunk's go in
    if (L1 > 0) async_rows<P, 16, 32>(sQ, qsrc + t1 * row, row, w0, L1, dk, lane);
    cp_async_commit();
    __syncthreads();  // R complete

    {  // (3)
      float vn[8][4];
      x_times_r(vn, sX, sV, warp, lane);
      __syncwarp();  // this warp's X rows are read: the next chunk's go in
      if (L1 > 0) async_rows<kChunk, 16, 32>(sX, xsrc + t1 * ldx, ldx, w0, L1, kChunk, lane);
      cp_async_commit();
      store_v_new<true>(sVn, sVs, vn, sG, sRk, r_lo, t4);
    }
    __syncthreads();  // v_new complete; every read of R (sV) done
    if (L1 > 0) async_rows<kChunk, 16, 32>(sV, vsrc + t1 * row, row, w0, L1, vcols, lane);
    cp_async_commit();

    store_output(out, qs, pa, sVn, t0, L, nv, dv, h, col0, vcols, warp, lane, r_lo, t4);  // (4), P (rk v_new)
    update_state<P>(S, sS, sK, sVs, sG, warp, lane, gr, t4);                            // (5)
    if (warp == 0 && L1 > 0) store_gates(sGb + (p ^ 1) * kChunk, sBb + (p ^ 1) * kChunk, ng);
  }
  if (s == nseq - 1) store_final_state<P>(state, S, h, dk, dv, col0, vcols, warp, gr, t4);
}

// The device's opt-in shared memory per block (227 KB on sm_90 and sm_100, 99 KB on sm_120), once per device.
int max_smem_per_block(int device) {
  static int cached[kMaxDevices] = {};
  if (cached[device] == 0) {
    int v = 0;
    DF_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cached[device] = v;
  }
  return cached[device];
}

// -1: not chosen yet (DFLASH_GDR_SCAN decides at the first call), else a GdrScan.
int g_scan_choice = -1;

GdrScan scan_choice() {
  if (g_scan_choice < 0) {
    const char* e = std::getenv("DFLASH_GDR_SCAN");
    g_scan_choice = static_cast<int>(e && std::strcmp(e, "sync") == 0 ? GdrScan::kSync : GdrScan::kAuto);
  }
  return static_cast<GdrScan>(g_scan_choice);
}

template <int P>
void launch(const Ctx& ctx, int device, const Tensor& out, const Tensor& state, const Tensor& qkv, const Tensor& g,
            const Tensor& beta, const Tensor& cu_seqlens, const Tensor& workspace, const ops::GdnHeads& hd, int nseq) {
  constexpr size_t kPrep = PrepSmem<P>::kBytes, kScan = SyncSmem<P>::kBytes, kPipe = PipeSmem<P>::kBytes;
  static_assert(kScan <= 99 * 1024 && kPrep <= 99 * 1024, "shared memory must fit sm_120's 99 KB per block");
  static_assert(2 * (kPipe + 1024) <= 228 * 1024, "the pipelined scan keeps 2 blocks per SM on sm_90 / sm_100");
  const size_t smem = static_cast<size_t>(max_smem_per_block(device));
  DF_CHECK(smem >= kScan, Internal,
           "gated_delta_rule_forward: the device offers " << smem << " B of shared memory per block, " << kScan
                                                          << " needed");
  const bool pipelined = smem >= kPipe && scan_choice() == GdrScan::kAuto;
  static bool configured[kMaxDevices] = {};  // the attribute is per device (context)
  if (!configured[device]) {
    DF_CUDA(cudaFuncSetAttribute(gdr_prepare_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(kPrep)));
    DF_CUDA(cudaFuncSetAttribute(gdr_chunk_scan_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(kScan)));
    if (smem >= kPipe)
      DF_CUDA(cudaFuncSetAttribute(gdr_chunk_scan_pipelined_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(kPipe)));
    configured[device] = true;
  }
  const int64_t T = qkv.size(0), row = qkv.size(1);
  const int nk = static_cast<int>(hd.nk), dk = static_cast<int>(hd.dk), nv = static_cast<int>(hd.nv),
            dv = static_cast<int>(hd.dv);
  const bool g_bf16 = g.dtype == DType::BF16, b_bf16 = beta.dtype == DType::BF16;
  const int32_t* cu = static_cast<const int32_t*>(cu_seqlens.data);
  auto* xw = static_cast<__nv_bfloat16*>(workspace.data);
  const auto* x = static_cast<const __nv_bfloat16*>(qkv.data);
  cudaStream_t st = stream_of(ctx);

  const int64_t ids = T / kChunk + nseq;
  gdr_prepare_kernel<P><<<dim3(static_cast<unsigned>(ids), static_cast<unsigned>(nv)), kThreads, kPrep, st>>>(
      xw, x, g.data, beta.data, g_bf16, b_bf16, cu, nseq, nk, dk, nv, row);
  DF_CUDA_LAUNCH();
  const int slices = (dv + kBV - 1) / kBV;
  const float q_scale = 1.f / sqrtf(static_cast<float>(dk));
  const dim3 grid(static_cast<unsigned>(nseq), static_cast<unsigned>(nv * slices));
  auto* o = static_cast<__nv_bfloat16*>(out.data);
  auto* sp = static_cast<float*>(state.data);
  if (pipelined) {
    gdr_chunk_scan_pipelined_kernel<P><<<grid, kThreads, kPipe, st>>>(o, sp, x, xw, g.data, beta.data, g_bf16, b_bf16,
                                                                      cu, nseq, nk, dk, nv, dv, slices, row, q_scale);
  } else {
    gdr_chunk_scan_kernel<P><<<grid, kThreads, kScan, st>>>(o, sp, x, xw, g.data, beta.data, g_bf16, b_bf16, cu, nseq,
                                                            nk, dk, nv, dv, slices, row, q_scale);
  }
  DF_CUDA_LAUNCH();
}

}  // namespace

void set_gated_delta_rule_scan(GdrScan scan) { g_scan_choice = static_cast<int>(scan); }

bool gated_delta_rule_scan_is_pipelined(const Ctx& ctx, ops::GdnHeads hd) {
  const int device = backend_of(ctx).device;
  const size_t need = hd.dk <= 64 && hd.dv <= 64 ? PipeSmem<64>::kBytes : PipeSmem<128>::kBytes;
  return scan_choice() == GdrScan::kAuto && static_cast<size_t>(max_smem_per_block(device)) >= need;
}

void gated_delta_rule_forward(const Ctx& ctx, const Tensor& out, const Tensor& state, const Tensor& qkv,
                              const Tensor& g, const Tensor& beta, const Tensor& cu_seqlens, ops::GdnHeads hd,
                              const Tensor& workspace) {
  constexpr const char* op = "gated_delta_rule_forward";
  const int device = backend_of(ctx).device;
  DF_CHECK(device >= 0 && device < kMaxDevices, Internal, op << ": device " << device);
  DF_CHECK(qkv.dtype == DType::BF16 && out.dtype == DType::BF16 && state.dtype == DType::F32, Internal,
           op << ": CUDA needs qkv and out BF16 and state F32, got " << dtype_name(qkv.dtype) << ", "
              << dtype_name(out.dtype) << ", " << dtype_name(state.dtype));
  DF_CHECK((g.dtype == DType::F32 || g.dtype == DType::BF16) && (beta.dtype == DType::F32 || beta.dtype == DType::BF16),
           Internal, op << ": g and beta must be F32 or BF16 on CUDA, got " << dtype_name(g.dtype) << ", "
                        << dtype_name(beta.dtype));
  DF_CHECK(hd.dk % 8 == 0 && hd.dv % 8 == 0 && hd.dk <= 128 && hd.dv <= 128, Internal,
           op << ": the CUDA kernels take head dims that are multiples of 8 up to 128, got dk=" << hd.dk
              << " dv=" << hd.dv);
  DF_CHECK(cu_seqlens.dtype == DType::I32 && cu_seqlens.device == Device::CUDA && cu_seqlens.ndim == 1 &&
               cu_seqlens.shape[0] >= 1,
           Internal, op << ": cu_seqlens must be an I32 vector in device memory on CUDA, got " << cu_seqlens.shape_str());
  const int64_t T = qkv.size(0);
  const int64_t need = ops::gated_delta_rule_workspace_elems(T, hd);
  DF_CHECK(!workspace.empty() && workspace.device == Device::CUDA && workspace.dtype == DType::BF16 &&
               static_cast<int64_t>(workspace.numel()) >= need,
           Internal, op << ": CUDA needs a BF16 device workspace of at least " << need << " elements (T=" << T << ", nv="
                        << hd.nv << "; ops::gated_delta_rule_workspace_elems), got " << workspace.shape_str() << " "
                        << dtype_name(workspace.dtype));
  DF_CHECK(aligned16(qkv.data) && aligned16(out.data) && aligned16(workspace.data), Internal,
           op << ": qkv, out and workspace must be 16-byte aligned");
  DF_CHECK(T < (int64_t(1) << 31) && hd.nv * 2 < 65536, Internal, op << ": T=" << T << " nv=" << hd.nv << " too large");
  const int nseq = static_cast<int>(cu_seqlens.shape[0]) - 1;
  if (nseq <= 0) return;  // nothing to run and no last sequence (T = 0)
  if (hd.dk <= 64 && hd.dv <= 64) {
    launch<64>(ctx, device, out, state, qkv, g, beta, cu_seqlens, workspace, hd, nseq);
  } else {
    launch<128>(ctx, device, out, state, qkv, g, beta, cu_seqlens, workspace, hd, nseq);
  }
}

}  // namespace dflash::cuda
