// Block-prefix attention (DFlash training) on CUDA, fused flash-style kernels; see block_attention.cuh.
//
// FlashAttention-2 layout with mma.sync m16n8k16 (bf16 in, fp32 accumulate) and ldmatrix fragments:
// scores and probabilities never leave registers (the S accumulator fragments of two 8-key n-tiles are
// exactly the A fragment of P for the next product). Shapes: head dim 16/32/64/128 with G·B <= 64 query
// rows per kv head and block ("narrow", Plan<HD>::kRows = 64, 4 warps), and head dim 256 with G·B <= 96,
// B <= 32 ("wide", kRows = 96, 6 warps: the Qwen3.6-27B drafter, 24/4 heads x 256, B 16).
//
// Forward, one CTA of kRows / 16 warps per (block n, kv head g): the G query heads sharing kv head g times
// the block's B rows (row i: head-in-group r = i / B, block offset o = i % B), padded to kRows with rows
// that see nothing and are never written (warps whose 16 rows are all padding skip the math). Warp w owns
// rows [16w, 16w + 16). Keys stream in tiles of 64 through a two-stage cp.async pipeline (tile t + 1 loads
// while tile t is computed): the context tiles of the block's visible range, then one tile of the block's
// own B keys. One pass, online softmax. Narrow: Q staged in the idle stage, then held in registers. Wide:
// the O accumulator alone is 128 fp32 registers per thread (16 rows x 256), so Q stays in shared memory
// and its A fragments are re-read per key tile (ldmatrix; 1 extra ldmatrix per 4). Blocks are taken in
// reverse order so the longest (latest anchors, when sorted) start first.
// Backward (scores recomputed):
//   dq kernel, per (block, kv head), same row layout: D = rowsum(dO o O) (saved), dq = scale · sum dS K,
//     and for the block's own keys (seen by this CTA's rows only, P and dS staged once in shared memory)
//     dk_blk = scale · dS^T Q, dv_blk = P^T dO, complete. Wide: key tiles of 32 (Q and dO of 96 rows take
//     99 KB of shared memory; S and dP of 32 keys are 32 registers next to dq's 128).
//   dkv kernel, per (context key tile of 64, kv head, split of kSplitBlocks blocks), dk += dS^T Q,
//     dv += P^T dO accumulated in registers across the blocks that see the tile, then fp32 atomics into a
//     [T, nkv·hd] buffer, converted to bf16 at the end. Query rows stream in units of 32 rows of one block
//     (Q, dO, lse, D) through a ring of three cp.async stages with one __syncthreads per unit, and the
//     unit's score products (S^T = K Q^T, dP^T = V dO^T: chains of hd / 16 dependent mma) run in the same
//     k loop as the previous unit's accumulating products (independent mma), so every warp has two mma
//     streams in flight; the previous unit's Q and dO stay in their stage meanwhile (stages: loading u + 1,
//     multiplying u, accumulating u - 1). Row offsets come from per-CTA tables (no division by B in the
//     loop). Narrow: 4 warps, warp w owns keys [16w, 16w + 16) and both its dk and dv (P and dS of the
//     previous unit held as bf16 fragments). Wide: dk and dv of 16 keys x 256 would be 256 registers per
//     thread, so 8 warps pair up on 16 keys each: the even warp computes S^T, owns dv and hands P over
//     through shared memory (two parities); the odd warp computes dP^T, owns dk, and forms dS of the
//     previous unit from the P handed over one unit earlier, so the pair never waits for each other (the
//     unit's barrier orders the hand-over). Each warp does two of the four products (no recomputation).
//   Deterministic mode (set_deterministic) makes one split of all N blocks: each dk/dv element is then
//   added exactly once (one warp owns it), so there is no order to vary.
// Shared memory (bytes): narrow hd 128 fwd 69632, dq 104960, dkv 88576; wide fwd 185856, dq 169728,
// dkv 187264. Devices whose opt-in limit is smaller (sm_120: 99 KB) are refused by
// block_attention_fused_supported, so the chunked path runs there instead of a failed launch.
// Measured (H200, one 27B layer, 512 blocks, T 4096, window 2048; ncu, before the dkv change below): fwd 1.97 ms, dq 2.80 ms, dkv 6.40 ms,
// each at 6-8 warps per SM (registers: 1 CTA per SM) and latency-bound (8.5 cycles per issued instruction
// in dkv). Three-stage cp.async pipelines alone for the wide dq and (previous) dkv kernels (203 / 178 KB)
// measured no gain (backward 9.31 vs 9.24 ms), so the dq kernel keeps two stages. Interleaving S and dP in the dq kernel
// (mma_rows_nk2) took the 8b layer's backward from 5.49 to 5.29 ms (27b: unchanged).
// 2026-12-01, the dkv kernels above (three stages, one barrier per 32-row unit, the previous unit's dK / dV
// products in the score products' k loop, no pair barrier, row tables), against the previous dkv kernels
// in one H200 call (probe backward, one layer): 8b 5.26 -> 4.12 ms, 27b window 9.20 -> 6.98 ms, 27b full
// 11.43 -> 8.74 ms; steps 8b CE 156.6 -> 150.5 ms, 27b 281.4 -> 269.1 ms. Registers (ptxas, sm_90a, no
// spills): dkv hd 128 248 (was 242; still 2 CTAs per SM), hd 256 pair 246 (was 234).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "backend.cuh"
#include "block_attention.cuh"
#include "cuda_check.cuh"
#include "drafter_blas.cuh"

namespace dflash::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kSplitBlocks = 64;  // blocks per dkv CTA
constexpr int kRowChunk = 32;     // query rows per step of the dkv kernels (bounds their registers)
constexpr int kDkvKeys = 64;      // context keys per dkv CTA
constexpr int kDkvStages = 3;     // (Q, dO) stages of the dkv kernels: the unit being loaded, the unit being
                                  // multiplied, and the previous unit (its dK / dV products are still running)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct FusedArgs {
  const bf16 *q, *kc, *vc, *kb, *vb, *out, *dout;
  bf16 *o, *dq, *dkb, *dvb;
  float* lse;          // [N·B, nh] natural log
  float* D;            // [N·B, nh] rowsum(dO o O)
  float *dk32, *dv32;  // [T, nkv·hd]
  const int32_t *anchors, *seq_begin;
  int N, B, nh, nkv, G, M, window, T;
  int split_blocks;  // blocks per dkv CTA: kSplitBlocks, or N in deterministic mode (one CTA per key tile
                     // and head, so each dK/dV element gets exactly one atomic add: no order to vary)
  int64_t QD, KVD;
  float scale, scale_log2;  // scale, scale·log2(e)
};

// Tiles and shared memory per head dim (see the header comment).
template <int HD> struct Plan {
  static constexpr bool kWide = HD > 128;
  static constexpr int kRows = kWide ? 96 : 64;  // query rows per forward / dq CTA (G·B padded)
  static constexpr int kWarps = kRows / 16;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kFwdKeys = 64;
  static constexpr int kDqKeys = kWide ? 32 : 64;
  static constexpr int kMaxB = kDqKeys;           // the block's own keys fit one dq key tile
  static constexpr bool kQInRegs = !kWide;        // forward: Q fragments held in registers
  static constexpr int LD = HD + 8;               // bf16 row stride of [rows][HD] tiles (16-byte pad: ldmatrix conflict-free)
  static constexpr int kRowTile = kRows * LD;
  static constexpr int kFwdKeyTile = kFwdKeys * LD;
  static constexpr int kDqKeyTile = kDqKeys * LD;
  static constexpr int LDP = kDqKeys + 8;         // bf16 row stride of the staged [rows][keys] P / dS
  // dq kernel stage: K and V of one tile, or (after the loop) P and dS of the block's own keys
  static constexpr int kDqStage = 2 * kDqKeyTile > 2 * kRows * LDP ? 2 * kDqKeyTile : 2 * kRows * LDP;
  static_assert(!kQInRegs || kRows <= 2 * kFwdKeys, "Q is staged in the second K/V stage");
  // Narrow dkv: K, V, 2 stages of (Q, dO) of kRows rows and (lse, D). Wide dkv: K, V, 2 stages of (Q, dO)
  // of kRowChunk rows and (lse, D), and one P hand-over buffer per warp pair ([16 keys x 32 rows] fp32).
  static constexpr int kDkvThreads = kWide ? 256 : 128;
  static constexpr size_t kSmemFwd = sizeof(bf16) * (4 * kFwdKeyTile + (kQInRegs ? 0 : kRowTile));
  static constexpr size_t kSmemDq = sizeof(bf16) * (2 * kRowTile + 2 * kDqStage) + sizeof(float) * 2 * kRows;
  // dkv (both kinds): K, V of the key tile, kDkvStages stages of (Q, dO) of kRowChunk rows and their
  // (lse, D), row tables (3 ints per row), and for the paired kernel two P hand-over buffers per pair
  // ([16 keys x kRowChunk rows] fp32).
  static constexpr size_t kSmemDkv = sizeof(bf16) * (2 * kDkvKeys * LD + kDkvStages * 2 * kRowChunk * LD) +
                                     sizeof(float) * kDkvStages * 2 * kRowChunk +
                                     (kWide ? sizeof(float) * 2 * (kDkvThreads / 64) * 16 * kRowChunk : 0) +
                                     sizeof(int) * 3 * kRows;
  static constexpr size_t kSmemMax = kSmemFwd > kSmemDq ? (kSmemFwd > kSmemDkv ? kSmemFwd : kSmemDkv)
                                                        : (kSmemDq > kSmemDkv ? kSmemDq : kSmemDkv);
};

// ---- PTX wrappers -----------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, zero-filled when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// d[16x8] += a[16x16] · b[16x8]
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Fragment addressing (lane l). A [16 x 16] from row-major [m][k] storage: row l % 16, col (l / 16)·8.
// B of two 8-wide n-tiles from [n][k] storage (non-transposed): row (l % 8) + (l / 16)·8, col ((l / 8) % 2)·8.
// B of two 8-wide n-tiles from [k][n] storage (.trans): row (l % 8) + ((l / 8) % 2)·8, col (l / 16)·8.
// A [16 x 16] from [k][m] storage (.trans): row (l % 8) + (l / 16)·8, col ((l / 8) % 2)·8.
__device__ __forceinline__ int a_row(int l) { return l & 15; }
__device__ __forceinline__ int a_col(int l) { return (l >> 4) << 3; }
__device__ __forceinline__ int bn_row(int l) { return (l & 7) + ((l >> 4) << 3); }
__device__ __forceinline__ int bn_col(int l) { return ((l >> 3) & 1) << 3; }
__device__ __forceinline__ int bt_row(int l) { return (l & 7) + (((l >> 3) & 1) << 3); }
__device__ __forceinline__ int bt_col(int l) { return (l >> 4) << 3; }

// The k-steps the products below are made of (k: a 16-wide step of the reduced dimension). The products
// interleave them differently, so they are built from these rather than from each other.
// acc[0..NT) += a · Bs^T over k-step k: a the A fragment [16 x 16], Bs [n][k] row-major (n = 8·NT rows,
// row stride LDB).
template <int NT, int LDB>
__device__ __forceinline__ void mma_step_nk(float (&acc)[NT][4], const uint32_t (&a)[4], const bf16* Bs, int k,
                                            int lane) {
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    uint32_t b[4];
    ldsm_x4(b, Bs + (16 * np + bn_row(lane)) * LDB + 16 * k + bn_col(lane));
    mma16816(acc[2 * np], a, b[0], b[1]);
    mma16816(acc[2 * np + 1], a, b[2], b[3]);
  }
}
// The same with A [16 rows x 16·KS] from row-major [m][k] storage at As (row stride LDA).
template <int NT, int LDA, int LDB>
__device__ __forceinline__ void mma_step_nk(float (&acc)[NT][4], const bf16* As, const bf16* Bs, int k, int lane) {
  uint32_t a[4];
  ldsm_x4(a, As + a_row(lane) * LDA + 16 * k + a_col(lane));
  mma_step_nk<NT, LDB>(acc, a, Bs, k, lane);
}
// n-tiles 2·np, 2·np + 1 of acc0 += a0 · b0 and of acc1 += a1 · b1 (b: the B fragments of two n-tiles), the
// two products' mma interleaved (independent accumulators back to back).
template <int NT>
__device__ __forceinline__ void mma_pair2(float (&acc0)[NT][4], float (&acc1)[NT][4], const uint32_t (&a0)[4],
                                          const uint32_t (&a1)[4], const uint32_t (&b0)[4], const uint32_t (&b1)[4],
                                          int np) {
  mma16816(acc0[2 * np], a0, b0[0], b0[1]);
  mma16816(acc1[2 * np], a1, b1[0], b1[1]);
  mma16816(acc0[2 * np + 1], a0, b0[2], b0[3]);
  mma16816(acc1[2 * np + 1], a1, b1[2], b1[3]);
}
// acc0 += A0 · B0^T and acc1 += A1 · B1^T over k-step k (all [..][k] row-major, row stride LD), their mma
// interleaved.
template <int NT, int LD>
__device__ __forceinline__ void mma_step_nk2(float (&acc0)[NT][4], float (&acc1)[NT][4], const bf16* A0, const bf16* B0,
                                             const bf16* A1, const bf16* B1, int k, int lane) {
  uint32_t a0[4], a1[4];
  ldsm_x4(a0, A0 + a_row(lane) * LD + 16 * k + a_col(lane));
  ldsm_x4(a1, A1 + a_row(lane) * LD + 16 * k + a_col(lane));
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    uint32_t b0[4], b1[4];
    ldsm_x4(b0, B0 + (16 * np + bn_row(lane)) * LD + 16 * k + bn_col(lane));
    ldsm_x4(b1, B1 + (16 * np + bn_row(lane)) * LD + 16 * k + bn_col(lane));
    mma_pair2(acc0, acc1, a0, a1, b0, b1, np);
  }
}
// acc n-tiles 2·np, 2·np + 1 += f · Cs over k-step k, Cs [k][n] row-major (row stride LDC).
template <int LDC, int DT>
__device__ __forceinline__ void mma_step_kn(float (&acc)[DT][4], const uint32_t (&f)[4], const bf16* Cs, int k, int np,
                                            int lane) {
  uint32_t c[4];
  ldsm_x4_t(c, Cs + (16 * k + bt_row(lane)) * LDC + 16 * np + bt_col(lane));
  mma16816(acc[2 * np], f, c[0], c[1]);
  mma16816(acc[2 * np + 1], f, c[2], c[3]);
}
// The same for two products at once, their mma interleaved.
template <int LDC, int DT>
__device__ __forceinline__ void mma_step_kn2(float (&acc0)[DT][4], const uint32_t (&f0)[4], const bf16* C0,
                                             float (&acc1)[DT][4], const uint32_t (&f1)[4], const bf16* C1, int k,
                                             int np, int lane) {
  uint32_t c0[4], c1[4];
  ldsm_x4_t(c0, C0 + (16 * k + bt_row(lane)) * LDC + 16 * np + bt_col(lane));
  ldsm_x4_t(c1, C1 + (16 * k + bt_row(lane)) * LDC + 16 * np + bt_col(lane));
  mma_pair2(acc0, acc1, f0, f1, c0, c1, np);
}

// acc[0..NT) (n-tiles of 8 columns) += A[16 rows at As, K=16·KS] · Bs^T where Bs is [n][k] row-major (n = 8·NT rows)
template <int KS, int NT, int LDA, int LDB>
__device__ __forceinline__ void mma_rows_nk(float (&acc)[NT][4], const bf16* As, const bf16* Bs, int lane) {
#pragma unroll
  for (int k = 0; k < KS; ++k) mma_step_nk<NT, LDA, LDB>(acc, As, Bs, k, lane);
}
// acc0 += A0 · B0^T and acc1 += A1 · B1^T (layouts as mma_rows_nk) in one k loop: the two products' mma
// chains interleave, twice the independent accumulators per k-step of two mma_rows_nk calls.
template <int KS, int NT, int LD>
__device__ __forceinline__ void mma_rows_nk2(float (&acc0)[NT][4], float (&acc1)[NT][4], const bf16* A0, const bf16* B0,
                                             const bf16* A1, const bf16* B1, int lane) {
#pragma unroll
  for (int k = 0; k < KS; ++k) mma_step_nk2<NT, LD>(acc0, acc1, A0, B0, A1, B1, k, lane);
}
// acc[0..NT) += Pf (A fragments over K = 16·KS, in registers) · Bs where Bs is [k][n] row-major
template <int KS, int NT, int LDB>
__device__ __forceinline__ void mma_regs_kn(float (&acc)[NT][4], const uint32_t (&Pf)[KS][4], const bf16* Bs, int lane) {
#pragma unroll
  for (int k = 0; k < KS; ++k)
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) mma_step_kn<LDB>(acc, Pf[k], Bs, k, np, lane);
}
// Accumulators of 2·KS n-tiles (16 x 8 each, fp32) as the bf16 A fragments of KS k-steps.
template <int KS> __device__ __forceinline__ void to_a_frags(uint32_t (&f)[KS][4], const float (&acc)[2 * KS][4]) {
#pragma unroll
  for (int k = 0; k < KS; ++k) {
    f[k][0] = pack_bf16(acc[2 * k][0], acc[2 * k][1]);
    f[k][1] = pack_bf16(acc[2 * k][2], acc[2 * k][3]);
    f[k][2] = pack_bf16(acc[2 * k + 1][0], acc[2 * k + 1][1]);
    f[k][3] = pack_bf16(acc[2 * k + 1][2], acc[2 * k + 1][3]);
  }
}

// ---- geometry ----------------------------------------------------------------------------------------------
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
// What query row i of a block anchored at a sees: context keys [ctx_lo, a), block keys [0, blk_hi).
struct RowView {
  int ctx_lo, blk_hi;
};
__device__ __forceinline__ RowView row_view(const FusedArgs& p, int i, int a, int s0) {
  if (i >= p.M) return {a, 0};  // padding row: nothing visible
  const int o = i % p.B;
  if (p.window > 0) return {max(s0, a + o - (p.window - 1)), o + 1};
  return {s0, p.B};
}
// Whether every real row sees all of context tile [j0, j0 + KEYS) (CTA-uniform). Callers add their own
// padding-row condition (padding rows must be masked: they see nothing).
template <int KEYS> __device__ __forceinline__ bool ctx_tile_interior(const FusedArgs& p, int a, int s0, int j0) {
  if (j0 + KEYS > a) return false;
  const int widest_lo = p.window > 0 ? max(s0, a + (p.B - 1) - (p.window - 1)) : s0;
  return j0 >= widest_lo;
}

// ROWS rows of HD bf16 into shared memory (stride HD + 8) with cp.async by TH threads; row_ptr(i) ==
// nullptr: zero row.
template <int HD, int ROWS, int TH, class RowPtr>
__device__ __forceinline__ void async_rows(bf16* dst, const bf16* any, RowPtr row_ptr) {
  constexpr int V = HD / 8;
#pragma unroll
  for (int idx = threadIdx.x; idx < ROWS * V; idx += TH) {
    const int i = idx / V, v = idx % V;
    const bf16* src = row_ptr(i);
    cp_async16(dst + i * (HD + 8) + v * 8, src != nullptr ? src + v * 8 : any, src != nullptr);
  }
}
// K (and V) of key tile [j0, j1) of the context (KEYS rows), or of block n's own keys (B <= KEYS rows).
template <int HD, int KEYS, int TH>
__device__ __forceinline__ void async_key_tile(const FusedArgs& p, int n, int g, bool is_blk, int j0, int j1, bf16* Ks,
                                               bf16* Vs) {
  if (is_blk) {
    async_rows<HD, KEYS, TH>(Ks, p.kb, [&](int i) -> const bf16* { return i < p.B ? p.kb + (int64_t(n) * p.B + i) * p.KVD + g * HD : nullptr; });
    async_rows<HD, KEYS, TH>(Vs, p.vb, [&](int i) -> const bf16* { return i < p.B ? p.vb + (int64_t(n) * p.B + i) * p.KVD + g * HD : nullptr; });
  } else {
    async_rows<HD, KEYS, TH>(Ks, p.kc, [&](int i) -> const bf16* { return j0 + i < j1 ? p.kc + int64_t(j0 + i) * p.KVD + g * HD : nullptr; });
    async_rows<HD, KEYS, TH>(Vs, p.vc, [&](int i) -> const bf16* { return j0 + i < j1 ? p.vc + int64_t(j0 + i) * p.KVD + g * HD : nullptr; });
  }
}
// Query rows [r0, r0 + ROWS) of (block n, kv head g) from base (q, dout); rows >= M are zero.
template <int HD, int ROWS, int TH>
__device__ __forceinline__ void async_query_rows(const FusedArgs& p, const bf16* base, int n, int g, bf16* dst, int r0 = 0) {
  async_rows<HD, ROWS, TH>(dst, base, [&](int i) -> const bf16* { return r0 + i < p.M ? base + q_offset(p, n, g, r0 + i, HD) : nullptr; });
}

// Scores of a warp's rows (acc [NT n-tiles][4], lane rows lane/4 and lane/4 + 8, columns 8·nt + 2·(lane%4) + e)
// times scale·log2(e), -inf where hidden.
template <int NT>
__device__ __forceinline__ void mask_scale(float (&s)[NT][4], const RowView (&rv)[2], bool masked, bool is_blk, int j0,
                                           int a, float scale_log2, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e >> 1, c = 8 * nt + 2 * (lane & 3) + (e & 1);
      bool vis = true;
      if (masked) vis = is_blk ? c < rv[h].blk_hi : (j0 + c >= rv[h].ctx_lo && j0 + c < a);
      s[nt][e] = vis ? s[nt][e] * scale_log2 : -INFINITY;
    }
}

// ---- forward ---------------------------------------------------------------------------------------------
template <int HD> __global__ void __launch_bounds__(Plan<HD>::kThreads) fused_forward_kernel(FusedArgs p) {
  using P = Plan<HD>;
  constexpr int LD = P::LD, KS = HD / 16, DT = HD / 8, KEYS = P::kFwdKeys, NT = KEYS / 8, TH = P::kThreads;
  constexpr int kKeyTile = P::kFwdKeyTile;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* KV = reinterpret_cast<bf16*>(smem);  // stage s: K at KV + 2s·kKeyTile, V at + kKeyTile
  // narrow: Q staged in stage 1's K until its fragments are in registers; wide: Q after the two stages
  bf16* Qs = KV + (P::kQInRegs ? 2 : 4) * kKeyTile;
  const int n = p.N - 1 - int(blockIdx.x), g = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int a = p.anchors[n], s0 = p.seq_begin[n];
  const int lo = block_ctx_lo(p, a, s0);
  const int ntiles = (a - lo + KEYS - 1) / KEYS + 1;  // context tiles + the block's own keys
  async_query_rows<HD, P::kRows, TH>(p, p.q, n, g, Qs);
  async_key_tile<HD, KEYS, TH>(p, n, g, ntiles == 1, lo, a, KV, KV + kKeyTile);
  cp_async_commit();
  const int r0 = 16 * w + (lane >> 2);
  const RowView rv[2] = {row_view(p, r0, a, s0), row_view(p, r0 + 8, a, s0)};
  const bool rows_real = r0 + 8 < p.M;
  const bool warp_live = 16 * w < p.M;  // warp-uniform: a warp of padding rows only keeps the barriers
  uint32_t qf[P::kQInRegs ? KS : 1][4];
  if constexpr (P::kQInRegs) {
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int k = 0; k < KS; ++k) ldsm_x4(qf[k], Qs + (16 * w + a_row(lane)) * LD + 16 * k + a_col(lane));
    __syncthreads();  // stage 1 free
  }

  float o[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int t = 0; t < ntiles; ++t) {
    if (t + 1 < ntiles) {
      bf16* nxt = KV + ((t + 1) & 1) * 2 * kKeyTile;
      async_key_tile<HD, KEYS, TH>(p, n, g, t + 1 == ntiles - 1, lo + (t + 1) * KEYS, a, nxt, nxt + kKeyTile);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (warp_live) {
      const bf16* Ks = KV + (t & 1) * 2 * kKeyTile;
      const bf16* Vs = Ks + kKeyTile;
      const bool is_blk = t == ntiles - 1;
      const int j0 = lo + t * KEYS;
      float s[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      if constexpr (P::kQInRegs) {
#pragma unroll
        for (int k = 0; k < KS; ++k) mma_step_nk<NT, LD>(s, qf[k], Ks, k, lane);  // S = Q K^T, Q in registers
      } else {
        mma_rows_nk<KS, NT, LD, LD>(s, Qs + 16 * w * LD, Ks, lane);  // S = Q K^T, Q re-read from shared memory
      }
      const bool masked = is_blk || !rows_real || !ctx_tile_interior<KEYS>(p, a, s0, j0);
      mask_scale<NT>(s, rv, masked, is_blk, j0, a, p.scale_log2, lane);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m[h], mx);
        const float base = mn == -INFINITY ? 0.f : mn;
        const float alpha = exp2f(m[h] - base);
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          s[nt][2 * h] = exp2f(s[nt][2 * h] - base);
          s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - base);
          sum += s[nt][2 * h] + s[nt][2 * h + 1];
        }
        l[h] = l[h] * alpha + sum;
        m[h] = mn;
#pragma unroll
        for (int d = 0; d < DT; ++d) {
          o[d][2 * h] *= alpha;
          o[d][2 * h + 1] *= alpha;
        }
      }
      uint32_t pf[NT / 2][4];
      to_a_frags<NT / 2>(pf, s);
      mma_regs_kn<NT / 2, DT, LD>(o, pf, Vs, lane);
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }
  if (!warp_live) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int i = r0 + 8 * h;
    if (i >= p.M) continue;
    const float inv = 1.f / l[h];
    bf16* orow = p.o + q_offset(p, n, g, i, HD) + 2 * (lane & 3);
#pragma unroll
    for (int d = 0; d < DT; ++d)
      *reinterpret_cast<uint32_t*>(orow + 8 * d) = pack_bf16(o[d][2 * h] * inv, o[d][2 * h + 1] * inv);
    if ((lane & 3) == 0) p.lse[stat_index(p, n, g, i)] = (m[h] + log2f(l[h])) * kLn2;
  }
}

// ---- backward: dq, D, and the block's own keys ------------------------------------------------------------
template <int HD> __global__ void __launch_bounds__(Plan<HD>::kThreads) fused_dq_kernel(FusedArgs p) {
  using P = Plan<HD>;
  constexpr int LD = P::LD, LDP = P::LDP, KS = HD / 16, DT = HD / 8, KEYS = P::kDqKeys, NT = KEYS / 8;
  constexpr int ROWS = P::kRows, TH = P::kThreads, kKeyTile = P::kDqKeyTile;
  static_assert(TH == 2 * ROWS, "D is computed by a thread pair per row");
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* dOs = Qs + P::kRowTile;
  float* Lse2s = reinterpret_cast<float*>(dOs + P::kRowTile);  // [ROWS] lse in base 2
  float* Ds = Lse2s + ROWS;                                     // [ROWS]
  bf16* KV = reinterpret_cast<bf16*>(Ds + ROWS);                // 2 stages of kDqStage elements
  const int n = p.N - 1 - int(blockIdx.x), g = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int a = p.anchors[n], s0 = p.seq_begin[n];
  const int lo = block_ctx_lo(p, a, s0);
  const int ntiles = (a - lo + KEYS - 1) / KEYS + 1;
  async_query_rows<HD, ROWS, TH>(p, p.q, n, g, Qs);
  async_query_rows<HD, ROWS, TH>(p, p.dout, n, g, dOs);
  async_key_tile<HD, KEYS, TH>(p, n, g, ntiles == 1, lo, a, KV, KV + kKeyTile);
  cp_async_commit();
  {  // D = rowsum(dO o O), lse: thread pair per row
    const int i = threadIdx.x >> 1, half = threadIdx.x & 1;
    float D = 0.f;
    if (i < p.M) {
      const bf16* orow = p.out + q_offset(p, n, g, i, HD);
      const bf16* drow = p.dout + q_offset(p, n, g, i, HD);
      for (int e = 2 * half; e < HD; e += 4) {
        const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(orow + e));
        const float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(drow + e));
        D += x.x * y.x + x.y * y.y;
      }
    }
    D += __shfl_xor_sync(0xffffffffu, D, 1);
    if (half == 0) {
      Ds[i] = D;
      Lse2s[i] = i < p.M ? p.lse[stat_index(p, n, g, i)] * kLog2e : 0.f;
      if (i < p.M) p.D[stat_index(p, n, g, i)] = D;
    }
  }
  const int r0 = 16 * w + (lane >> 2);
  const RowView rv[2] = {row_view(p, r0, a, s0), row_view(p, r0 + 8, a, s0)};
  const bool rows_real = r0 + 8 < p.M;
  const bool warp_live = 16 * w < p.M;  // warp-uniform: a warp of padding rows only keeps the barriers
  __syncthreads();
  const float lse2[2] = {Lse2s[r0], Lse2s[r0 + 8]};
  const float Drow[2] = {Ds[r0], Ds[r0 + 8]};
  const bf16* Qw = Qs + 16 * w * LD;
  const bf16* dOw = dOs + 16 * w * LD;

  float dq[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.f;
  for (int t = 0; t < ntiles; ++t) {
    const bool is_blk = t == ntiles - 1;
    if (t + 1 < ntiles) {
      bf16* nxt = KV + ((t + 1) & 1) * P::kDqStage;
      async_key_tile<HD, KEYS, TH>(p, n, g, t + 1 == ntiles - 1, lo + (t + 1) * KEYS, a, nxt, nxt + kKeyTile);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (warp_live) {
      const bf16* Ks = KV + (t & 1) * P::kDqStage;
      const bf16* Vs = Ks + kKeyTile;
      const int j0 = lo + t * KEYS;
      float s[NT][4], dp[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
      mma_rows_nk2<KS, NT, LD>(s, dp, Qw, Ks, dOw, Vs, lane);  // S = Q K^T, dP = dO V^T
      const bool masked = is_blk || !rows_real || !ctx_tile_interior<KEYS>(p, a, s0, j0);
      mask_scale<NT>(s, rv, masked, is_blk, j0, a, p.scale_log2, lane);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1;
          s[nt][e] = exp2f(s[nt][e] - lse2[h]);          // P (0 where hidden)
          dp[nt][e] = s[nt][e] * (dp[nt][e] - Drow[h]);  // dS
        }
      uint32_t dsf[NT / 2][4];
      to_a_frags<NT / 2>(dsf, dp);
      mma_regs_kn<NT / 2, DT, LD>(dq, dsf, Ks, lane);  // dq += dS K
      if (is_blk) {  // stage P and dS of the block's own keys in the other (idle) stage
        bf16* Ps = KV + ((t + 1) & 1) * P::kDqStage;
        bf16* dSs = Ps + ROWS * LDP;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int off = (r0 + 8 * h) * LDP + 8 * nt + 2 * (lane & 3);
            *reinterpret_cast<uint32_t*>(Ps + off) = pack_bf16(s[nt][2 * h], s[nt][2 * h + 1]);
            *reinterpret_cast<uint32_t*>(dSs + off) = pack_bf16(dp[nt][2 * h], dp[nt][2 * h + 1]);
          }
      }
    }
    __syncthreads();
  }
  if (warp_live) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = r0 + 8 * h;
      if (i >= p.M) continue;
      bf16* row = p.dq + q_offset(p, n, g, i, HD) + 2 * (lane & 3);
#pragma unroll
      for (int d = 0; d < DT; ++d)
        *reinterpret_cast<uint32_t*>(row + 8 * d) = pack_bf16(dq[d][2 * h] * p.scale, dq[d][2 * h + 1] * p.scale);
    }
  }
  // The block's own keys: every row that sees them is in this CTA, so dk_blk / dv_blk are complete here.
  // dk[key][dim] = scale · sum_rows dS[row][key] Q[row][dim]; dv likewise with P and dO. Items: 16 keys x 16
  // dims, summed over the row tiles of live warps (the staged P / dS rows of padding warps are not written).
  const bf16* Ps = KV + (ntiles & 1) * P::kDqStage;
  const bf16* dSs = Ps + ROWS * LDP;
  const int key_tiles = (p.B + 15) / 16;
  for (int f = w; f < key_tiles * KS; f += P::kWarps) {
    const int kt = f / KS, c = f % KS;
    float dk[2][4] = {}, dv[2][4] = {};
#pragma unroll
    for (int k = 0; k < ROWS / 16; ++k) {
      if (16 * k >= p.M) break;
      uint32_t x[4], y[4];
      // A = dS^T [key][row] from dSs [row][key]: transposed A load
      ldsm_x4_t(x, dSs + (16 * k + bn_row(lane)) * LDP + 16 * kt + bn_col(lane));
      ldsm_x4_t(y, Qs + (16 * k + bt_row(lane)) * LD + 16 * c + bt_col(lane));
      mma16816(dk[0], x, y[0], y[1]);
      mma16816(dk[1], x, y[2], y[3]);
      ldsm_x4_t(x, Ps + (16 * k + bn_row(lane)) * LDP + 16 * kt + bn_col(lane));
      ldsm_x4_t(y, dOs + (16 * k + bt_row(lane)) * LD + 16 * c + bt_col(lane));
      mma16816(dv[0], x, y[0], y[1]);
      mma16816(dv[1], x, y[2], y[3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int b = 16 * kt + (lane >> 2) + 8 * h;
      if (b >= p.B) continue;
#pragma unroll
      for (int d = 0; d < 2; ++d) {
        const int64_t off = (int64_t(n) * p.B + b) * p.KVD + g * HD + 16 * c + 8 * d + 2 * (lane & 3);
        *reinterpret_cast<uint32_t*>(p.dkb + off) = pack_bf16(dk[d][2 * h] * p.scale, dk[d][2 * h + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(p.dvb + off) = pack_bf16(dv[d][2 * h], dv[d][2 * h + 1]);
      }
    }
  }
}

// ---- backward: context keys ---------------------------------------------------------------------------------
__device__ __forceinline__ bool block_sees_tile(const FusedArgs& p, int n, int j0, int j1) {
  const int a = p.anchors[n];
  return a > j0 && block_ctx_lo(p, a, p.seq_begin[n]) < j1;
}
// ---- dkv kernels (both kinds): a ring of kDkvStages stages of 32-row units, one barrier per unit ---------
// The unit u's score products (S^T = K Q^T, dP^T = V dO^T: chains of HD / 16 dependent mma per accumulator)
// run in the same k loop as the previous unit's dK / dV products (dv += P^T dO, dk += dS^T Q: independent
// mma), so each warp always has two independent streams of mma in flight; unit u - 1's Q and dO stay in
// their stage meanwhile (hence three stages: loading u + 1, multiplying u, accumulating u - 1).

// Per-CTA row tables for the kv head g (rows [0, kRows)): qoff[i] = element offset of query row i within a
// block's rows of q / dout (-1 for rows >= M), soff[i] = the same for lse / D, rowo[i] = the row's block
// offset i % B (-1 for rows >= M). They replace the divisions by B of q_offset / stat_index in the loop.
template <int ROWS, int TH>
__device__ __forceinline__ void build_row_tables(const FusedArgs& p, int g, int HD, int* qoff, int* soff, int* rowo) {
  for (int i = threadIdx.x; i < ROWS; i += TH) {
    if (i < p.M) {
      const int r = i / p.B, o = i % p.B;
      qoff[i] = int(o * p.QD) + (g * p.G + r) * HD;
      soff[i] = o * p.nh + g * p.G + r;
      rowo[i] = o;
    } else {
      qoff[i] = soff[i] = rowo[i] = -1;
    }
  }
}
// Q, dO of rows [r0, r0 + kRowChunk) of block n into Qs, dOs (zero rows past M); lse (natural log) and D into
// stats[0, kRowChunk) and stats[kRowChunk, 2·kRowChunk).
template <int HD, int TH>
__device__ __forceinline__ void async_unit_rows(const FusedArgs& p, int n, int r0, bf16* Qs, bf16* dOs, float* stats,
                                                const int* qoff, const int* soff) {
  constexpr int V = HD / 8, RC = kRowChunk;
  static_assert(TH >= 2 * RC, "one thread per statistic");
  const int64_t qbase = int64_t(n) * p.B * p.QD;
#pragma unroll
  for (int idx = threadIdx.x; idx < RC * V; idx += TH) {
    const int i = idx / V, v = idx % V, off = qoff[r0 + i];
    const bool ok = off >= 0;
    const int64_t src = ok ? qbase + off + v * 8 : 0;
    cp_async16(Qs + i * (HD + 8) + v * 8, p.q + src, ok);
    cp_async16(dOs + i * (HD + 8) + v * 8, p.dout + src, ok);
  }
  if (threadIdx.x < 2 * RC) {
    const int so = soff[r0 + int(threadIdx.x) % RC];
    const float* src = int(threadIdx.x) < RC ? p.lse : p.D;
    cp_async4(stats + threadIdx.x, so >= 0 ? src + int64_t(n) * p.B * p.nh + so : src, so >= 0);
  }
}
// Whether context key `key` is visible to unit row `row` of a block anchored at a (row tables as above).
__device__ __forceinline__ bool key_visible(const FusedArgs& p, const int* rowo, int row, int key, int a, int s0) {
  const int o = rowo[row];
  if (o < 0) return false;
  const int lo = p.window > 0 ? max(s0, a + o - (p.window - 1)) : s0;
  return key >= lo && key < a;
}

// s += A · B^T (as mma_rows_nk: A [16 x 16·KS] at As, B [8·NT][16·KS] at Bs) and, when ACC,
// acc += F · C (as mma_regs_kn: F in registers [16 x 16·KA], C [16·KA][8·DT] at Cs), in one k loop: the
// independent mma of the second product fill the latency of the first one's chains.
template <int KS, int NT, int KA, int DT, int LD, bool ACC>
__device__ __forceinline__ void mma_nk_with_kn(float (&s)[NT][4], const bf16* As, const bf16* Bs, float (&acc)[DT][4],
                                               const uint32_t (&F)[KA][4], const bf16* Cs, int lane) {
  constexpr int ITEMS = KA * (DT / 2), PER = (ITEMS + KS - 1) / KS;  // (k-step, n-tile pair) items of F · C
#pragma unroll
  for (int k = 0; k < KS; ++k) {
    mma_step_nk<NT, LD, LD>(s, As, Bs, k, lane);
    if constexpr (ACC) {
#pragma unroll
      for (int j = k * PER; j < (k + 1) * PER && j < ITEMS; ++j)
        mma_step_kn<LD>(acc, F[j / (DT / 2)], Cs, j / (DT / 2), j % (DT / 2), lane);
    }
  }
}
// The same for two pairs of products at once (the narrow kernel: S^T and dP^T, with dv and dk).
template <int KS, int NT, int KA, int DT, int LD, bool ACC>
__device__ __forceinline__ void mma_nk2_with_kn2(float (&s0)[NT][4], const bf16* A0, const bf16* B0, float (&s1)[NT][4],
                                                 const bf16* A1, const bf16* B1, float (&acc0)[DT][4],
                                                 const uint32_t (&F0)[KA][4], const bf16* C0, float (&acc1)[DT][4],
                                                 const uint32_t (&F1)[KA][4], const bf16* C1, int lane) {
  constexpr int ITEMS = KA * (DT / 2), PER = (ITEMS + KS - 1) / KS;
#pragma unroll
  for (int k = 0; k < KS; ++k) {
    mma_step_nk2<NT, LD>(s0, s1, A0, B0, A1, B1, k, lane);
    if constexpr (ACC) {
#pragma unroll
      for (int j = k * PER; j < (k + 1) * PER && j < ITEMS; ++j)
        mma_step_kn2<LD>(acc0, F0[j / (DT / 2)], C0, acc1, F1[j / (DT / 2)], C1, j / (DT / 2), j % (DT / 2), lane);
    }
  }
}

// Shared memory of the dkv kernels (see Plan::kSmemDkv).
template <int HD> struct DkvSmem {
  static constexpr int LD = HD + 8, RC = kRowChunk, kUnit = RC * LD, kKeyTile = kDkvKeys * LD;
  bf16 *Ks, *Vs, *QdO;  // stage s: Q at QdO + 2s·kUnit, dO at + kUnit
  float* stats;         // stage s: lse at stats + 2·RC·s, D at + RC
  float* hand;          // paired kernel: [2 parities][4 pairs][RT n-tiles][32 lanes] float4
  int *qoff, *soff, *rowo;
  __device__ explicit DkvSmem(unsigned char* smem) {
    Ks = reinterpret_cast<bf16*>(smem);
    Vs = Ks + kKeyTile;
    QdO = Vs + kKeyTile;
    stats = reinterpret_cast<float*>(QdO + kDkvStages * 2 * kUnit);
    hand = stats + kDkvStages * 2 * RC;
    qoff = reinterpret_cast<int*>(hand + (Plan<HD>::kWide ? 2 * (Plan<HD>::kDkvThreads / 64) * 16 * RC : 0));
    soff = qoff + Plan<HD>::kRows;
    rowo = soff + Plan<HD>::kRows;
  }
  // Stage s of the ring: Q, dO, lse, D of one unit.
  __device__ __forceinline__ bf16* q(int s) const { return QdO + s * 2 * kUnit; }
  __device__ __forceinline__ bf16* dout(int s) const { return QdO + s * 2 * kUnit + kUnit; }
  __device__ __forceinline__ float* lse(int s) const { return stats + s * 2 * RC; }
  __device__ __forceinline__ float* D(int s) const { return stats + s * 2 * RC + RC; }
};
// The unit after (n, rc) in CTA order: (n, rc + 32) while rc + 32 < M, else row 0 of the next block in
// [n + 1, n_end) that sees key tile [j0, j1) (n_end when none).
__device__ __forceinline__ void next_unit(const FusedArgs& p, int n, int rc, int n_end, int j0, int j1, int& nn, int& nrc) {
  nn = n;
  nrc = rc + kRowChunk;
  if (nrc >= p.M) {
    nrc = 0;
    ++nn;
    while (nn < n_end && !block_sees_tile(p, nn, j0, j1)) ++nn;
  }
}

// What a dkv CTA does: context key tile [j0, j1) of kv head g, for the blocks [n, n_end) of its split, n
// advanced to the first block that sees the tile (n == n_end: none does, nothing to do; CTA-uniform).
struct DkvWork {
  int j0, j1, g, n, n_end;
};
__device__ __forceinline__ DkvWork dkv_work(const FusedArgs& p) {
  const int j0 = blockIdx.x * kDkvKeys, j1 = min(j0 + kDkvKeys, p.T), g = blockIdx.y;
  const int n_begin = blockIdx.z * p.split_blocks, n_end = min(p.N, n_begin + p.split_blocks);
  int n = n_begin;
  while (n < n_end && !block_sees_tile(p, n, j0, j1)) ++n;
  return {j0, j1, g, n, n_end};
}
// The row tables, then one group: K and V of the key tile and the first unit (block n, rows [0, 32)) in
// stage 0.
template <int HD, int TH>
__device__ __forceinline__ void dkv_first_unit(const FusedArgs& p, const DkvSmem<HD>& sm, const DkvWork& wk) {
  build_row_tables<Plan<HD>::kRows, TH>(p, wk.g, HD, sm.qoff, sm.soff, sm.rowo);
  __syncthreads();
  async_key_tile<HD, kDkvKeys, TH>(p, wk.n, wk.g, false, wk.j0, wk.j1, sm.Ks, sm.Vs);
  async_unit_rows<HD, TH>(p, wk.n, 0, sm.q(0), sm.dout(0), sm.lse(0), sm.qoff, sm.soff);
  cp_async_commit();
}
// The top of unit u = (n, rc), in `stage`: the unit after it (nn, nrc), the wait for u's group, one
// barrier (after it every warp is done with the stage of unit u - 2), and u + 1's group into the stage
// after (an empty group past the last unit). Returns that stage.
template <int HD, int TH>
__device__ __forceinline__ int dkv_unit_top(const FusedArgs& p, const DkvSmem<HD>& sm, const DkvWork& wk, int n, int rc,
                                            int stage, int& nn, int& nrc) {
  next_unit(p, n, rc, wk.n_end, wk.j0, wk.j1, nn, nrc);
  cp_async_wait<0>();
  __syncthreads();
  const int nstage = stage + 1 == kDkvStages ? 0 : stage + 1;
  if (nn < wk.n_end)
    async_unit_rows<HD, TH>(p, nn, nrc, sm.q(nstage), sm.dout(nstage), sm.lse(nstage), sm.qoff, sm.soff);
  cp_async_commit();
  return nstage;
}
// acc (this warp's 16 keys key[0] + {0..7}, key[1] + {0..7} as fragment rows, HD columns) times mul into
// dst ([T, nkv·HD] fp32) by atomics, keys < j1.
template <int HD>
__device__ __forceinline__ void atomic_add_keys(float* dst, const float (&acc)[HD / 8][4], float mul,
                                                const int (&key)[2], int j1, const FusedArgs& p, int g, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key[h] >= j1) continue;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      const int64_t off = int64_t(key[h]) * p.KVD + g * HD + 8 * d + 2 * (lane & 3);
      atomicAdd(dst + off, acc[d][2 * h] * mul);
      atomicAdd(dst + off + 1, acc[d][2 * h + 1] * mul);
    }
  }
}

// Narrow head dims (<= 128): 4 warps, warp w owns keys [16w, 16w + 16) of the tile and both their dk and dv.
// Per unit u: S^T, dP^T of u interleaved with dv += P^T dO, dk += dS^T Q of u - 1 (P, dS of u - 1 held as
// bf16 A fragments across the barrier).
template <int HD> __global__ void __launch_bounds__(128) fused_dkv_kernel(FusedArgs p) {
  using P = Plan<HD>;
  static_assert(!P::kWide && P::kDkvThreads == 128, "4 warps x 16 keys = the 64-key tile");
  constexpr int LD = P::LD, KS = HD / 16, DT = HD / 8, RC = kRowChunk, RT = RC / 8, TH = 128;
  extern __shared__ __align__(128) unsigned char smem[];
  const DkvSmem<HD> sm(smem);
  const DkvWork wk = dkv_work(p);
  if (wk.n == wk.n_end) return;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  dkv_first_unit<HD, TH>(p, sm, wk);
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = dv[d][e] = 0.f;
  const int kw = 16 * w;  // this warp's keys within the tile
  const int key[2] = {wk.j0 + kw + (lane >> 2), wk.j0 + kw + (lane >> 2) + 8};
  const bf16* Kw = sm.Ks + kw * LD;
  const bf16* Vw = sm.Vs + kw * LD;
  uint32_t pf[RT / 2][4], dsf[RT / 2][4];  // P and dS of the previous unit (A fragments of dv / dk)
  int n = wk.n, rc = 0, stage = 0, pstage = 0;
  bool have_prev = false;
  while (n < wk.n_end) {
    int nn, nrc;
    const int nstage = dkv_unit_top<HD, TH>(p, sm, wk, n, rc, stage, nn, nrc);
    float st[RT][4], dpt[RT][4];
#pragma unroll
    for (int nt = 0; nt < RT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.f;
    if (have_prev)
      mma_nk2_with_kn2<KS, RT, RT / 2, DT, LD, true>(st, Kw, sm.q(stage), dpt, Vw, sm.dout(stage), dv, pf,
                                                      sm.dout(pstage), dk, dsf, sm.q(pstage), lane);
    else
      mma_nk2_with_kn2<KS, RT, RT / 2, DT, LD, false>(st, Kw, sm.q(stage), dpt, Vw, sm.dout(stage), dv, pf,
                                                       sm.dout(pstage), dk, dsf, sm.q(pstage), lane);
    const float* lse = sm.lse(stage);
    const float* Dst = sm.D(stage);
    const int a = p.anchors[n], s0 = p.seq_begin[n];
    const bool masked = !ctx_tile_interior<kDkvKeys>(p, a, s0, wk.j0) || rc + RC > p.M;
#pragma unroll
    for (int nt = 0; nt < RT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 8 * nt + 2 * (lane & 3) + (e & 1), h = e >> 1;
        const bool vis = !masked || key_visible(p, sm.rowo, rc + i, key[h], a, s0);
        const float pr = vis ? exp2f(st[nt][e] * p.scale_log2 - lse[i] * kLog2e) : 0.f;
        st[nt][e] = pr;
        dpt[nt][e] = pr * (dpt[nt][e] - Dst[i]);
      }
    to_a_frags<RT / 2>(pf, st);
    to_a_frags<RT / 2>(dsf, dpt);
    have_prev = true;
    pstage = stage;
    stage = nstage;
    n = nn;
    rc = nrc;
  }
  // the last unit's products (its stage is not refilled)
  mma_regs_kn<RT / 2, DT, LD>(dv, pf, sm.dout(pstage), lane);
  mma_regs_kn<RT / 2, DT, LD>(dk, dsf, sm.q(pstage), lane);
  // dk, then dv (one pass each: 88 more SASS instructions at hd 128 than one loop over both, once per CTA)
  atomic_add_keys<HD>(p.dk32, dk, p.scale, key, wk.j1, p, wk.g, lane);
  atomic_add_keys<HD>(p.dv32, dv, 1.f, key, wk.j1, p, wk.g, lane);
}

// dS of the previous unit = P (handed over by the pair's even warp: hand, this lane's n-tiles) · (dP - D)
// (dprev, in place), as A fragments.
template <int RT>
__device__ __forceinline__ void ds_from_hand_over(uint32_t (&f)[RT / 2][4], float (&dprev)[RT][4], const float4* hand) {
#pragma unroll
  for (int nt = 0; nt < RT; ++nt) {
    const float4 pr = hand[nt * 32];
    dprev[nt][0] *= pr.x;
    dprev[nt][1] *= pr.y;
    dprev[nt][2] *= pr.z;
    dprev[nt][3] *= pr.w;
  }
  to_a_frags<RT / 2>(f, dprev);
}

// Wide head dims (256): 8 warps in 4 pairs, pair q owning keys [16q, 16q + 16) of the tile; the even warp
// of a pair computes P and owns dv, the odd one dP / dS and dk. Per unit u: the even warp computes S^T of u
// with dv += P^T dO of u - 1 in the same k loop and hands P of u over (fp32, shared memory, two parities);
// the odd warp computes dP^T of u with dk += dS^T Q of u - 1, dS of u - 1 from the P handed over one unit
// earlier (so the pair never waits for each other: the unit's one __syncthreads orders the hand-over).
template <int HD> __global__ void __launch_bounds__(256, 1) fused_dkv_pair_kernel(FusedArgs p) {
  using P = Plan<HD>;
  static_assert(P::kWide && P::kDkvThreads == 256, "8 warps: 4 pairs x 16 keys = the 64-key tile");
  constexpr int LD = P::LD, KS = HD / 16, DT = HD / 8, RC = kRowChunk, RT = RC / 8, TH = 256;
  extern __shared__ __align__(128) unsigned char smem[];
  const DkvSmem<HD> sm(smem);
  const DkvWork wk = dkv_work(p);
  if (wk.n == wk.n_end) return;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, pair = w >> 1;
  const bool owns_dk = (w & 1) != 0;  // warp-uniform role
  dkv_first_unit<HD, TH>(p, sm, wk);
  float acc[DT][4];  // dv (even warp) or dk (odd warp) of the pair's 16 keys x HD
#pragma unroll
  for (int d = 0; d < DT; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.f;
  const int kw = 16 * pair;  // this pair's keys within the tile
  const int key[2] = {wk.j0 + kw + (lane >> 2), wk.j0 + kw + (lane >> 2) + 8};
  const bf16* Aw = (owns_dk ? sm.Vs : sm.Ks) + kw * LD;
  float4* hand = reinterpret_cast<float4*>(sm.hand) + pair * RT * 32 + lane;  // parity q at + q·4·RT·32
  constexpr int kParity = 4 * RT * 32;
  uint32_t f[RT / 2][4];  // even: P of the previous unit; odd: dS of the previous unit (A fragments)
  float dprev[RT][4];     // odd: dP - D of the previous unit
  int n = wk.n, rc = 0, stage = 0, pstage = 0, parity = 0;
  bool have_prev = false;
  while (n < wk.n_end) {
    int nn, nrc;
    // the barrier also orders the hand-over: P of u - 1 is in, and u - 2's hand-over buffer is free
    const int nstage = dkv_unit_top<HD, TH>(p, sm, wk, n, rc, stage, nn, nrc);
    const bf16* Qs = sm.q(stage);
    const bf16* dOs = sm.dout(stage);
    const bf16* Qp = sm.q(pstage);
    const bf16* dOp = sm.dout(pstage);
    if (owns_dk && have_prev) ds_from_hand_over<RT>(f, dprev, hand + (parity ^ 1) * kParity);
    // even: S^T = K Q^T, dv += P^T dO (u - 1); odd: dP^T = V dO^T, dk += dS^T Q (u - 1)
    float t[RT][4];
#pragma unroll
    for (int nt = 0; nt < RT; ++nt) t[nt][0] = t[nt][1] = t[nt][2] = t[nt][3] = 0.f;
    if (have_prev)
      mma_nk_with_kn<KS, RT, RT / 2, DT, LD, true>(t, Aw, owns_dk ? dOs : Qs, acc, f, owns_dk ? Qp : dOp, lane);
    else
      mma_nk_with_kn<KS, RT, RT / 2, DT, LD, false>(t, Aw, owns_dk ? dOs : Qs, acc, f, owns_dk ? Qp : dOp, lane);
    if (!owns_dk) {
      const float* lse = sm.lse(stage);
      const int a = p.anchors[n], s0 = p.seq_begin[n];
      const bool masked = !ctx_tile_interior<kDkvKeys>(p, a, s0, wk.j0) || rc + RC > p.M;
#pragma unroll
      for (int nt = 0; nt < RT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 8 * nt + 2 * (lane & 3) + (e & 1), h = e >> 1;
          const bool vis = !masked || key_visible(p, sm.rowo, rc + i, key[h], a, s0);
          t[nt][e] = vis ? exp2f(t[nt][e] * p.scale_log2 - lse[i] * kLog2e) : 0.f;  // P
        }
        hand[parity * kParity + nt * 32] = make_float4(t[nt][0], t[nt][1], t[nt][2], t[nt][3]);
      }
      to_a_frags<RT / 2>(f, t);
    } else {
      const float* Dst = sm.D(stage);
#pragma unroll
      for (int nt = 0; nt < RT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dprev[nt][e] = t[nt][e] - Dst[8 * nt + 2 * (lane & 3) + (e & 1)];
    }
    have_prev = true;
    pstage = stage;
    stage = nstage;
    parity ^= 1;
    n = nn;
    rc = nrc;
  }
  __syncthreads();  // P of the last unit handed over
  if (owns_dk) ds_from_hand_over<RT>(f, dprev, hand + (parity ^ 1) * kParity);
  mma_regs_kn<RT / 2, DT, LD>(acc, f, owns_dk ? sm.q(pstage) : sm.dout(pstage), lane);  // the last unit's dk or dv
  atomic_add_keys<HD>(owns_dk ? p.dk32 : p.dv32, acc, owns_dk ? p.scale : 1.f, key, wk.j1, p, wk.g, lane);
}

__global__ void f32_to_bf16_kernel(bf16* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __float2bfloat16_rn(src[i]);
}

bool aligned16(const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data) & 15u) == 0; }

// The shapes and the inputs both directions read; each direction adds its own outputs (and dO, O).
FusedArgs make_args(const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk,
                    const Tensor& lse, const Tensor& anchors, const Tensor& seq_begin, const ops::BlockAttnSpec& spec) {
  FusedArgs p{};
  p.N = static_cast<int>(anchors.shape[0]);
  p.split_blocks = deterministic() ? std::max(p.N, 1) : kSplitBlocks;
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
  p.q = static_cast<const bf16*>(q.data);
  p.kc = static_cast<const bf16*>(k_ctx.data);
  p.vc = static_cast<const bf16*>(v_ctx.data);
  p.kb = static_cast<const bf16*>(k_blk.data);
  p.vb = static_cast<const bf16*>(v_blk.data);
  p.lse = static_cast<float*>(lse.data);
  return p;
}

// Shapes the kernels of head dim HD take (device limits aside): G·B <= kRows, B <= kMaxB.
template <int HD> bool rows_fit(const FusedArgs& p) { return p.M <= Plan<HD>::kRows && p.B >= 1 && p.B <= Plan<HD>::kMaxB; }

// One fused kernel launch with its dynamic shared memory (the opt-in attribute is set at every launch).
void launch_kernel(void (*kernel)(FusedArgs), dim3 grid, int threads, size_t smem, const Ctx& ctx, const FusedArgs& p) {
  DF_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<grid, threads, smem, stream_of(ctx)>>>(p);
  DF_CUDA_LAUNCH();
}
template <int HD> void check_rows_fit(const FusedArgs& p) {
  DF_CHECK(rows_fit<HD>(p), Internal, "block attention (fused): G·B " << p.M << ", B " << p.B << " at head dim " << HD);
}

template <int HD> void launch_forward(const Ctx& ctx, const FusedArgs& p) {
  using P = Plan<HD>;
  check_rows_fit<HD>(p);
  launch_kernel(fused_forward_kernel<HD>, dim3(unsigned(p.N), unsigned(p.nkv)), P::kThreads, P::kSmemFwd, ctx, p);
}
template <int HD> void launch_backward(const Ctx& ctx, const FusedArgs& p) {
  using P = Plan<HD>;
  check_rows_fit<HD>(p);
  launch_kernel(fused_dq_kernel<HD>, dim3(unsigned(p.N), unsigned(p.nkv)), P::kThreads, P::kSmemDq, ctx, p);
  const unsigned key_tiles = unsigned((p.T + kDkvKeys - 1) / kDkvKeys), splits = unsigned((p.N + p.split_blocks - 1) / p.split_blocks);
  if (key_tiles == 0) return;
  const dim3 grid(key_tiles, unsigned(p.nkv), splits);
  if constexpr (P::kWide) launch_kernel(fused_dkv_pair_kernel<HD>, grid, P::kDkvThreads, P::kSmemDkv, ctx, p);
  else launch_kernel(fused_dkv_kernel<HD>, grid, P::kDkvThreads, P::kSmemDkv, ctx, p);
}

template <class F> void dispatch_hd(int64_t hd, F&& f) {
  switch (hd) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    case 256: f(std::integral_constant<int, 256>{}); break;
    default: DF_CHECK(false, Internal, "block attention (fused): head dim " << hd << " not supported");
  }
}

// The current device's opt-in shared memory per block (227 KB on sm_90 / sm_100, 99 KB on sm_120), once
// per device; 0 when it cannot be read (then the fused path is refused).
size_t device_smem_optin() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    return 0;
  }
  int v = cached[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    cached[dev].store(v, std::memory_order_relaxed);
  }
  return static_cast<size_t>(v);
}

}  // namespace

bool block_attention_fused_supported(int64_t nh, int64_t nkv, int64_t hd, int64_t block_size) {
  if (nkv <= 0 || nh % nkv != 0 || block_size < 1) return false;
  FusedArgs p{};
  p.M = static_cast<int>(std::min<int64_t>((nh / nkv) * block_size, 1 << 20));
  p.B = static_cast<int>(std::min<int64_t>(block_size, 1 << 20));
  bool ok = false;
  size_t smem = 0;
  if (hd == 16 || hd == 32 || hd == 64 || hd == 128 || hd == 256) {
    dispatch_hd(hd, [&](auto h) {
      constexpr int HD = decltype(h)::value;
      ok = rows_fit<HD>(p);
      smem = Plan<HD>::kSmemMax;
    });
  }
  return ok && smem <= device_smem_optin();
}

bool block_attention_fused_usable(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (!aligned16(*t)) return false;
  return true;
}

void block_attention_fused_forward(const Ctx& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                                   const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk, const Tensor& v_blk,
                                   const Tensor& anchors, const Tensor& seq_begin, const ops::BlockAttnSpec& spec) {
  FusedArgs p = make_args(q, k_ctx, v_ctx, k_blk, v_blk, lse, anchors, seq_begin, spec);
  if (p.N == 0) return;
  p.o = static_cast<bf16*>(out.data);
  dispatch_hd(q.shape[2], [&](auto hd) { launch_forward<decltype(hd)::value>(ctx, p); });
}

void block_attention_fused_backward(const Ctx& ctx, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                                    const Tensor& dk_blk, const Tensor& dv_blk, const Tensor& dout, const Tensor& out,
                                    const Tensor& lse, const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx,
                                    const Tensor& k_blk, const Tensor& v_blk, const Tensor& anchors,
                                    const Tensor& seq_begin, const ops::BlockAttnSpec& spec) {
  FusedArgs p = make_args(q, k_ctx, v_ctx, k_blk, v_blk, lse, anchors, seq_begin, spec);
  cudaStream_t st = stream_of(ctx);
  const int64_t kv_elems = int64_t(p.T) * p.KVD;
  float* dkv32 = static_cast<float*>(scratch(ctx, ScratchSlot::AttnDkv32, sizeof(float) * 2 * std::max<int64_t>(1, kv_elems)));
  p.dk32 = dkv32;
  p.dv32 = dkv32 + kv_elems;
  DF_CUDA(cudaMemsetAsync(dkv32, 0, sizeof(float) * 2 * kv_elems, st));
  if (p.N > 0) {
    p.D = static_cast<float*>(scratch(ctx, ScratchSlot::AttnRowStats, sizeof(float) * size_t(p.N) * p.B * p.nh));
    p.out = static_cast<const bf16*>(out.data);
    p.dout = static_cast<const bf16*>(dout.data);
    p.dq = static_cast<bf16*>(dq.data);
    p.dkb = static_cast<bf16*>(dk_blk.data);
    p.dvb = static_cast<bf16*>(dv_blk.data);
    dispatch_hd(q.shape[2], [&](auto hd) { launch_backward<decltype(hd)::value>(ctx, p); });
  }
  if (kv_elems > 0) {
    const unsigned blocks = grid_stride_blocks(ctx, kv_elems, 256, 16);
    f32_to_bf16_kernel<<<blocks, 256, 0, st>>>(static_cast<bf16*>(dk_ctx.data), p.dk32, kv_elems);
    DF_CUDA_LAUNCH();
    f32_to_bf16_kernel<<<blocks, 256, 0, st>>>(static_cast<bf16*>(dv_ctx.data), p.dv32, kv_elems);
    DF_CUDA_LAUNCH();
  }
}

}  // namespace dflash::cuda
