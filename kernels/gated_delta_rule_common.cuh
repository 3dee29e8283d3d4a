// Internal to the gated delta rule's CUDA kernels, not a public API (that is gated_delta_rule.cuh). Included
// by gated_delta_rule.cu (the entry point), gated_delta_rule_prepare.cu (kernel 1) and
// gated_delta_rule_scan.cu (kernel 2): the chunk geometry, the device helpers both kernels use (fragment
// addresses, the causal product, tile and gate loads), the scan's shared-memory sizes (the entry point
// picks the scan by them) and the two launchers. Everything here is a constant, a type, a template or
// inline, so several .cu files can include it.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "bf16_util.cuh"
#include "device_limits.cuh"
#include "mma_ptx.cuh"

namespace dflash::cuda::gdr {
using namespace ptx;  // the shared PTX wrappers (mma_ptx.cuh)

constexpr int kChunk = 64;                // tokens per chunk (FLA's BT)
constexpr int kWarps = 4;                 // warp w owns chunk rows [16 w, 16 w + 16)
constexpr int kThreads = kWarps * 32;
constexpr int kBV = 64;                   // value columns per scan block
constexpr int kStride64 = kChunk + 8;     // bf16 row stride of 64-wide tiles: +16 B keeps ldmatrix conflict-free
constexpr int kFStride = kChunk + 1;      // fp32 row stride of the 64 x 64 solve matrices

// Shared memory of a scan block (here rather than in gated_delta_rule_scan.cu: the entry point chooses the
// scan by these sizes): sQ and kKStages x sK ([64][P + 8] bf16), sX, sV, sVn, sVs ([64][72] bf16),
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

// Lane addresses of the ldmatrix x4 forms the kernels use (tile row stride `stride` elements). With the mma
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

// ---- host side ---------------------------------------------------------------------------------------------

// The operands of one forward as the kernels take them, from the tensors gated_delta_rule_forward checked.
struct Args {
  __nv_bfloat16* out;        // [T, nv * dv]
  float* state;              // [nv, dk, dv]
  const __nv_bfloat16* qkv;  // [T, row]: q | k | v per token
  __nv_bfloat16* xw;         // the workspace: X, [T, nv, 64]
  const void* g;             // [T, nv], F32 or BF16 (g_bf16)
  const void* beta;          // [T, nv], F32 or BF16 (b_bf16)
  bool g_bf16, b_bf16;
  const int32_t* cu;         // cu_seqlens [nseq + 1], device memory
  int nseq, nk, dk, nv, dv;
  int64_t T, row;            // tokens; qkv's row stride in elements
};

// The device's opt-in shared memory per block (device_limits.cuh).
inline size_t max_smem_per_block(int device) { return device_limits(device).smem_per_block_optin; }

// Kernel 1 (gated_delta_rule_prepare.cu): X of every chunk into a.xw. P = 64 or 128, the padded head dim.
template <int P> void launch_prepare(const Args& a, int device, cudaStream_t st);
// Kernel 2 (gated_delta_rule_scan.cu): out and the final state from X; pipelined: gdr_chunk_scan_pipelined
// (the caller checked that the device offers PipeSmem<P>::kBytes per block), else gdr_chunk_scan.
template <int P> void launch_chunk_scan(const Args& a, int device, bool pipelined, cudaStream_t st);

}  // namespace dflash::cuda::gdr
