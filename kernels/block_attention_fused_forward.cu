// Block-prefix attention (DFlash training) on CUDA, fused flash-style kernels; see block_attention.cuh.
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
#include "block_attention.cuh"

#include <algorithm>
#include <cstdint>

#include "block_attention_fused_common.cuh"

namespace dflash::cuda {
namespace {
using namespace fused_attn;  // the fused kernels' shared pieces (block_attention_fused_common.cuh)

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
    for (int k = 0; k < KS; ++k)
      ldmatrix_x4(qf[k], smem_addr(Qs + (16 * w + a_row(lane)) * LD + 16 * k + a_col(lane)));
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

bool aligned16(const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data) & 15u) == 0; }

template <int HD> void launch_forward(const Ctx& ctx, const FusedArgs& p) {
  using P = Plan<HD>;
  check_rows_fit<HD>(p);
  launch_kernel(fused_forward_kernel<HD>, "fused_forward_kernel", dim3(unsigned(p.N), unsigned(p.nkv)), P::kThreads, P::kSmemFwd, ctx, p);
}

}  // namespace

bool block_attention_fused_supported(int64_t nh, int64_t nkv, int64_t hd, int64_t block_size) {
  if (nkv <= 0 || nh % nkv != 0 || block_size < 1) return false;
  FusedArgs p{};
  p.M = static_cast<int>(std::min<int64_t>((nh / nkv) * block_size, 1 << 20));
  p.B = static_cast<int>(std::min<int64_t>(block_size, 1 << 20));
  bool ok = false;
  if (hd == 16 || hd == 32 || hd == 64 || hd == 128 || hd == 256) {
    const size_t smem = current_device_limits().smem_per_block_optin;
    dispatch_hd(hd, [&](auto h) {
      constexpr int HD = decltype(h)::value;
      ok = rows_fit<HD>(p) && kernels_fit<HD>(smem, p.B);
    });
  }
  return ok;
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

}  // namespace dflash::cuda
