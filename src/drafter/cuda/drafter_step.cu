// The drafter's training step on CUDA; see drafter_step.cuh. This file: construction (every buffer
// allocated once), the accessors, the public entry points (forward_backward, forward_loss, backward_rows,
// optimizer_step) and the profiling. The passes they call are in drafter_step_forward.cu,
// drafter_step_backward.cu and drafter_step_loss.cu; the state they share is in drafter_step_common.cuh.
#include "drafter_step.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "adamw.cuh"
#include "backend.cuh"
#include "cuda_check.cuh"
#include "drafter/step_buffers.h"
#include "drafter_step_common.cuh"
#include "lm_loss.cuh"

namespace dflash::cuda {
using namespace drafter_step;  // the step's internal types and helpers (drafter_step_common.cuh)

namespace {

// The bf16 weights from the fp32 master weights (reset_from_params; optimizer_step refreshes them itself).
__global__ void f32_to_bf16_kernel(__nv_bfloat16* __restrict__ d, const float* __restrict__ s, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) d[i] = __float2bfloat16_rn(s[i]);
}

// The fp32 copies of bf16 weights (exact) that a DFlash2 drafter's ops read under the bf16 state.
__global__ void bf16_to_f32_kernel(float* __restrict__ d, const __nv_bfloat16* __restrict__ s, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) d[i] = __bfloat162float(s[i]);
}

}  // namespace

DrafterStepCuda::DrafterStepCuda(const DrafterConfig& cfg, const std::vector<ParamSpec>& layout, const Ctx& ctx,
                                 int64_t max_tokens, int64_t max_anchors, int64_t chunk_rows, OptimizerState state,
                                 uint64_t sr_seed)
    : impl_(new Impl()) {
  Impl& s = *impl_;
  s.c = cfg;
  s.ctx = ctx;
  s.state = state;
  s.sr_seed = sr_seed;
  const bool bf16_state = state == OptimizerState::Bf16;
  const Qwen3Config& L = cfg.layers;
  s.B = cfg.block_size;
  s.max_T = max_tokens;
  s.max_N = max_anchors;
  s.max_NB = max_anchors * s.B;
  s.max_R = max_anchors * (s.B - 1);
  s.chunk_rows = std::max<int64_t>(1, std::min(chunk_rows, s.max_R));
  s.H = L.hidden_size;
  s.K = static_cast<int64_t>(cfg.target_layer_ids.size());
  s.nh = L.num_attention_heads;
  s.nkv = L.num_key_value_heads;
  s.hd = L.head_dim;
  s.QD = s.nh * s.hd;
  s.KV = s.nkv * s.hd;
  s.I = L.intermediate_size;
  s.rope.theta = L.rope_theta;
  s.rope.rotary_dim = 0;
  s.eps = L.rms_norm_eps;
  s.V = L.vocab_size;
  s.d2 = cfg.arch == DraftArch::DFlash2;
  s.logit = ops::logit_spec(cfg);
  if (s.d2) {
    s.conv = {static_cast<int>(s.B), cfg.d2.conv_kernel_size, cfg.d2.conv_group_size};
    s.D2 = 2 * static_cast<int64_t>(cfg.d2.conv_kernel_size) * (s.H / cfg.d2.conv_group_size);
    s.SK = cfg.d2.selector_top_k;
    s.SR = cfg.d2.selector_rank;
  }
  for (const ParamSpec& p : layout) {
    size_t n = 1;
    for (int64_t d : p.shape) n *= static_cast<size_t>(d);
    s.P = std::max(s.P, p.offset + n);
  }
  // Every tensor starts at a multiple of 8 elements in the layouts we use; 16-byte vectors need it.
  for (const ParamSpec& p : layout)
    DF_CHECK(p.offset % 8 == 0, Internal, "drafter step (CUDA): parameter " << p.name << " at offset " << p.offset
                                                                              << " is not 16-byte aligned in bf16");
  const int64_t P = static_cast<int64_t>(s.P);
  if (!bf16_state) s.params = Buffer(Device::CUDA, DType::F32, {P});  // the bf16 state keeps no fp32 weights
  s.grads = Buffer(Device::CUDA, DType::F32, {P});
  const DType moments = bf16_state ? DType::BF16 : DType::F32;
  s.m = Buffer(Device::CUDA, moments, {P});
  s.v = Buffer(Device::CUDA, moments, {P});
  s.pbf = Buffer(Device::CUDA, DType::BF16, {P});
  s.m.zero();
  s.v.zero();
  s.grads.zero();
  // Views by name over the bf16 weights and the fp32 gradients.
  std::map<std::string, const ParamSpec*> by_name;
  for (const ParamSpec& p : layout) by_name[p.name] = &p;
  auto bind = [&](const std::string& name, Tensor& wt, Tensor& gt) {
    auto it = by_name.find(name);
    DF_CHECK(it != by_name.end(), Internal, "drafter step (CUDA): no parameter " << name << " in the layout");
    const ParamSpec& p = *it->second;
    wt = Tensor(static_cast<uint16_t*>(s.pbf.t().data) + p.offset, DType::BF16, Device::CUDA, {1});
    gt = Tensor(static_cast<float*>(s.grads.t().data) + p.offset, DType::F32, Device::CUDA, {1});
    wt.ndim = gt.ndim = static_cast<int>(p.shape.size());
    for (size_t d = 0; d < p.shape.size(); ++d) wt.shape[d] = gt.shape[d] = p.shape[d];
  };
  // fp32 master weights read as they are (the convs' base kernels and the codebooks: elementwise / gathers);
  // with the bf16 state, fp32 copies of them in masters32 (refresh_masters32).
  int64_t masters_n = 0;
  if (bf16_state)
    for (const ParamSpec& p : layout)
      if (p.name.find("conv.base_kernel") != std::string::npos || p.name.find("_codebook") != std::string::npos) {
        int64_t n = 1;
        for (int64_t d : p.shape) n *= d;
        masters_n += n;
      }
  if (masters_n > 0) s.masters32 = Buffer(Device::CUDA, DType::F32, {masters_n});
  int64_t masters_used = 0;
  auto bind_master = [&](const std::string& name, Tensor& wt, Tensor& gt) {
    bind(name, wt, gt);
    const int64_t off = static_cast<float*>(gt.data) - static_cast<float*>(s.grads.t().data);
    wt.dtype = DType::F32;
    if (!bf16_state) {
      wt.data = static_cast<float*>(s.params.t().data) + off;
      return;
    }
    const int64_t n = static_cast<int64_t>(gt.numel());
    DF_CHECK(masters_used + n <= masters_n, Internal, "drafter step (CUDA): fp32 copies of " << name << " overflow");
    wt.data = static_cast<float*>(s.masters32.t().data) + masters_used;
    s.master_ranges.push_back({off, masters_used, n});
    masters_used += n;
  };
  bind("fc.weight", s.w.fc, s.g.fc);
  bind("hidden_norm.weight", s.w.hidden_norm, s.g.hidden_norm);
  bind("norm.weight", s.w.norm, s.g.norm);
  s.w.layers.resize(static_cast<size_t>(L.num_hidden_layers));
  s.g.layers.resize(s.w.layers.size());
  for (size_t l = 0; l < s.w.layers.size(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerW &a = s.w.layers[l], &d = s.g.layers[l];
    bind(p + "input_layernorm.weight", a.input_norm, d.input_norm);
    bind(p + "self_attn.q_proj.weight", a.q_proj, d.q_proj);
    bind(p + "self_attn.k_proj.weight", a.k_proj, d.k_proj);
    bind(p + "self_attn.v_proj.weight", a.v_proj, d.v_proj);
    bind(p + "self_attn.o_proj.weight", a.o_proj, d.o_proj);
    bind(p + "self_attn.q_norm.weight", a.q_norm, d.q_norm);
    bind(p + "self_attn.k_norm.weight", a.k_norm, d.k_norm);
    bind(p + "post_attention_layernorm.weight", a.post_norm, d.post_norm);
    bind(p + "mlp.gate_proj.weight", a.gate_proj, d.gate_proj);
    bind(p + "mlp.up_proj.weight", a.up_proj, d.up_proj);
    bind(p + "mlp.down_proj.weight", a.down_proj, d.down_proj);
    if (s.d2) {
      bind(p + "attention_conv.kernel_projection.weight", a.attn_conv_proj, d.attn_conv_proj);
      bind(p + "mlp_conv.kernel_projection.weight", a.mlp_conv_proj, d.mlp_conv_proj);
      bind_master(p + "attention_conv.base_kernel", a.attn_conv_base, d.attn_conv_base);
      bind_master(p + "mlp_conv.base_kernel", a.mlp_conv_base, d.mlp_conv_base);
    }
  }
  if (s.d2) {
    bind("candidate_selector.hidden_projection.weight", s.w.sel_hidden_proj, s.g.sel_hidden_proj);
    bind_master("candidate_selector.predecessor_codebook", s.w.sel_pred_codebook, s.g.sel_pred_codebook);
    bind_master("candidate_selector.successor_codebook", s.w.sel_succ_codebook, s.g.sel_succ_codebook);
  }
  // The activations and scratch, each from the one list the dry run sums (drafter/step_buffers.h); every
  // entry of it is taken, and only those.
  std::map<std::string, train::StepBuffer> plan;
  for (const train::StepBuffer& b : train::drafter_step_buffers(cfg)) plan.emplace(b.name, b);
  std::set<std::string> taken;
  auto take = [&](const std::string& name) {
    const auto it = plan.find(name);
    DF_CHECK(it != plan.end(), Internal, "drafter step (CUDA): no buffer " << name << " in drafter_step_buffers");
    taken.insert(name);
    const train::StepBuffer& b = it->second;
    const DType dt = b.elem == train::StepElem::Act ? DType::BF16
                     : b.elem == train::StepElem::F32 ? DType::F32
                     : b.elem == train::StepElem::I32 ? DType::I32
                                                      : DType::U8;
    return Buffer(Device::CUDA, dt, {b.elements(s.max_T, s.max_N, s.B)});
  };
  s.x_ctx = take("x_ctx");
  s.fc_out = take("fc_out");
  s.th = take("th");
  s.rstd_h = take("rstd_h");
  s.pos_ctx = take("pos_ctx");
  s.block_ids = take("block_ids");
  s.pos_blk = take("pos_blk");
  s.anchors = take("anchors");
  s.seq_begin = take("seq_begin");
  s.x0 = take("x0");
  s.layers.resize(s.w.layers.size());
  for (LayerActs& a : s.layers) {
    a.kc_raw = take("layer.kc_raw");
    a.kc = take("layer.kc");
    a.kc_rstd = take("layer.kc_rstd");
    a.vc = take("layer.vc");
    a.x_in = take("layer.x_in");
    a.xn = take("layer.xn");
    a.rstd1 = take("layer.rstd1");
    a.q_raw = take("layer.q_raw");
    a.q = take("layer.q");
    a.q_rstd = take("layer.q_rstd");
    a.kb_raw = take("layer.kb_raw");
    a.kb = take("layer.kb");
    a.kb_rstd = take("layer.kb_rstd");
    a.vb = take("layer.vb");
    a.attn = take("layer.attn");
    a.lse = take("layer.lse");
    a.x2 = take("layer.x2");
    a.xn2 = take("layer.xn2");
    a.rstd2 = take("layer.rstd2");
    a.g = take("layer.g");
    a.u = take("layer.u");
    a.act = take("layer.act");
    if (s.d2) {
      a.dyn_attn = take("layer.dyn_attn");
      a.x_attn = take("layer.x_attn");
      a.o = take("layer.o");
      a.dyn_mlp = take("layer.dyn_mlp");
      a.x_mlp = take("layer.x_mlp");
      a.f = take("layer.f");
    }
  }
  s.x_last = take("x_last");
  s.h_final = take("h_final");
  s.rstd_f = take("rstd_f");
  s.h_rows = take("h_rows");
  s.t_rows = take("t_rows");
  s.dh_rows = take("dh_rows");
  s.row_idx = take("row_idx");
  s.teacher_idx = take("teacher_idx");
  s.labels = take("labels");
  s.row_w = take("row_w");
  s.loss_r = take("loss_r");
  s.kl_r = take("kl_r");
  s.am_q = take("am_q");
  s.am_p = take("am_p");
  s.workspace = s.f32(static_cast<int64_t>(ops::lm_loss_workspace_floats(s.chunk_rows, s.V, true)));
  s.dx = take("dx");
  s.dtmp = take("dtmp");
  s.dxn = take("dxn");
  s.d_act = take("d_act");
  s.dg = take("dg");
  s.du = take("du");
  s.d_attn = take("d_attn");
  s.dq = take("dq");
  s.dq_raw = take("dq_raw");
  s.dkb = take("dkb");
  s.dvb = take("dvb");
  s.dkb_raw = take("dkb_raw");
  s.dkc = take("dkc");
  s.dvc = take("dvc");
  s.dkc_raw = take("dkc_raw");
  s.d_th = take("d_th");
  s.d_fc = take("d_fc");
  s.d_out = take("d_out");
  if (s.d2) {
    s.d_dyn = take("d_dyn");
    s.d_conv = take("d_conv");
    s.topk_ids = take("topk_ids");
    s.topk_vals = take("topk_vals");
    s.label_logit = take("label_logit");
    s.cand = take("cand");
    s.unary = take("unary");
    s.gold = take("gold");
    s.covered = take("covered");
    s.pred = take("pred");
    s.u = take("u");
    s.sel_du = take("sel_du");
    s.du_bf = take("du_bf");
    s.scores = take("scores");
    s.d_unary = take("d_unary");
    s.sel_ce = take("sel_ce");
    s.sel_slot = take("sel_slot");
    s.sel_w = take("sel_w");
    s.dh_sel = take("dh_sel");
  }
  DF_CHECK(taken.size() == plan.size(), Internal,
           "drafter step (CUDA): " << plan.size() - taken.size() << " buffer(s) of drafter_step_buffers not allocated");
}

DrafterStepCuda::~DrafterStepCuda() { delete impl_; }
OptimizerState DrafterStepCuda::optimizer_state() const { return impl_->state; }
const Tensor& DrafterStepCuda::params() const { return impl_->params.t(); }
const Tensor& DrafterStepCuda::grads() const { return impl_->grads.t(); }
const Tensor& DrafterStepCuda::params_bf16() const { return impl_->pbf.t(); }
const Tensor& DrafterStepCuda::adam_m() const { return impl_->m.t(); }
const Tensor& DrafterStepCuda::adam_v() const { return impl_->v.t(); }
Tensor DrafterStepCuda::hidden() const { return Impl::v2(impl_->h_final, impl_->NB, impl_->H); }

void DrafterStepCuda::Impl::refresh_masters32() {
  for (const auto& r : master_ranges) {
    bf16_to_f32_kernel<<<grid_of(ctx, r[2]), 256, 0, stream_of(ctx)>>>(
        static_cast<float*>(masters32.t().data) + r[1], static_cast<const __nv_bfloat16*>(pbf.t().data) + r[0], r[2]);
    DF_CUDA_LAUNCH();
  }
}

void DrafterStepCuda::reset_from_params() {
  Impl& s = *impl_;
  const int64_t P = static_cast<int64_t>(s.P);
  if (s.state == OptimizerState::Fp32) {  // (the bf16 state: pbf is the weights, written by the caller)
    f32_to_bf16_kernel<<<grid_of(s.ctx, P), 256, 0, stream_of(s.ctx)>>>(static_cast<__nv_bfloat16*>(s.pbf.t().data),
                                                                  static_cast<const float*>(s.params.t().data), P);
    DF_CUDA_LAUNCH();
  } else {
    s.refresh_masters32();
  }
  DF_CUDA(cudaMemsetAsync(s.m.t().data, 0, s.m.t().nbytes(), stream_of(s.ctx)));
  DF_CUDA(cudaMemsetAsync(s.v.t().data, 0, s.v.t().nbytes(), stream_of(s.ctx)));
}

void DrafterStepCuda::set_frozen(const Tensor& embed, const Tensor& lm_head) {
  Impl& s = *impl_;
  for (const Tensor* t : {&embed, &lm_head})
    DF_CHECK(t->device == Device::CUDA && t->dtype == DType::BF16 && t->ndim == 2 && t->shape[0] == s.V &&
                 t->shape[1] == s.H,
             Internal, "drafter step (CUDA): embed/lm_head must be BF16 [" << s.V << ", " << s.H << "] on the device");
  s.embed = embed;
  s.lm_head = lm_head;
}

void DrafterStepCuda::set_selector_objective(SelectorCandidates candidates, bool stop_gradient) {
  impl_->sel_candidates = candidates;
  impl_->sel_stop_gradient = stop_gradient;
}

DrafterStepResult DrafterStepCuda::forward_backward(const train::DrafterBatch& b, ops::LossObjective objective) {
  Impl& s = *impl_;
  DF_CHECK(!s.embed.empty(), Internal, "drafter step (CUDA): set_frozen() first");
  s.sel_alpha = b.selector_alpha;
  s.mark(Phase::Other);
  DF_CUDA(cudaMemsetAsync(s.grads.t().data, 0, s.grads.t().nbytes(), stream_of(s.ctx)));
  Tensor hf = s.forward(b);
  DrafterStepResult res;
  // DFlash2: the selector needs the pass's top-K before any gradient (no fused gradient); row_w is written.
  s.loss_rows(b, hf, objective, true);
  if (s.R == 0) return res;
  if (s.d2) {
    s.selector_forward(b);
    s.selector_into_fused_dh(b.ready);
  }
  s.backward_from_rows(b.ready);
  s.mark(Phase::Count);  // closes the last interval
  s.download_rows(b, objective, res);  // after the backward is enqueued: no bubble before it
  return res;
}

DrafterStepResult DrafterStepCuda::forward_loss(const train::DrafterBatch& b, ops::LossObjective objective) {
  Impl& s = *impl_;
  DF_CHECK(!s.embed.empty(), Internal, "drafter step (CUDA): set_frozen() first");
  s.sel_alpha = b.selector_alpha;
  s.mark(Phase::Other);
  Tensor hf = s.forward(b);
  DrafterStepResult res;
  s.loss_rows(b, hf, objective, false);
  if (s.d2 && s.R > 0) s.selector_forward(b);
  s.mark(Phase::Count);
  s.download_rows(b, objective, res);
  return res;
}

void DrafterStepCuda::backward_rows(const train::DrafterBatch& b, const std::vector<float>& row_weight,
                                    ops::LossObjective objective) {
  Impl& s = *impl_;
  DF_CHECK(static_cast<int64_t>(row_weight.size()) == s.R, Internal,
           "drafter step (CUDA): " << row_weight.size() << " row weights for the last forward's " << s.R << " rows");
  DF_CHECK(objective != ops::LossObjective::KL || s.have_teacher, Internal,
           "drafter step (CUDA): the KL objective needs final_norm");
  s.sel_alpha = b.selector_alpha;
  cudaStream_t st = stream_of(s.ctx);
  s.mark(Phase::Other);
  DF_CUDA(cudaMemsetAsync(s.grads.t().data, 0, s.grads.t().nbytes(), st));
  if (s.R == 0) return;
  s.mark(Phase::Loss);
  copy_bytes(s.ctx, s.row_w.t().data, row_weight.data(), sizeof(float) * row_weight.size());
  s.backward_from_weights(b.ready, objective);
  s.mark(Phase::Count);
}

double DrafterStepCuda::optimizer_step(const ops::AdamWHyper& hyper, int64_t step, float clip) {
  Impl& s = *impl_;
  s.mark(Phase::Optimizer);
  if (s.state == OptimizerState::Bf16) {
    cuda::clip_adamw_step_bf16state(s.ctx, s.pbf.t(), s.grads.t(), s.m.t(), s.v.t(), hyper, step, clip, s.sr_seed);
    s.refresh_masters32();  // DFlash2's fp32-read tensors (none for DFlash)
  } else
    cuda::clip_adamw_step(s.ctx, s.params.t(), s.grads.t(), s.m.t(), s.v.t(), hyper, step, clip, s.pbf.t());
  s.mark(Phase::Count);
  return last_grad_norm(s.ctx);
}

void DrafterStepCuda::set_profiling(bool on) { impl_->profiling = on; }

std::vector<double> DrafterStepCuda::phase_ms() {
  Impl& s = *impl_;
  DF_CUDA(cudaStreamSynchronize(stream_of(s.ctx)));
  for (size_t i = 0; i + 1 < s.phases.size(); ++i) {
    if (s.phases[i] >= static_cast<int>(Phase::Count)) continue;
    float ms = 0.f;
    DF_CUDA(cudaEventElapsedTime(&ms, s.event_pool[i], s.event_pool[i + 1]));
    s.phase_sum[s.phases[i]] += ms;
  }
  s.phases.clear();
  std::vector<double> out = s.phase_sum;
  std::fill(s.phase_sum.begin(), s.phase_sum.end(), 0.0);
  return out;
}

}  // namespace dflash::cuda
