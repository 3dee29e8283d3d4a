// Block-prefix attention (DFlash training) on CUDA, fused flash-style kernels; see block_attention.cuh.
//
// Backward (scores recomputed): this file holds the dq kernel and the backward entry point; the dkv kernels
// are in block_attention_fused_dkv.cu.
//   dq kernel, per (block, kv head), same row layout: D = rowsum(dO o O) (saved), dq = scale · sum dS K,
//     and for the block's own keys (seen by this CTA's rows only, P and dS staged once in shared memory)
//     dk_blk = scale · dS^T Q, dv_blk = P^T dO, complete. Wide: key tiles of 32 (Q and dO of 96 rows take
//     99 KB of shared memory; S and dP of 32 keys are 32 registers next to dq's 128). Narrow: key tiles of
//     32 for blocks of up to 32 keys, 64 for larger blocks (dq_keys_for, block_attention_fused_common.cuh).
// Measured (the whole layer: block_attention_fused_common.cuh): three-stage cp.async pipelines alone for the
// wide dq and (previous) dkv kernels (203 / 178 KB) measured no gain (backward 9.31 vs 9.24 ms), so the dq
// kernel keeps two stages. Interleaving S and dP in the dq kernel (mma_rows_nk2) took the 8b layer's backward
// from 5.49 to 5.29 ms (27b: unchanged).
#include "block_attention.cuh"

#include <algorithm>
#include <cstdint>

#include "block_attention_fused_common.cuh"
#include "drafter_blas.cuh"

namespace dflash::cuda {
namespace {
using namespace fused_attn;  // the fused kernels' shared pieces (block_attention_fused_common.cuh)

// ---- backward: dq, D, and the block's own keys ------------------------------------------------------------
template <int HD, int DQK> __global__ void __launch_bounds__(Plan<HD>::kThreads) fused_dq_kernel(FusedArgs p) {
  using P = Plan<HD, DQK>;
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
      ldmatrix_x4_trans(x, smem_addr(dSs + (16 * k + bn_row(lane)) * LDP + 16 * kt + bn_col(lane)));
      ldmatrix_x4_trans(y, smem_addr(Qs + (16 * k + bt_row(lane)) * LD + 16 * c + bt_col(lane)));
      mma_bf16(dk[0], x, y[0], y[1]);
      mma_bf16(dk[1], x, y[2], y[3]);
      ldmatrix_x4_trans(x, smem_addr(Ps + (16 * k + bn_row(lane)) * LDP + 16 * kt + bn_col(lane)));
      ldmatrix_x4_trans(y, smem_addr(dOs + (16 * k + bt_row(lane)) * LD + 16 * c + bt_col(lane)));
      mma_bf16(dv[0], x, y[0], y[1]);
      mma_bf16(dv[1], x, y[2], y[3]);
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

__global__ void f32_to_bf16_kernel(bf16* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __float2bfloat16_rn(src[i]);
}

template <int HD, int DQK> void launch_dq_keys(const Ctx& ctx, const FusedArgs& p) {
  using P = Plan<HD, DQK>;
  launch_kernel(fused_dq_kernel<HD, DQK>, "fused_dq_kernel", dim3(unsigned(p.N), unsigned(p.nkv)), P::kThreads,
                P::kSmemDq, ctx, p);
}
// The default key tile where the device holds it, else the compact one (dq_keys_for).
template <int HD> void launch_dq(const Ctx& ctx, const FusedArgs& p) {
  check_rows_fit<HD>(p);
  const int keys = dq_keys_for<HD>(device_limits(backend_of(ctx).device).smem_per_block_optin, p.B);
  if (keys == Plan<HD>::kDqKeys) return launch_dq_keys<HD, Plan<HD>::kDqKeys>(ctx, p);
  if constexpr (!Plan<HD>::kWide) {
    if (keys == kCompactDqKeys) return launch_dq_keys<HD, kCompactDqKeys>(ctx, p);
  }
  DF_FAIL(Internal, "block attention (fused): no dq kernel of head dim " << HD << " fits "
                        << describe(device_limits(backend_of(ctx).device)) << " (block_attention_fused_supported "
                        << "should have sent this shape to the chunked path)", "");
}

}  // namespace

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
    dispatch_hd(q.shape[2], [&](auto hd) { launch_dq<decltype(hd)::value>(ctx, p); });
    launch_dkv(ctx, p, q.shape[2]);  // the context keys (block_attention_fused_dkv.cu)
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
