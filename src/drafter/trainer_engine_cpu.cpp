// The CPU engine of DrafterTrainer (see trainer_engine.h): float32 throughout, the reference every CUDA
// op is tested against (--optimizer-state bf16: fp32 storage whose weights and moments hold bf16 values). DrafterNet forward, the loss rows gathered and run through the chunked lm_head
// loss (its gradient fused into the same pass when the weights are known), the row gradients scattered
// back into the block stream, DrafterNet backward into the flat gradient buffer.
#include <cstring>
#include <functional>

#include "dflash/drafter_ops.h"
#include "dflash/ops.h"
#include "drafter/trainer_engine.h"

namespace dflash::train {
namespace {

Tensor rows_view(const Buffer& b, int64_t R) {
  Tensor t = b.t();
  t.shape[0] = R;
  return t;
}

void gather_rows(float* dst, const float* src, const std::vector<int32_t>& idx, int64_t H) {
  for (size_t r = 0; r < idx.size(); ++r)
    std::memcpy(dst + r * H, src + static_cast<size_t>(idx[r]) * H, sizeof(float) * static_cast<size_t>(H));
}

class CpuEngine final : public TrainerEngine {
 public:
  explicit CpuEngine(EngineSetup s)
      : ctx_(s.ctx), cfg_(s.cfg), objective_(s.loss == LossKind::KL ? ops::LossObjective::KL : ops::LossObjective::CE),
        chunk_rows_(s.chunk_rows), embed_(std::move(s.embed)), lm_head_(std::move(s.lm_head)),
        params_(std::move(s.params)), d2_(s.cfg.arch == DraftArch::DFlash2),
        logit_(ops::logit_spec(s.cfg)), sel_candidates_(s.selector_candidates),
        sel_stop_gradient_(s.selector_stop_gradient), state_(s.optimizer_state), sr_seed_(s.sr_seed) {
    const int64_t P = static_cast<int64_t>(params_.numel());
    // The bf16 state's twin: fp32 storage, bf16 values from the start (a fresh init, a --drafter).
    if (state_ == OptimizerState::Bf16) ops::round_to_bf16_inplace(params_.t());
    const int64_t H = cfg_.layers.hidden_size, V = cfg_.layers.vocab_size;
    grads_ = Buffer(Device::CPU, DType::F32, {P});
    m_ = Buffer(Device::CPU, DType::F32, {P});
    v_ = Buffer(Device::CPU, DType::F32, {P});
    grads_.zero();
    m_.zero();
    v_.zero();
    w_ = bind_drafter_views(cfg_, params_.ptr<float>());
    g_ = bind_drafter_views(cfg_, grads_.ptr<float>());
    net_ = std::make_unique<DrafterNet>(cfg_, ctx_, s.max_tokens, s.max_anchors);
    const int64_t max_rows = s.max_anchors * (cfg_.block_size - 1);
    auto f = [&](int64_t rows, int64_t cols) { return Buffer(Device::CPU, DType::F32, {rows, cols}); };
    h_rows_ = f(max_rows, H);
    t_rows_ = f(max_rows, H);
    dh_rows_ = f(max_rows, H);
    labels_ = Buffer(Device::CPU, DType::I32, {max_rows});
    row_w_ = Buffer(Device::CPU, DType::F32, {max_rows});
    ce_ = Buffer(Device::CPU, DType::F32, {max_rows});
    kl_ = Buffer(Device::CPU, DType::F32, {max_rows});
    am_q_ = Buffer(Device::CPU, DType::I32, {max_rows});
    am_p_ = Buffer(Device::CPU, DType::I32, {max_rows});
    workspace_ = Buffer(Device::CPU, DType::F32,
                        {static_cast<int64_t>(ops::lm_loss_workspace_floats(chunk_rows_, V, true))});
    if (d2_) {
      const int64_t K = cfg_.d2.selector_top_k, r = cfg_.d2.selector_rank;
      auto i32 = [&](std::initializer_list<int64_t> d) { return Buffer(Device::CPU, DType::I32, d); };
      topk_ids_ = i32({max_rows, K});
      topk_vals_ = f(max_rows, K);
      label_logit_ = Buffer(Device::CPU, DType::F32, {max_rows});
      cand_ = i32({max_rows, K});
      unary_ = f(max_rows, K);
      gold_ = i32({max_rows});
      covered_ = Buffer(Device::CPU, DType::U8, {max_rows});
      pred_ = i32({max_rows});
      u_ = f(max_rows, r);
      du_ = f(max_rows, r);
      scores_ = f(max_rows, K);
      d_unary_ = f(max_rows, K);
      sel_ce_ = Buffer(Device::CPU, DType::F32, {max_rows});
      sel_slot_ = i32({max_rows});
      sel_tok_ = i32({max_rows});
      sel_w_ = Buffer(Device::CPU, DType::F32, {max_rows});
      loss_ = Buffer(Device::CPU, DType::F32, {max_rows});
      dh_sel_ = f(max_rows, H);
    }
  }

  DType feature_dtype() const override { return DType::F32; }

  EngineRows forward(const DrafterBatch& b, bool with_grad) override {
    const FeatureBatch& fb = *b.fb;
    const LossRows& rows = *b.rows;
    const int64_t H = cfg_.layers.hidden_size, R = static_cast<int64_t>(rows.size());
    const bool have_teacher = !fb.final_norm.empty(), kl_loss = objective_ == ops::LossObjective::KL;
    if (with_grad) grads_.zero();
    sel_alpha_ = b.selector_alpha;
    in_ = *b.in;
    in_.features = fb.features;
    in_.noise_std = b.noise_std;
    Tensor hf = net_->forward(w_, embed_.t(), in_, b.noise_rng);
    hidden_ = hf;
    gather_rows(h_rows_.ptr<float>(), hf.ptr<float>(), rows.block_row, H);
    if (have_teacher) gather_rows(t_rows_.ptr<float>(), fb.final_norm.ptr<float>(), rows.teacher_at, H);
    std::memcpy(labels_.ptr<int32_t>(), rows.label.data(), sizeof(int32_t) * static_cast<size_t>(R));
    double wsum = 0;
    for (float x : rows.weight) wsum += x;
    float* rw = row_w_.ptr<float>();
    for (int64_t r = 0; r < R; ++r) rw[r] = static_cast<float>(rows.weight[r] / wsum);
    const Tensor h = rows_view(h_rows_, R), teacher = have_teacher ? rows_view(t_rows_, R) : Tensor();
    ops::LmLossRowsOut lo;
    lo.ce = rows_view(ce_, R);
    lo.kl = kl_loss ? rows_view(kl_, R) : Tensor();
    lo.argmax_q = rows_view(am_q_, R);
    lo.argmax_p = have_teacher ? rows_view(am_p_, R) : Tensor();
    // DFlash2: the unary gradient is fused into this pass as DFlash's; the selector term, which needs the pass's
    // top-K, joins afterwards through its sparse addend (no second lm_head pass).
    const bool fused = with_grad;
    if (d2_) {
      lo.topk_ids = rows_view(topk_ids_, R);
      lo.topk_vals = rows_view(topk_vals_, R);
      lo.label_logit = rows_view(label_logit_, R);
    }
    ops::lm_loss_forward(ctx_, lo, h, lm_head_.t(), rows_view(labels_, R), teacher, workspace_.t(), chunk_rows_,
                         fused ? rows_view(dh_rows_, R) : Tensor(), fused ? rows_view(row_w_, R) : Tensor(),
                         objective_, logit_);
    EngineRows out;
    out.loss = kl_loss ? kl_.ptr<float>() : ce_.ptr<float>();
    out.ce = ce_.ptr<float>();
    out.argmax_q = am_q_.ptr<int32_t>();
    out.argmax_p = have_teacher ? am_p_.ptr<int32_t>() : nullptr;
    if (d2_) {
      selector_forward(rows, R);
      out.unary = out.loss;
      float* loss = loss_.ptr<float>();
      const float* sce = sel_ce_.ptr<float>();
      for (int64_t r = 0; r < R; ++r) loss[r] = out.unary[r] + sel_alpha_ * sce[r];
      out.loss = loss;
      out.sel_ce = sce;
      out.covered = covered_.ptr<uint8_t>();
      out.sel_argmax = sel_tok_.ptr<int32_t>();
      out.topk_ids = topk_ids_.ptr<int32_t>();
      out.topk_vals = topk_vals_.ptr<float>();
      out.u = u_.ptr<float>();
    }
    if (fused) {
      if (d2_) {
        selector_backward(R);
        if (!sel_stop_gradient_) {
          ops::lm_loss_sparse_backward(ctx_, rows_view(dh_rows_, R), rows_view(cand_, R), rows_view(unary_, R),
                                       rows_view(d_unary_, R), lm_head_.t(), logit_, rows_view(dh_sel_, R));
        }
      }
      backward_from_rows(rows, b.ready);
    }
    return out;
  }

  void backward(const DrafterBatch& b, const std::vector<float>& weight) override {
    const LossRows& rows = *b.rows;
    const int64_t R = static_cast<int64_t>(rows.size());
    DF_CHECK(weight.size() == rows.size(), Internal, "drafter engine: " << weight.size() << " weights for " << R << " rows");
    grads_.zero();
    sel_alpha_ = b.selector_alpha;
    std::memcpy(row_w_.ptr<float>(), weight.data(), sizeof(float) * weight.size());
    const Tensor teacher = b.fb->final_norm.empty() ? Tensor() : rows_view(t_rows_, R);
    if (d2_) selector_backward(R);
    ops::lm_loss_backward(ctx_, rows_view(dh_rows_, R), rows_view(row_w_, R), objective_, rows_view(h_rows_, R),
                          lm_head_.t(), rows_view(labels_, R), teacher, workspace_.t(), chunk_rows_, logit_,
                          d2_ && !sel_stop_gradient_ ? rows_view(cand_, R) : Tensor(),
                          d2_ && !sel_stop_gradient_ ? rows_view(d_unary_, R) : Tensor());
    if (d2_ && !sel_stop_gradient_) add_dh_sel(R);
    backward_from_rows(rows, b.ready);
  }

  void zero_grads() override { grads_.zero(); }
  Tensor grads() override { return grads_.t(); }
  void scale_grads(float s) override { ops::scale_inplace(ctx_, grads_.t(), s); }

  double optimizer_step(const ops::AdamWHyper& hyper, int64_t step, float clip) override {
    const double norm = ops::clip_grad_global_norm(ctx_, grads_.t(), clip);
    check_grad_norm(norm, step - 1);
    if (state_ == OptimizerState::Bf16)
      ops::adamw_step_bf16state(ctx_, params_.t(), grads_.t(), m_.t(), v_.t(), hyper, step, sr_seed_);
    else
      ops::adamw_step(ctx_, params_.t(), grads_.t(), m_.t(), v_.t(), hyper, step);
    return norm;
  }

  Tensor last_hidden() override { return hidden_; }
  Tensor master_weights() override { return params_.t(); }
  Tensor adam_m() override { return m_.t(); }
  Tensor adam_v() override { return v_.t(); }
  void state_loaded() override {  // the views are the live buffers; the bf16 state rounds what was written
    if (state_ != OptimizerState::Bf16) return;
    for (const Buffer* b : {&params_, &m_, &v_}) ops::round_to_bf16_inplace(b->t());
  }

 private:
  void add_dh_sel(int64_t R) {  // dh += du W_h (the selector's gradient at the hidden rows)
    float* dh = dh_rows_.ptr<float>();
    const float* ds = dh_sel_.ptr<float>();
    for (size_t i = 0, n = static_cast<size_t>(R * cfg_.layers.hidden_size); i < n; ++i) dh[i] += ds[i];
  }
  // DFlash2 (docs/dflash2.md 3), after lm_loss_forward filled the top-K: the training candidates
  // (ops::selector_candidates applies --selector-candidates), u = h W_h^T, the teacher-forced scores (predecessor = token a+k-1) and
  // the selector CE per row.
  void selector_forward(const LossRows& rows, int64_t R) {
    int32_t* pred = pred_.ptr<int32_t>();
    for (int64_t r = 0; r < R; ++r) pred[r] = in_.tokens[rows.teacher_at[r]];
    ops::selector_candidates(ctx_, rows_view(cand_, R), rows_view(unary_, R), rows_view(gold_, R),
                             rows_view(covered_, R), rows_view(topk_ids_, R), rows_view(topk_vals_, R),
                             rows_view(labels_, R), rows_view(label_logit_, R), sel_candidates_);
    ops::matmul_forward(ctx_, rows_view(u_, R), rows_view(h_rows_, R), w_.sel_hidden_proj);
    ops::selector_forward(ctx_, rows_view(scores_, R), rows_view(sel_ce_, R), rows_view(sel_slot_, R),
                          rows_view(u_, R), rows_view(unary_, R), rows_view(cand_, R), rows_view(pred_, R),
                          rows_view(gold_, R), w_.sel_pred_codebook, w_.sel_succ_codebook);
    const int64_t K = cfg_.d2.selector_top_k;
    const int32_t* cand = cand_.ptr<int32_t>();
    const int32_t* slot = sel_slot_.ptr<int32_t>();
    int32_t* tok = sel_tok_.ptr<int32_t>();
    for (int64_t r = 0; r < R; ++r) tok[r] = cand[r * K + slot[r]];
  }
  // The selector term's gradient for the rows' weights in row_w_ (times alpha): d_unary (into the
  // lm_loss backward's sparse addend), dh_sel = du W_h, and the selector's own parameter gradients. With
  // stop-gradient only the selector's parameters move.
  void selector_backward(int64_t R) {
    const float* w = row_w_.ptr<float>();
    float* sw = sel_w_.ptr<float>();
    for (int64_t r = 0; r < R; ++r) sw[r] = sel_alpha_ * w[r];
    ops::selector_backward(ctx_, sel_stop_gradient_ ? Tensor() : rows_view(d_unary_, R), rows_view(du_, R),
                           g_.sel_pred_codebook, g_.sel_succ_codebook, rows_view(scores_, R), rows_view(sel_w_, R),
                           rows_view(u_, R), rows_view(cand_, R), rows_view(pred_, R), rows_view(gold_, R),
                           w_.sel_pred_codebook, w_.sel_succ_codebook);
    ops::matmul_backward(ctx_, sel_stop_gradient_ ? Tensor() : rows_view(dh_sel_, R), g_.sel_hidden_proj,
                         rows_view(du_, R), rows_view(h_rows_, R), w_.sel_hidden_proj);
  }

  // The row gradients dh_rows scattered into the block stream, then the drafter backward (reporting each
  // parameter's range of grads_ to ready once the net is done with it).
  void backward_from_rows(const LossRows& rows, const GradReady& ready) {
    const int64_t H = cfg_.layers.hidden_size, R = static_cast<int64_t>(rows.size());
    Tensor d_out = net_->d_out_buffer(static_cast<int64_t>(in_.anchors.size()) * cfg_.block_size);
    std::memset(d_out.data, 0, d_out.nbytes());
    float* dpo = d_out.ptr<float>();
    const float* dhr = dh_rows_.ptr<float>();
    for (int64_t r = 0; r < R; ++r)
      std::memcpy(dpo + static_cast<size_t>(rows.block_row[r]) * H, dhr + r * H, sizeof(float) * static_cast<size_t>(H));
    std::function<void(const Tensor&)> tensor_ready;  // the net reports tensors of g_: ranges of grads_
    if (ready)
      tensor_ready = [&](const Tensor& g) {
        const size_t begin = static_cast<size_t>(g.ptr<float>() - grads_.ptr<float>());
        ready(begin, begin + g.numel());
      };
    net_->backward(w_, g_, d_out, tensor_ready);
  }

  Ctx ctx_;
  DrafterConfig cfg_;
  ops::LossObjective objective_;
  int64_t chunk_rows_;
  Buffer embed_, lm_head_;       // [V, H] frozen
  Buffer params_, grads_, m_, v_;  // [P] flat
  DrafterViews w_, g_;
  std::unique_ptr<DrafterNet> net_;
  DrafterStepInput in_;
  Tensor hidden_;  // the last forward's final-normed hidden states (the net's buffer)
  // loss buffers [max_rows, ...]
  Buffer h_rows_, t_rows_, dh_rows_, labels_, row_w_, ce_, kl_, am_q_, am_p_, workspace_;
  // DFlash2
  bool d2_;
  ops::LogitSpec logit_;
  float sel_alpha_ = 1.f;  // the batch's (DrafterBatch::selector_alpha)
  SelectorCandidates sel_candidates_;
  bool sel_stop_gradient_;
  OptimizerState state_;  // Bf16: params_, m_, v_ hold bf16 values (ops::adamw_step_bf16state)
  uint64_t sr_seed_;
  Buffer topk_ids_, topk_vals_, label_logit_, cand_, unary_, gold_, covered_, pred_, u_, du_, scores_, d_unary_,
      sel_ce_, sel_slot_, sel_tok_, sel_w_, loss_, dh_sel_;
};

}  // namespace

std::unique_ptr<TrainerEngine> make_cpu_trainer_engine(EngineSetup setup) {
  return std::make_unique<CpuEngine>(std::move(setup));
}

}  // namespace dflash::train
