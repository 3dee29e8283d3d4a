// Block-prefix attention (DFlash training) on CUDA, fused flash-style kernels; see block_attention.cuh.
//
// Backward, context keys (the dq kernel and the backward entry point: block_attention_fused_backward.cu):
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
// 2026-12-01, the dkv kernels above (three stages, one barrier per 32-row unit, the previous unit's dK / dV
// products in the score products' k loop, no pair barrier, row tables), against the previous dkv kernels
// in one H200 call (probe backward, one layer): 8b 5.26 -> 4.12 ms, 27b window 9.20 -> 6.98 ms, 27b full
// 11.43 -> 8.74 ms; steps 8b CE 156.6 -> 150.5 ms, 27b 281.4 -> 269.1 ms. Registers (ptxas, sm_90a, no
// spills): dkv hd 128 248 (was 242; still 2 CTAs per SM), hd 256 pair 246 (was 234).
#include <cstdint>

#include "block_attention_fused_common.cuh"

namespace dflash::cuda {
namespace {
using namespace fused_attn;  // the fused kernels' shared pieces (block_attention_fused_common.cuh)

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
    cp_async16(smem_addr(Qs + i * (HD + 8) + v * 8), p.q + src, ok ? 16 : 0);
    cp_async16(smem_addr(dOs + i * (HD + 8) + v * 8), p.dout + src, ok ? 16 : 0);
  }
  if (threadIdx.x < 2 * RC) {
    const int so = soff[r0 + int(threadIdx.x) % RC];
    const float* src = int(threadIdx.x) < RC ? p.lse : p.D;
    cp_async4(smem_addr(stats + threadIdx.x), so >= 0 ? src + int64_t(n) * p.B * p.nh + so : src, so >= 0 ? 4 : 0);
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

template <int HD> void launch_dkv_kernels(const Ctx& ctx, const FusedArgs& p) {
  using P = Plan<HD>;
  const unsigned key_tiles = unsigned((p.T + kDkvKeys - 1) / kDkvKeys), splits = unsigned((p.N + p.split_blocks - 1) / p.split_blocks);
  if (key_tiles == 0) return;
  const dim3 grid(key_tiles, unsigned(p.nkv), splits);
  if constexpr (P::kWide) launch_kernel(fused_dkv_pair_kernel<HD>, "fused_dkv_pair_kernel", grid, P::kDkvThreads, P::kSmemDkv, ctx, p);
  else launch_kernel(fused_dkv_kernel<HD>, "fused_dkv_kernel", grid, P::kDkvThreads, P::kSmemDkv, ctx, p);
}

}  // namespace

void fused_attn::launch_dkv(const Ctx& ctx, const FusedArgs& p, int64_t hd) {
  dispatch_hd(hd, [&](auto h) { launch_dkv_kernels<decltype(h)::value>(ctx, p); });
}

}  // namespace dflash::cuda
