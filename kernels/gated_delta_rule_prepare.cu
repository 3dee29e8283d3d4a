// The chunked gated delta rule's first kernel; the math (A, X) is at the top of gated_delta_rule.cu.
//
// Kernel 1 (gdr_prepare, one block per (chunk, value head), all chunks in parallel): K K^T on the tensor
//   cores, A in fp32, X by blocked forward substitution in fp32 (16 x 16 diagonal blocks, then the
//   off-diagonal blocks by distance), X stored as bf16 (as FLA's solve_tril stores it). The fp32 X
//   reuses the key tile's bytes: 37 KB per block, 6 blocks per SM on sm_90.
#include <cuda_bf16.h>

#include "cuda_check.cuh"
#include "gated_delta_rule_common.cuh"

namespace dflash::cuda::gdr {
namespace {

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

}  // namespace

template <int P> void launch_prepare(const Args& a, int device, cudaStream_t st) {
  constexpr size_t kPrep = PrepSmem<P>::kBytes;
  static_assert(kPrep <= 99 * 1024, "shared memory must fit sm_120's 99 KB per block");
  fit_launch(gdr_prepare_kernel<P>, "gdr_prepare_kernel", kThreads, kPrep, device);
  const int64_t ids = a.T / kChunk + a.nseq;  // base(nseq) of find_chunk: every id, used or not
  gdr_prepare_kernel<P><<<dim3(static_cast<unsigned>(ids), static_cast<unsigned>(a.nv)), kThreads, kPrep, st>>>(
      a.xw, a.qkv, a.g, a.beta, a.g_bf16, a.b_bf16, a.cu, a.nseq, a.nk, a.dk, a.nv, a.row);
  DF_CUDA_LAUNCH();
}
// The two paddings gated_delta_rule_forward dispatches to.
template void launch_prepare<64>(const Args& a, int device, cudaStream_t st);
template void launch_prepare<128>(const Args& a, int device, cudaStream_t st);

}  // namespace dflash::cuda::gdr
