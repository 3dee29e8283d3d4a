// Block-prefix attention (DFlash training) on CUDA, fused flash-style kernels; see block_attention.cuh.
// Internal to those kernels, not an API: what their files share (arguments, tiling plan, fragment products,
// geometry, loads, host-side launch helpers; the PTX wrappers are mma_ptx.cuh's).
//   block_attention_fused_forward.cu   the forward kernel; supported / usable / forward entry points
//   block_attention_fused_backward.cu  the dq kernel (dq, D, the block's own dk / dv); backward entry point
//   block_attention_fused_dkv.cu       the dkv kernels (dk / dv of the context keys)
// Everything here is inline, a template or constexpr in dflash::cuda::fused_attn, so each .cu can include it;
// the __global__ kernels stay in anonymous namespaces of the .cu that launches them.
//
// FlashAttention-2 layout with mma.sync m16n8k16 (bf16 in, fp32 accumulate) and ldmatrix fragments:
// scores and probabilities never leave registers (the S accumulator fragments of two 8-key n-tiles are
// exactly the A fragment of P for the next product). Shapes: head dim 16/32/64/128 with G·B <= 64 query
// rows per kv head and block ("narrow", Plan<HD>::kRows = 64, 4 warps), and head dim 256 with G·B <= 96,
// B <= 32 ("wide", kRows = 96, 6 warps: the Qwen3.6-27B drafter, 24/4 heads x 256, B 16).
// Shared memory (bytes): narrow hd 128 fwd 69632, dq 70144 (32-key tiles; 104960 with the 64-key tiles
// of blocks over 32), dkv 88576; wide fwd 185856, dq 169728, dkv 187264. On a device whose opt-in limit
// is smaller (sm_120: 99 KB) the wide kernels (and narrow blocks over 32) are refused by
// block_attention_fused_supported, so the chunked path runs there instead of a failed launch.
// Measured (H200, one 27B layer, 512 blocks, T 4096, window 2048; ncu, before the dkv change noted in
// block_attention_fused_dkv.cu): fwd 1.97 ms, dq 2.80 ms, dkv 6.40 ms,
// each at 6-8 warps per SM (registers: 1 CTA per SM) and latency-bound (8.5 cycles per issued instruction
// in dkv). The dq kernel's own measurements: block_attention_fused_backward.cu.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend.cuh"
#include "block_attention.cuh"
#include "cuda_check.cuh"
#include "device_limits.cuh"
#include "mma_ptx.cuh"

namespace dflash::cuda::fused_attn {
using namespace ptx;  // the shared PTX wrappers (mma_ptx.cuh)

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
  bool full_block;  // sliding layers: the whole block visible (BlockAttnSpec::full_block)
  int block_rows;   // block keys at offsets >= block_rows are hidden (BlockAttnSpec::block_rows; forward only)
  int split_blocks;  // blocks per dkv CTA: kSplitBlocks, or N in deterministic mode (one CTA per key tile
                     // and head, so each dK/dV element gets exactly one atomic add: no order to vary)
  int64_t QD, KVD;
  float scale, scale_log2;  // scale, scale·log2(e)
};

// The dq kernel's keys per tile: 32 (wide); narrow head dims have two variants, 64 keys (the plan's
// default: blocks of up to 64 keys) and 32 (half the K/V stage: 70144 B at head dim 128 instead of 104960).
// dq_keys_for chooses 32 wherever the block fits one tile: it fits sm_120's 99 KB per block, and on an H200
// it measured faster (8b layer backward 3.97 vs 4.12 ms, drafter_bench --attention-probe; three CTAs of
// 70 KB per SM instead of two of 105 KB).
constexpr int default_dq_keys(int hd) { return hd > 128 ? 32 : 64; }
constexpr int kCompactDqKeys = 32;

// Tiles and shared memory per head dim (see the comments at the top of this file and of each kernel's file).
template <int HD, int DQ_KEYS = default_dq_keys(HD)> struct Plan {
  static constexpr bool kWide = HD > 128;
  static constexpr int kRows = kWide ? 96 : 64;  // query rows per forward / dq CTA (G·B padded)
  static constexpr int kWarps = kRows / 16;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kFwdKeys = 64;
  static constexpr int kDqKeys = DQ_KEYS;
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
};

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
    ldmatrix_x4(b, smem_addr(Bs + (16 * np + bn_row(lane)) * LDB + 16 * k + bn_col(lane)));
    mma_bf16(acc[2 * np], a, b[0], b[1]);
    mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
  }
}
// The same with A [16 rows x 16·KS] from row-major [m][k] storage at As (row stride LDA).
template <int NT, int LDA, int LDB>
__device__ __forceinline__ void mma_step_nk(float (&acc)[NT][4], const bf16* As, const bf16* Bs, int k, int lane) {
  uint32_t a[4];
  ldmatrix_x4(a, smem_addr(As + a_row(lane) * LDA + 16 * k + a_col(lane)));
  mma_step_nk<NT, LDB>(acc, a, Bs, k, lane);
}
// n-tiles 2·np, 2·np + 1 of acc0 += a0 · b0 and of acc1 += a1 · b1 (b: the B fragments of two n-tiles), the
// two products' mma interleaved (independent accumulators back to back).
template <int NT>
__device__ __forceinline__ void mma_pair2(float (&acc0)[NT][4], float (&acc1)[NT][4], const uint32_t (&a0)[4],
                                          const uint32_t (&a1)[4], const uint32_t (&b0)[4], const uint32_t (&b1)[4],
                                          int np) {
  mma_bf16(acc0[2 * np], a0, b0[0], b0[1]);
  mma_bf16(acc1[2 * np], a1, b1[0], b1[1]);
  mma_bf16(acc0[2 * np + 1], a0, b0[2], b0[3]);
  mma_bf16(acc1[2 * np + 1], a1, b1[2], b1[3]);
}
// acc0 += A0 · B0^T and acc1 += A1 · B1^T over k-step k (all [..][k] row-major, row stride LD), their mma
// interleaved.
template <int NT, int LD>
__device__ __forceinline__ void mma_step_nk2(float (&acc0)[NT][4], float (&acc1)[NT][4], const bf16* A0, const bf16* B0,
                                             const bf16* A1, const bf16* B1, int k, int lane) {
  uint32_t a0[4], a1[4];
  ldmatrix_x4(a0, smem_addr(A0 + a_row(lane) * LD + 16 * k + a_col(lane)));
  ldmatrix_x4(a1, smem_addr(A1 + a_row(lane) * LD + 16 * k + a_col(lane)));
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    uint32_t b0[4], b1[4];
    ldmatrix_x4(b0, smem_addr(B0 + (16 * np + bn_row(lane)) * LD + 16 * k + bn_col(lane)));
    ldmatrix_x4(b1, smem_addr(B1 + (16 * np + bn_row(lane)) * LD + 16 * k + bn_col(lane)));
    mma_pair2(acc0, acc1, a0, a1, b0, b1, np);
  }
}
// acc n-tiles 2·np, 2·np + 1 += f · Cs over k-step k, Cs [k][n] row-major (row stride LDC).
template <int LDC, int DT>
__device__ __forceinline__ void mma_step_kn(float (&acc)[DT][4], const uint32_t (&f)[4], const bf16* Cs, int k, int np,
                                            int lane) {
  uint32_t c[4];
  ldmatrix_x4_trans(c, smem_addr(Cs + (16 * k + bt_row(lane)) * LDC + 16 * np + bt_col(lane)));
  mma_bf16(acc[2 * np], f, c[0], c[1]);
  mma_bf16(acc[2 * np + 1], f, c[2], c[3]);
}
// The same for two products at once, their mma interleaved.
template <int LDC, int DT>
__device__ __forceinline__ void mma_step_kn2(float (&acc0)[DT][4], const uint32_t (&f0)[4], const bf16* C0,
                                             float (&acc1)[DT][4], const uint32_t (&f1)[4], const bf16* C1, int k,
                                             int np, int lane) {
  uint32_t c0[4], c1[4];
  ldmatrix_x4_trans(c0, smem_addr(C0 + (16 * k + bt_row(lane)) * LDC + 16 * np + bt_col(lane)));
  ldmatrix_x4_trans(c1, smem_addr(C1 + (16 * k + bt_row(lane)) * LDC + 16 * np + bt_col(lane)));
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
  if (p.window > 0) return {max(s0, a + o - (p.window - 1)), min(p.full_block ? p.B : o + 1, p.block_rows)};
  return {s0, p.block_rows};
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
    cp_async16(smem_addr(dst + i * (HD + 8) + v * 8), src != nullptr ? src + v * 8 : any, src != nullptr ? 16 : 0);
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

// ---- host side ---------------------------------------------------------------------------------------------
// The shapes and the inputs both directions read; each direction adds its own outputs (and dO, O).
inline FusedArgs make_args(const Tensor& q, const Tensor& k_ctx, const Tensor& v_ctx, const Tensor& k_blk,
                           const Tensor& v_blk, const Tensor& lse, const Tensor& anchors, const Tensor& seq_begin,
                           const ops::BlockAttnSpec& spec) {
  FusedArgs p{};
  p.N = static_cast<int>(anchors.shape[0]);
  p.split_blocks = deterministic() ? std::max(p.N, 1) : kSplitBlocks;
  p.B = spec.block_size;
  p.nh = static_cast<int>(q.shape[1]);
  p.nkv = static_cast<int>(k_ctx.shape[1]);
  p.G = p.nh / p.nkv;
  p.M = p.G * p.B;
  p.window = spec.window;
  p.full_block = spec.full_block;
  p.block_rows = spec.visible_block_rows();
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

// The dq kernel's keys per tile for head dim HD and block size B on a device offering `smem` bytes per
// block (device_limits.cuh): narrow head dims take the compact 32-key variant when B <= 32 (see above),
// else the plan's default where it fits; 0 when none fits (the fused path cannot run there).
template <int HD> int dq_keys_for(size_t smem, int B) {
  if constexpr (!Plan<HD>::kWide) {
    if (B <= kCompactDqKeys && Plan<HD, kCompactDqKeys>::kSmemDq <= smem) return kCompactDqKeys;
  }
  if (Plan<HD>::kSmemDq <= smem) return Plan<HD>::kDqKeys;
  return 0;
}

// Whether the forward, dq and dkv kernels of head dim HD fit a device offering `smem` bytes per block.
template <int HD> bool kernels_fit(size_t smem, int B) {
  return Plan<HD>::kSmemFwd <= smem && Plan<HD>::kSmemDkv <= smem && dq_keys_for<HD>(smem, B) > 0;
}

// One fused kernel launch with its dynamic shared memory, checked against the device (fit_launch).
inline void launch_kernel(void (*kernel)(FusedArgs), const char* name, dim3 grid, int threads, size_t smem,
                          const Ctx& ctx, const FusedArgs& p) {
  fit_launch(kernel, name, threads, smem, backend_of(ctx).device);
  kernel<<<grid, threads, smem, stream_of(ctx)>>>(p);
  DF_CUDA_LAUNCH();
}
template <int HD> void check_rows_fit(const FusedArgs& p) {
  DF_CHECK(rows_fit<HD>(p), Internal, "block attention (fused): G·B " << p.M << ", B " << p.B << " at head dim " << HD);
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

// The dkv kernels of head dim hd (block_attention_fused_dkv.cu), launched after the dq kernel: dK / dV of the
// context keys, summed into p.dk32 / p.dv32.
void launch_dkv(const Ctx& ctx, const FusedArgs& p, int64_t hd);

}  // namespace dflash::cuda::fused_attn
