// Internal to the drafter step's CUDA files, not an API (that is drafter_step.cuh): DrafterStepCuda::Impl,
// the step's state (bf16 weight / fp32 gradient views, the activations the backward reads, the loss rows,
// the backward's scratch, the profiling events) and the helpers its parts share. Included by
//   drafter_step.cu           construction (every buffer, once), the public entry points, profiling
//   drafter_step_forward.cu   the network forward (context, index inputs, layers)
//   drafter_step_backward.cu  the network backward (layers in reverse; each gradient reported when final)
//   drafter_step_loss.cu      the loss rows: gather, fused lm_head + loss, download, their gradient scattered
// Everything here is a type or inline, so each .cu can include it; the small __global__ kernels stay in
// anonymous namespaces of the .cu that launches them.
// Shapes: T context tokens, N blocks of B rows (NB = N*B), H hidden, K target layers, nh/nkv heads of hd,
// QD = nh*hd, KV = nkv*hd, I intermediate, R loss rows, V vocabulary.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <array>
#include <vector>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "dflash/ops.h"
#include "drafter_step.cuh"

namespace dflash::cuda::drafter_step {

// Grid of the small grid-stride kernels (256 threads).
inline unsigned grid_of(const Ctx& ctx, int64_t n) { return grid_stride_blocks(ctx, n, 256, 16); }

// One layer's tensors by name: views over the flat bf16 weights (w) or fp32 gradients (g) of Impl.
// DFlash2 (empty for DFlash): the convs' kernel projections (bf16 weights / fp32 gradients, as the rest) and
// base kernels [2, k, H] (fp32 master weights / fp32 gradients: elementwise, never in a GEMM); the selector's
// hidden projection (bf16 / fp32) and codebooks [V, r] (fp32 master / fp32 gradients).
struct LayerW {
  Tensor input_norm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm, post_norm, gate_proj, up_proj, down_proj;
  Tensor attn_conv_proj, mlp_conv_proj, attn_conv_base, mlp_conv_base;
};
struct NetW {
  Tensor fc, hidden_norm, norm;
  std::vector<LayerW> layers;
  Tensor sel_hidden_proj, sel_pred_codebook, sel_succ_codebook;
};
// base kernel [2, k, H] -> side s's [k, H]
inline Tensor conv_side(const Tensor& base, int side) {
  const int64_t k = base.shape[1], H = base.shape[2];
  return Tensor(static_cast<float*>(base.data) + side * k * H, DType::F32, base.device, {k, H});
}

// What one layer's forward keeps for its backward (kc*, vc: the context side [T, ...]; the rest [NB, ...]).
struct LayerActs {
  Buffer kc_raw, kc, kc_rstd, vc, x_in, xn, rstd1, q_raw, q, q_rstd, kb_raw, kb, kb_rstd, vb, attn, lse, x2, xn2,
      rstd2, g, u, act;
  // DFlash2: the convs' dynamic kernels [NB, D2], the conv-prepared sublayer inputs and the sublayer outputs
  // before the finish conv [NB, H]
  Buffer dyn_attn, x_attn, o, dyn_mlp, x_mlp, f;
};

}  // namespace dflash::cuda::drafter_step

namespace dflash::cuda {

struct DrafterStepCuda::Impl {
  DrafterConfig c;
  Ctx ctx;
  int64_t max_T, max_N, max_NB, max_R, chunk_rows;
  int64_t H, K, nh, nkv, hd, QD, KV, I, B, V = 0;
  // DFlash2 (docs/dflash2.md): convs around every sublayer, the compute_logits transform, the selector term
  bool d2 = false;
  int64_t D2 = 0, SK = 0, SR = 0;  // dyn columns 2kG; selector top-K and rank
  ops::GroupedConvSpec conv;
  ops::LogitSpec logit;
  float sel_alpha = 1.f;  // this batch's (DrafterBatch::selector_alpha)
  SelectorCandidates sel_candidates = SelectorCandidates::Strict;
  bool sel_stop_gradient = false;
  Buffer d_dyn, d_conv;  // backward scratch [NB, D2], [NB, H]
  Buffer topk_ids, topk_vals, label_logit, cand, unary, gold, covered, pred, u, sel_du, du_bf, scores, d_unary, sel_ce,
      sel_slot, sel_w, dh_sel;
  ops::RopeSpec rope;
  float eps;
  size_t P = 0;
  // --optimizer-state: Fp32 fills params, m, v (F32) and pbf; Bf16 leaves params empty, pbf is the state,
  // m and v are BF16, and sr_seed keys the stochastic rounding (drafter_step.cuh).
  OptimizerState state = OptimizerState::Fp32;
  uint64_t sr_seed = 0;
  Buffer params, grads, m, v, pbf;
  // The bf16 state of a DFlash2 drafter: fp32 copies of the tensors its ops read as fp32 masters (the convs'
  // base kernels, the codebooks), refreshed from pbf after every update (exact: the values are bf16).
  // Each range: {offset in pbf, offset in masters32, elements}.
  Buffer masters32;
  std::vector<std::array<int64_t, 3>> master_ranges;
  void refresh_masters32();
  drafter_step::NetW w, g;  // bf16 weights / fp32 gradients
  Tensor embed, lm_head;
  // context / block inputs
  Buffer x_ctx, fc_out, th, rstd_h, pos_ctx, block_ids, pos_blk, anchors, seq_begin, x0;
  std::vector<drafter_step::LayerActs> layers;
  Buffer x_last, h_final, rstd_f;
  // loss
  Buffer h_rows, t_rows, dh_rows, row_idx, teacher_idx, labels, row_w, loss_r, kl_r, am_q, am_p, workspace;
  // backward scratch
  Buffer dx, dtmp, dxn, d_act, dg, du, d_attn, dq, dq_raw, dkb, dvb, dkb_raw, dkc, dvc, dkc_raw, d_th, d_fc, d_out;
  int64_t T = 0, N = 0, NB = 0;
  std::vector<int32_t> anchors_host, seq_begin_host;  // the batch's, for the attention chunk plans
  // profiling: events[i] opens an interval of phase phases[i] that events[i + 1] closes
  bool profiling = false;
  std::vector<cudaEvent_t> event_pool;
  std::vector<int> phases;
  std::vector<double> phase_sum = std::vector<double>(static_cast<size_t>(Phase::Count), 0.0);
  using Phase = DrafterStepCuda::Phase;
  void mark(Phase ph) {
    if (!profiling) return;
    const size_t i = phases.size();
    if (i == event_pool.size()) {
      cudaEvent_t e;
      DF_CUDA(cudaEventCreate(&e));
      event_pool.push_back(e);
    }
    DF_CUDA(cudaEventRecord(event_pool[i], stream_of(ctx)));
    phases.push_back(static_cast<int>(ph));
  }

  Buffer f32(int64_t n) { return Buffer(Device::CUDA, DType::F32, {std::max<int64_t>(n, 4)}); }
  static Tensor dev(DType t, void* p, std::initializer_list<int64_t> dims) { return Tensor(p, t, Device::CUDA, dims); }
  static Tensor v2(const Buffer& b, int64_t r, int64_t c) { return dev(b.t().dtype, b.t().data, {r, c}); }
  static Tensor v3(const Buffer& b, int64_t r, int64_t h, int64_t d) { return dev(b.t().dtype, b.t().data, {r, h, d}); }
  static Tensor v1(const Buffer& b, int64_t n) { return dev(b.t().dtype, b.t().data, {n}); }

  // The last forward's DrafterStepInput::block_rows rides along: a backward after a forward of shortened
  // blocks is refused by the op (block_attention_backward takes whole blocks only).
  int block_rows = 0;
  ops::BlockAttnSpec attn_spec(size_t layer) const {
    ops::BlockAttnSpec s = ops::drafter_attn_spec(c, layer);
    s.block_rows = block_rows;
    return s;
  }

  // y += x (bf16, numel % 8 == 0)
  void add(const Tensor& y, const Tensor& x);
  void copy(const Tensor& dst, const Tensor& src) {
    DF_CUDA(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, stream_of(ctx)));
  }
  // din [N, I] (=, or += when accumulate) dout [N, O] · W [O, I]
  void linear_din(const Tensor& din, const Tensor& dout, const Tensor& W, bool accumulate);
  // dW [O, I] (fp32) += dout^T · in
  void linear_dw(const Tensor& dW, const Tensor& dout, const Tensor& in, const Tensor& W);
  void upload_i32(const Buffer& dst, const std::vector<int32_t>& src) {
    DF_ASSERT(src.size() <= dst.numel());
    copy_bytes(ctx, dst.t().data, src.data(), sizeof(int32_t) * src.size());
  }

  Tensor forward(const train::DrafterBatch& b);
  // ready: see train::DrafterBatch::ready in drafter_step.cuh (may be empty).
  void backward(const Tensor& d_out, const GradReady& ready);
  // DFlash2, at a sublayer's input: d (the gradient at the conv-prepared input) becomes the gradient at the
  // normed input `in`: the prepare conv's din plus the kernel projection's (d_dyn's finish half is already
  // written); the conv's base and projection gradients reported. scratch [NB, H] is overwritten.
  void conv_input_backward(const GradReady& ready, const Tensor& d, const Tensor& scratch, const Tensor& in,
                           const Tensor& dyn, const Tensor& base, const Tensor& proj, const Tensor& d_base,
                           const Tensor& d_proj);
  // Reports gradient view gv (a tensor of `g` below) final to ready.
  void report_ready(const GradReady& ready, const Tensor& gv) const {
    if (!ready) return;
    const size_t begin = static_cast<size_t>(static_cast<const float*>(gv.data) - static_cast<const float*>(grads.t().data));
    ready(begin, begin + gv.numel());
  }
  // The loss rows of the last forward (hf) on the device, and dh_rows when grad.
  void loss_rows(const train::DrafterBatch& b, const Tensor& hf, ops::LossObjective objective, bool grad);
  // The per-row results and the weighted loss into res (synchronizes).
  void download_rows(const train::DrafterBatch& b, ops::LossObjective objective, DrafterStepResult& res);
  // d_out [NB, H] = dh_rows scattered to their block rows (zero elsewhere), then the drafter backward.
  void backward_from_rows(const GradReady& ready);
  // DFlash2 (drafter_step_selector.cu), after loss_rows filled the top-K: candidates, u = h W_h^T, scores and
  // CE per row (teacher-forced predecessors from the batch's tokens).
  void selector_forward(const train::DrafterBatch& b);
  // The selector term's gradient for the normalised row weights in row_w: d_unary and dh_sel (unless
  // stop-gradient), the selector's parameter gradients (reported to ready).
  void selector_backward(const GradReady& ready);
  // dh_rows from row_w: the lm_head loss's gradient (with the selector's sparse addend and dh_sel for
  // DFlash2), then the network backward.
  void backward_from_weights(const GradReady& ready, ops::LossObjective objective);
  // DFlash2 after a fused loss pass (dh_rows holds the unary gradient): the selector's gradient, its sparse
  // addend at the candidates' lm_head rows and dh_sel joined into dh_rows.
  void selector_into_fused_dh(const GradReady& ready);
  int64_t R = 0;              // loss rows of the last forward
  bool have_teacher = false;  // its teacher rows are in t_rows
};

}  // namespace dflash::cuda
