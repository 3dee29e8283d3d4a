// The drafter step's network backward on CUDA (DrafterStepCuda::Impl::backward; drafter_step_common.cuh):
// follows DrafterNet's backward (src/drafter/drafter_net.cpp) operation for operation, same shapes and names,
// and reports each parameter's gradient to its GradReady right after its last kernel is enqueued.
#include <cuda_bf16.h>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "block_attention.cuh"
#include "cuda_check.cuh"
#include "drafter_backward.cuh"
#include "drafter_blas.cuh"
#include "drafter_step_common.cuh"
#include "grouped_conv.cuh"
#include "matmul.cuh"

namespace dflash::cuda {
using namespace drafter_step;  // the step's internal types and helpers (drafter_step_common.cuh)

namespace {

// y += x (bf16, n8 vectors of 8)
__global__ void add_kernel(Bf16x8* __restrict__ y, const Bf16x8* __restrict__ x, int64_t n8) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += stride) {
    float a[8], b[8];
    unpack8(y[i], a);
    unpack8(x[i], b);
#pragma unroll
    for (int e = 0; e < 8; ++e) a[e] += b[e];
    y[i] = pack8(a);
  }
}

}  // namespace

void DrafterStepCuda::Impl::add(const Tensor& y, const Tensor& x) {
  DF_ASSERT(y.numel() == x.numel() && y.numel() % 8 == 0);
  const int64_t n8 = static_cast<int64_t>(y.numel() / 8);
  add_kernel<<<grid_of(ctx, n8), 256, 0, stream_of(ctx)>>>(static_cast<Bf16x8*>(y.data), static_cast<const Bf16x8*>(x.data), n8);
  DF_CUDA_LAUNCH();
}

void DrafterStepCuda::Impl::linear_din(const Tensor& din, const Tensor& dout, const Tensor& W, bool accumulate) {
  const int64_t O = W.shape[0], In = W.shape[1], Nr = static_cast<int64_t>(dout.numel()) / O;
  gemm_bf16(ctx, false, false, In, Nr, O, 1.f, {W.data, In, 0}, {dout.data, O, 0}, accumulate ? 1.f : 0.f, din.data,
            false, In, 0);
}

void DrafterStepCuda::Impl::linear_dw(const Tensor& dW, const Tensor& dout, const Tensor& in, const Tensor& W) {
  cuda::matmul_backward(ctx, Tensor(), dW, dout, in, W);
}

void DrafterStepCuda::Impl::conv_input_backward(const GradReady& ready, const Tensor& d, const Tensor& scratch,
                                                const Tensor& in, const Tensor& dyn, const Tensor& base,
                                                const Tensor& proj, const Tensor& d_base, const Tensor& d_proj) {
  const Tensor d_dynv = v2(d_dyn, NB, D2);
  mark(Phase::Other);
  cuda::grouped_conv_backward(ctx, scratch, d_dynv, conv_side(d_base, 0), d, in, dyn, 0, conv_side(base, 0), conv);
  report_ready(ready, d_base);
  mark(Phase::Gemm);
  linear_din(d, d_dynv, proj, false);
  mark(Phase::Gemm);
  linear_dw(d_proj, d_dynv, in, proj);
  report_ready(ready, d_proj);
  mark(Phase::Other);
  add(d, scratch);
}

void DrafterStepCuda::Impl::backward(const Tensor& d_outv, const GradReady& ready) {
  Tensor dxv = v2(dx, NB, H), dtmpv = v2(dtmp, NB, H), dxnv = v2(dxn, NB, H);
  Tensor xl = layers.empty() ? v2(x0, NB, H) : v2(x_last, NB, H);
  cuda::rmsnorm_backward(ctx, dxv, g.norm, d_outv, xl, w.norm, v1(rstd_f, NB));
  report_ready(ready, g.norm);
  Tensor thv = v2(th, T, H), d_thv = v2(d_th, T, H);
  bool th_written = false;
  Tensor posc = v1(pos_ctx, T), posb = v1(pos_blk, NB), an = v1(anchors, N), sb = v1(seq_begin, N);
  for (size_t li = layers.size(); li-- > 0;) {
    LayerActs& a = layers[li];
    const LayerW& lw = w.layers[li];
    const LayerW& lg = g.layers[li];
    // ---- MLP (dx is the gradient at this layer's output)
    Tensor gt = v2(a.g, NB, I), ut = v2(a.u, NB, I), act = v2(a.act, NB, I);
    Tensor d_actv = v2(d_act, NB, I), dgv = v2(dg, NB, I), duv = v2(du, NB, I);
    Tensor xn2 = v2(a.xn2, NB, H), x2 = v2(a.x2, NB, H);
    Tensor d_dynv = d2 ? v2(d_dyn, NB, D2) : Tensor(), d_convv = d2 ? v2(d_conv, NB, H) : Tensor();
    Tensor mlp_dout = dxv;  // the gradient at down_proj's output
    if (d2) {  // x_out = x2 + finish(f)
      mark(Phase::Other);
      cuda::grouped_conv_backward(ctx, d_convv, d_dynv, conv_side(lg.mlp_conv_base, 1), dxv, v2(a.f, NB, H),
                                  v2(a.dyn_mlp, NB, D2), 1, conv_side(lw.mlp_conv_base, 1), conv);
      mlp_dout = d_convv;
    }
    mark(Phase::Gemm);
    linear_din(d_actv, mlp_dout, lw.down_proj, false);
    mark(Phase::Gemm);
    linear_dw(lg.down_proj, mlp_dout, act, lw.down_proj);
    report_ready(ready, lg.down_proj);
    mark(Phase::Other);
    cuda::swiglu_backward(ctx, dgv, duv, d_actv, gt, ut);
    const Tensor mlp_in = d2 ? v2(a.x_mlp, NB, H) : xn2;
    mark(Phase::Gemm);
    linear_din(dxnv, dgv, lw.gate_proj, false);
    mark(Phase::Gemm);
    linear_din(dxnv, duv, lw.up_proj, true);
    mark(Phase::Gemm);
    linear_dw(lg.gate_proj, dgv, mlp_in, lw.gate_proj);
    report_ready(ready, lg.gate_proj);
    mark(Phase::Gemm);
    linear_dw(lg.up_proj, duv, mlp_in, lw.up_proj);
    report_ready(ready, lg.up_proj);
    if (d2) conv_input_backward(ready, dxnv, dtmpv, xn2, v2(a.dyn_mlp, NB, D2), lw.mlp_conv_base, lw.mlp_conv_proj,
                                lg.mlp_conv_base, lg.mlp_conv_proj);
    mark(Phase::Other);
    cuda::rmsnorm_backward(ctx, dtmpv, lg.post_norm, dxnv, x2, lw.post_norm, v1(a.rstd2, NB));
    report_ready(ready, lg.post_norm);
    mark(Phase::Other);
    add(dxv, dtmpv);  // dx is now the gradient at x2
    // ---- attention
    Tensor d_attnv = v3(d_attn, NB, nh, hd);
    Tensor o_dout = dxv;  // the gradient at o_proj's output
    if (d2) {  // x2 = x_in + finish(o)
      mark(Phase::Other);
      cuda::grouped_conv_backward(ctx, d_convv, d_dynv, conv_side(lg.attn_conv_base, 1), dxv, v2(a.o, NB, H),
                                  v2(a.dyn_attn, NB, D2), 1, conv_side(lw.attn_conv_base, 1), conv);
      o_dout = d_convv;
    }
    mark(Phase::Gemm);
    linear_din(d_attnv, o_dout, lw.o_proj, false);
    mark(Phase::Gemm);
    linear_dw(lg.o_proj, o_dout, v2(a.attn, NB, QD), lw.o_proj);
    report_ready(ready, lg.o_proj);
    Tensor q = v3(a.q, NB, nh, hd), kb = v3(a.kb, NB, nkv, hd), kc = v3(a.kc, T, nkv, hd);
    Tensor vb = v3(a.vb, NB, nkv, hd), vc = v3(a.vc, T, nkv, hd);
    Tensor dqv = v3(dq, NB, nh, hd), dkbv = v3(dkb, NB, nkv, hd), dvbv = v3(dvb, NB, nkv, hd);
    Tensor dkcv = v3(dkc, T, nkv, hd), dvcv = v3(dvc, T, nkv, hd);
    mark(Phase::Attention);
    cuda::block_attention_backward(ctx, dqv, dkcv, dvcv, dkbv, dvbv, d_attnv, v3(a.attn, NB, nh, hd),
                                   v2(a.lse, NB, nh), q, kc, vc, kb, vb, an, sb, anchors_host, seq_begin_host,
                                   attn_spec(li));
    Tensor dq_rawv = v3(dq_raw, NB, nh, hd);
    mark(Phase::Other);
    cuda::head_norm_rope_backward(ctx, dq_rawv, lg.q_norm, dqv, v3(a.q_raw, NB, nh, hd), lw.q_norm,
                                  v2(a.q_rstd, NB, nh), posb, rope, eps);
    report_ready(ready, lg.q_norm);
    Tensor dkb_rawv = v3(dkb_raw, NB, nkv, hd);
    mark(Phase::Other);
    cuda::head_norm_rope_backward(ctx, dkb_rawv, lg.k_norm, dkbv, v3(a.kb_raw, NB, nkv, hd), lw.k_norm,
                                  v2(a.kb_rstd, NB, nkv), posb, rope, eps);
    Tensor dkc_rawv = v3(dkc_raw, T, nkv, hd);
    mark(Phase::Other);
    cuda::head_norm_rope_backward(ctx, dkc_rawv, lg.k_norm, dkcv, v3(a.kc_raw, T, nkv, hd), lw.k_norm,
                                  v2(a.kc_rstd, T, nkv), posc, rope, eps);
    report_ready(ready, lg.k_norm);
    // block side: dxn = dq_raw Wq + dkb_raw Wk + dvb Wv (accumulated by the GEMMs)
    Tensor xn = v2(a.xn, NB, H);
    const Tensor attn_in = d2 ? v2(a.x_attn, NB, H) : xn;
    mark(Phase::Gemm);
    linear_din(dxnv, dq_rawv, lw.q_proj, false);
    mark(Phase::Gemm);
    linear_din(dxnv, dkb_rawv, lw.k_proj, true);
    mark(Phase::Gemm);
    linear_din(dxnv, dvbv, lw.v_proj, true);
    mark(Phase::Gemm);
    linear_dw(lg.q_proj, dq_rawv.reshape({NB, QD}), attn_in, lw.q_proj);
    report_ready(ready, lg.q_proj);
    mark(Phase::Gemm);
    linear_dw(lg.k_proj, dkb_rawv.reshape({NB, KV}), attn_in, lw.k_proj);
    mark(Phase::Gemm);
    linear_dw(lg.v_proj, dvbv.reshape({NB, KV}), attn_in, lw.v_proj);
    if (d2) conv_input_backward(ready, dxnv, dtmpv, xn, v2(a.dyn_attn, NB, D2), lw.attn_conv_base, lw.attn_conv_proj,
                                lg.attn_conv_base, lg.attn_conv_proj);
    // context side: d_th += dkc_raw Wk + dvc Wv
    mark(Phase::Gemm);
    linear_din(d_thv, dkc_rawv, lw.k_proj, th_written);
    mark(Phase::Gemm);
    linear_din(d_thv, dvcv, lw.v_proj, true);
    th_written = true;
    mark(Phase::Gemm);
    linear_dw(lg.k_proj, dkc_rawv.reshape({T, KV}), thv, lw.k_proj);
    mark(Phase::Gemm);
    linear_dw(lg.v_proj, dvcv.reshape({T, KV}), thv, lw.v_proj);
    report_ready(ready, lg.k_proj);
    report_ready(ready, lg.v_proj);
    // input_layernorm; the residual carries dx through
    mark(Phase::Other);
    cuda::rmsnorm_backward(ctx, dtmpv, lg.input_norm, dxnv, v2(a.x_in, NB, H), lw.input_norm, v1(a.rstd1, NB));
    report_ready(ready, lg.input_norm);
    mark(Phase::Other);
    add(dxv, dtmpv);
  }
  if (!th_written) DF_CUDA(cudaMemsetAsync(d_thv.data, 0, d_thv.nbytes(), stream_of(ctx)));
  Tensor d_fcv = v2(d_fc, T, H);
  cuda::rmsnorm_backward(ctx, d_fcv, g.hidden_norm, d_thv, v2(fc_out, T, H), w.hidden_norm, v1(rstd_h, T));
  report_ready(ready, g.hidden_norm);
  linear_dw(g.fc, d_fcv, v2(x_ctx, T, K * H), w.fc);
  report_ready(ready, g.fc);
}

}  // namespace dflash::cuda
