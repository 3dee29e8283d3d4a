// The chunked gated delta rule's second kernel, in two versions; the math (R, v_new, out, S') is at the top
// of gated_delta_rule.cu.
//
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
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda_check.cuh"
#include "gated_delta_rule_common.cuh"

namespace dflash::cuda::gdr {
namespace {

__device__ __forceinline__ void store_bf16x2(__nv_bfloat16* p, float lo, float hi) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(lo, hi);
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
    cp_async16_clobber(smem_addr(tile + r * (W + 8) + c * 8), ok ? src + r * ld + c * 8 : src, ok ? 16 : 0);
  }
}

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
    cp_async_commit_clobber();
    async_rows<P, 16, 32>(sQ, qsrc + seq0 * row, row, w0, L, dk, lane);
    cp_async_commit_clobber();
    async_rows<kChunk, 16, 32>(sX, xsrc + seq0 * ldx, ldx, w0, L, kChunk, lane);
    cp_async_commit_clobber();
    async_rows<kChunk, 16, 32>(sV, vsrc + seq0 * row, row, w0, L, vcols, lane);
    cp_async_commit_clobber();
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

    cp_async_wait_clobber<2>();  // this chunk's K and this warp's Q rows have landed
    __syncthreads();             // K, gates and sS visible to all; every read of the other K stage is done
    if (L1 > 0) async_rows<P, kChunk, kThreads>(sKb + (p ^ 1) * kChunk * kRow, ksrc + t1 * row, row, 0, L1, dk, threadIdx.x);
    cp_async_commit_clobber();
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
    cp_async_wait_clobber<1>();  // this warp's X and V rows have landed (only K(next) may be in flight)
    __syncwarp();                // ... for every lane of the warp, as have the norms
    residual_in_place(sV, ks, qs, sG, sBeta, sRq, sRk, r_lo, t4);
    uint32_t pa[4][4];
    {  // (2), rk_j left to sVn
      float p[8][4];
      causal_rows_nk<P>(p, sQ, sK, warp, lane);
      mask_qk<false>(pa, p, sG, sRq, sRk, r_lo, t4);
    }
    __syncwarp();  // every lane's reads of this warp's Q rows are done: the next chunk's go in
    if (L1 > 0) async_rows<P, 16, 32>(sQ, qsrc + t1 * row, row, w0, L1, dk, lane);
    cp_async_commit_clobber();
    __syncthreads();  // R complete

    {  // (3)
      float vn[8][4];
      x_times_r(vn, sX, sV, warp, lane);
      __syncwarp();  // this warp's X rows are read: the next chunk's go in
      if (L1 > 0) async_rows<kChunk, 16, 32>(sX, xsrc + t1 * ldx, ldx, w0, L1, kChunk, lane);
      cp_async_commit_clobber();
      store_v_new<true>(sVn, sVs, vn, sG, sRk, r_lo, t4);
    }
    __syncthreads();  // v_new complete; every read of R (sV) done
    if (L1 > 0) async_rows<kChunk, 16, 32>(sV, vsrc + t1 * row, row, w0, L1, vcols, lane);
    cp_async_commit_clobber();

    store_output(out, qs, pa, sVn, t0, L, nv, dv, h, col0, vcols, warp, lane, r_lo, t4);  // (4), P (rk v_new)
    update_state<P>(S, sS, sK, sVs, sG, warp, lane, gr, t4);                            // (5)
    if (warp == 0 && L1 > 0) store_gates(sGb + (p ^ 1) * kChunk, sBb + (p ^ 1) * kChunk, ng);
  }
  if (s == nseq - 1) store_final_state<P>(state, S, h, dk, dv, col0, vcols, warp, gr, t4);
}

}  // namespace

template <int P> void launch_chunk_scan(const Args& a, int device, bool pipelined, cudaStream_t st) {
  constexpr size_t kScan = SyncSmem<P>::kBytes, kPipe = PipeSmem<P>::kBytes;
  static_assert(kScan <= 99 * 1024, "shared memory must fit sm_120's 99 KB per block");
  static_assert(2 * (kPipe + 1024) <= 228 * 1024, "the pipelined scan keeps 2 blocks per SM on sm_90 / sm_100");
  if (pipelined)
    fit_launch(gdr_chunk_scan_pipelined_kernel<P>, "gdr_chunk_scan_pipelined_kernel", kThreads, kPipe, device);
  else
    fit_launch(gdr_chunk_scan_kernel<P>, "gdr_chunk_scan_kernel", kThreads, kScan, device);
  const int slices = (a.dv + kBV - 1) / kBV;
  const float q_scale = 1.f / sqrtf(static_cast<float>(a.dk));
  const dim3 grid(static_cast<unsigned>(a.nseq), static_cast<unsigned>(a.nv * slices));
  if (pipelined) {
    gdr_chunk_scan_pipelined_kernel<P><<<grid, kThreads, kPipe, st>>>(a.out, a.state, a.qkv, a.xw, a.g, a.beta,
                                                                      a.g_bf16, a.b_bf16, a.cu, a.nseq, a.nk, a.dk,
                                                                      a.nv, a.dv, slices, a.row, q_scale);
  } else {
    gdr_chunk_scan_kernel<P><<<grid, kThreads, kScan, st>>>(a.out, a.state, a.qkv, a.xw, a.g, a.beta, a.g_bf16,
                                                            a.b_bf16, a.cu, a.nseq, a.nk, a.dk, a.nv, a.dv, slices,
                                                            a.row, q_scale);
  }
  DF_CUDA_LAUNCH();
}
// The two paddings gated_delta_rule_forward dispatches to.
template void launch_chunk_scan<64>(const Args& a, int device, bool pipelined, cudaStream_t st);
template void launch_chunk_scan<128>(const Args& a, int device, bool pipelined, cudaStream_t st);

}  // namespace dflash::cuda::gdr
