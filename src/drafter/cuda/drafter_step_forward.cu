// The drafter step's network forward on CUDA (DrafterStepCuda::Impl::forward; drafter_step_common.cuh):
// follows DrafterNet's forward (src/drafter/drafter_net.cpp) operation for operation, same shapes and names.
#include <cuda_bf16.h>

#include <vector>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "block_attention.cuh"
#include "cuda_check.cuh"
#include "drafter_step_common.cuh"
#include "embedding.cuh"
#include "feature_noise.cuh"
#include "grouped_conv.cuh"
#include "head_norm_rope.cuh"
#include "matmul.cuh"
#include "rmsnorm.cuh"
#include "swiglu.cuh"

namespace dflash::cuda {
using namespace drafter_step;  // the step's internal types and helpers (drafter_step_common.cuh)

namespace {

// x_ctx [T, K*H] <- features [K, T, H] (16-byte vectors; H % 8 == 0)
__global__ void gather_features_kernel(Bf16x8* __restrict__ x, const Bf16x8* __restrict__ f, int64_t T, int K, int H8) {
  const int64_t n = T * K * H8, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t t = i / (int64_t(K) * H8), rem = i % (int64_t(K) * H8);
    const int l = int(rem / H8), h = int(rem % H8);
    x[i] = f[(int64_t(l) * T + t) * H8 + h];
  }
}

}  // namespace

Tensor DrafterStepCuda::Impl::forward(const train::DrafterBatch& b) {
  const Tensor& features = b.fb->features;
  const DrafterStepInput& in = *b.in;
  const int64_t Tn = features.shape[1];
  DF_CHECK(features.ndim == 3 && features.shape[0] == K && features.shape[2] == H && features.dtype == DType::BF16,
           Internal, "drafter step (CUDA): features " << features.shape_str() << ", expected BF16 [" << K << ", T, " << H << "]");
  const int64_t Nn = static_cast<int64_t>(in.anchors.size());
  DF_CHECK(Tn <= max_T && Nn <= max_N && Nn > 0, Internal,
           "drafter step (CUDA): " << Tn << " tokens / " << Nn << " anchors exceed " << max_T << " / " << max_N);
  DF_CHECK(H % 8 == 0 && QD % 8 == 0 && KV % 8 == 0 && I % 8 == 0, Internal, "drafter step (CUDA): widths must be multiples of 8");
  T = Tn;
  N = Nn;
  NB = N * B;
  block_rows = in.block_rows;
  cudaStream_t st = stream_of(ctx);
  mark(Phase::Other);
  // ---- context: x_ctx [T, K*H]; th = hidden_norm(fc(x_ctx))
  const int H8 = static_cast<int>(H / 8);
  gather_features_kernel<<<grid_of(ctx, T * K * H8), 256, 0, st>>>(static_cast<Bf16x8*>(x_ctx.t().data),
                                                               static_cast<const Bf16x8*>(features.data), T, int(K), H8);
  DF_CUDA_LAUNCH();
  Tensor xc = v2(x_ctx, T, K * H), fco = v2(fc_out, T, H), thv = v2(th, T, H);
  cuda::matmul_forward(ctx, fco, xc, w.fc, ops::Accumulate::No);
  cuda::rmsnorm_forward(ctx, thv, v1(rstd_h, T), fco, w.hidden_norm, eps);
  // Training noise on th; the backward needs no record of it (hidden_norm's backward reads fc_out).
  if (b.noise_std > 0.f) add_feature_noise(ctx, thv, b.noise_std, b.noise_seed, b.noise_counter);
  // ---- index inputs (host-built, uploaded)
  upload_i32(pos_ctx, in.ctx_pos);
  upload_i32(anchors, in.anchors);
  upload_i32(seq_begin, in.seq_begin);
  anchors_host = in.anchors;
  seq_begin_host = in.seq_begin;
  std::vector<int32_t> ids(static_cast<size_t>(NB)), pb(static_cast<size_t>(NB));
  for (int64_t n = 0; n < N; ++n) {
    const int32_t a = in.anchors[n];
    for (int64_t o = 0; o < B; ++o) {
      ids[n * B + o] = o == 0 ? in.tokens[a] : c.mask_token_id;
      pb[n * B + o] = in.ctx_pos[a] + static_cast<int32_t>(o);
    }
  }
  upload_i32(block_ids, ids);
  upload_i32(pos_blk, pb);
  Tensor posc = v1(pos_ctx, T), posb = v1(pos_blk, NB), an = v1(anchors, N), sb = v1(seq_begin, N);
  Tensor x = v2(x0, NB, H);
  cuda::embedding_forward(ctx, x, v1(block_ids, NB), embed);
  // ---- layers
  for (size_t li = 0; li < layers.size(); ++li) {
    LayerActs& a = layers[li];
    const LayerW& lw = w.layers[li];
    Tensor x_in = v2(a.x_in, NB, H);
    mark(Phase::Other);
    copy(x_in, x);
    Tensor xn = v2(a.xn, NB, H);
    mark(Phase::Other);
    cuda::rmsnorm_forward(ctx, xn, v1(a.rstd1, NB), x_in, lw.input_norm, eps);
    // DFlash2: the attention reads the prepare conv of xn (one projection gives both sides' kernels)
    Tensor attn_in = xn;
    if (d2) {
      mark(Phase::Gemm);
      cuda::matmul_forward(ctx, v2(a.dyn_attn, NB, D2), xn, lw.attn_conv_proj, ops::Accumulate::No);
      mark(Phase::Other);
      attn_in = v2(a.x_attn, NB, H);
      cuda::grouped_conv_forward(ctx, attn_in, xn, v2(a.dyn_attn, NB, D2), 0, conv_side(lw.attn_conv_base, 0), conv);
    }
    Tensor q_raw = v2(a.q_raw, NB, QD), q = v3(a.q, NB, nh, hd);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, q_raw, attn_in, lw.q_proj, ops::Accumulate::No);
    mark(Phase::Other);
    cuda::head_norm_rope_forward(ctx, q, v2(a.q_rstd, NB, nh), v3(a.q_raw, NB, nh, hd), lw.q_norm, posb, rope, eps);
    Tensor kb_raw = v2(a.kb_raw, NB, KV), kb = v3(a.kb, NB, nkv, hd), vb = v2(a.vb, NB, KV);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, kb_raw, attn_in, lw.k_proj, ops::Accumulate::No);
    mark(Phase::Other);
    cuda::head_norm_rope_forward(ctx, kb, v2(a.kb_rstd, NB, nkv), v3(a.kb_raw, NB, nkv, hd), lw.k_norm, posb, rope, eps);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, vb, attn_in, lw.v_proj, ops::Accumulate::No);
    Tensor kc_raw = v2(a.kc_raw, T, KV), kc = v3(a.kc, T, nkv, hd), vc = v2(a.vc, T, KV);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, kc_raw, thv, lw.k_proj, ops::Accumulate::No);
    mark(Phase::Other);
    cuda::head_norm_rope_forward(ctx, kc, v2(a.kc_rstd, T, nkv), v3(a.kc_raw, T, nkv, hd), lw.k_norm, posc, rope, eps);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, vc, thv, lw.v_proj, ops::Accumulate::No);
    Tensor attn = v3(a.attn, NB, nh, hd);
    mark(Phase::Attention);
    cuda::block_attention_forward(ctx, attn, v2(a.lse, NB, nh), q, kc, v3(a.vc, T, nkv, hd), kb, v3(a.vb, NB, nkv, hd),
                                  an, sb, anchors_host, seq_begin_host, attn_spec(li));
    Tensor x2 = v2(a.x2, NB, H);
    if (d2) {  // x2 = x_in + finish(o_proj(attn))
      mark(Phase::Gemm);
      cuda::matmul_forward(ctx, v2(a.o, NB, H), v2(a.attn, NB, QD), lw.o_proj, ops::Accumulate::No);
      mark(Phase::Other);
      cuda::grouped_conv_forward(ctx, x2, v2(a.o, NB, H), v2(a.dyn_attn, NB, D2), 1, conv_side(lw.attn_conv_base, 1), conv);
      add(x2, x_in);
    } else {
      mark(Phase::Other);
      copy(x2, x_in);
      mark(Phase::Gemm);
      cuda::matmul_forward(ctx, x2, v2(a.attn, NB, QD), lw.o_proj, ops::Accumulate::Yes);
    }
    Tensor xn2 = v2(a.xn2, NB, H);
    mark(Phase::Other);
    cuda::rmsnorm_forward(ctx, xn2, v1(a.rstd2, NB), x2, lw.post_norm, eps);
    Tensor mlp_in = xn2;
    if (d2) {
      mark(Phase::Gemm);
      cuda::matmul_forward(ctx, v2(a.dyn_mlp, NB, D2), xn2, lw.mlp_conv_proj, ops::Accumulate::No);
      mark(Phase::Other);
      mlp_in = v2(a.x_mlp, NB, H);
      cuda::grouped_conv_forward(ctx, mlp_in, xn2, v2(a.dyn_mlp, NB, D2), 0, conv_side(lw.mlp_conv_base, 0), conv);
    }
    Tensor gt = v2(a.g, NB, I), ut = v2(a.u, NB, I), act = v2(a.act, NB, I);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, gt, mlp_in, lw.gate_proj, ops::Accumulate::No);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, ut, mlp_in, lw.up_proj, ops::Accumulate::No);
    mark(Phase::Other);
    cuda::swiglu_forward(ctx, act, gt, ut);
    x = li + 1 < layers.size() ? v2(layers[li + 1].x_in, NB, H) : v2(x_last, NB, H);
    if (d2) {  // x_out = x2 + finish(down(act))
      mark(Phase::Gemm);
      cuda::matmul_forward(ctx, v2(a.f, NB, H), act, lw.down_proj, ops::Accumulate::No);
      mark(Phase::Other);
      cuda::grouped_conv_forward(ctx, x, v2(a.f, NB, H), v2(a.dyn_mlp, NB, D2), 1, conv_side(lw.mlp_conv_base, 1), conv);
      add(x, x2);
    } else {
      mark(Phase::Other);
      copy(x, x2);
      mark(Phase::Gemm);
      cuda::matmul_forward(ctx, x, act, lw.down_proj, ops::Accumulate::Yes);
    }
  }
  Tensor hf = v2(h_final, NB, H);
  cuda::rmsnorm_forward(ctx, hf, v1(rstd_f, NB), x, w.norm, eps);
  return hf;
}

}  // namespace dflash::cuda
