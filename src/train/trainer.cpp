// DrafterTrainer: the drafter rank's training step (see include/dflash/drafter.h).
//
// One step: anchors -> drafter forward -> loss rows (positive weight only) -> chunked lm_head loss with
// its gradient -> drafter backward into the flat gradient buffer. optimizer_step() clips and applies
// AdamW on the flat buffers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "dflash/anchors.h"
#include "dflash/drafter.h"
#include "dflash/drafter_model.h"
#include "dflash/drafter_ops.h"
#include "dflash/error.h"
#include "dflash/optim.h"
#include "dflash/safetensors.h"
#include "train/objective.h"

namespace dflash {

namespace {
// Logits held at once: about 16M floats (64 MB) per [rows, V] block.
constexpr size_t kLogitFloatsPerChunk = size_t{1} << 24;
}  // namespace

struct DrafterTrainer::Impl {
  TrainOptions opt;
  Ctx ctx;
  Qwen3Config target;
  DrafterConfig cfg;
  std::vector<ParamSpec> layout;
  int64_t max_tokens = 0;
  int64_t max_rows = 0;
  int64_t chunk_rows = 0;
  Buffer embed, lm_head;           // [V, H] frozen, from the target checkpoint
  Buffer params, grads, m, v;      // [P] flat
  DrafterViews w, g;
  std::unique_ptr<DrafterNet> net;
  AnchorSampler sampler;
  AnchorSampler eval_sampler;      // evaluation draws must not move the training stream
  Rng noise_rng;
  int64_t step = 0;
  // loss buffers [max_rows, ...]
  Buffer h_rows, t_rows, dh_rows, labels, row_w, ce, kl, am_q, am_p, workspace;
  // host scratch reused across steps
  train::LossRows rows;
  DrafterStepInput in;
  std::vector<int32_t> seq_end;
  std::vector<double> dpace;

  Impl(const TrainOptions& o, const Ctx& c) : opt(o), ctx(c), sampler(o.seed), eval_sampler(o.seed ^ 0x5eed5eedULL),
                                              noise_rng(o.seed * 0x9e3779b97f4a7c15ULL + 1) {}

  StepStats run(const FeatureBatch& fb, const std::vector<int64_t>& given, bool train);
};

DrafterTrainer::DrafterTrainer(const std::string& target_dir, const std::string& drafter_dir, int num_layers,
                               const TrainOptions& opt, const Ctx& ctx, int64_t max_tokens)
    : impl_(std::make_unique<Impl>(opt, ctx)) {
  Impl& s = *impl_;
  DF_CHECK(ctx.device == Device::CPU, BadOptions, "DrafterTrainer: only the CPU backend is implemented here");
  DF_CHECK_HINT(opt.max_anchors >= 1, BadOptions, "--max-anchors must be at least 1 (got " << opt.max_anchors << ")",
                "use e.g. --max-anchors 512");
  DF_CHECK(max_tokens >= 1, BadOptions, "drafter max_tokens " << max_tokens);
  DF_CHECK_HINT(opt.gamma > 0.f, BadOptions, "--gamma must be positive (got " << opt.gamma << ")", "DFlash uses 7");
  s.target = load_qwen3_config(target_dir + "/config.json");
  if (!drafter_dir.empty()) {
    s.cfg = load_drafter_config(drafter_dir + "/config.json");
  } else {
    s.cfg = fresh_drafter_config(s.target, num_layers, opt.block_size, opt.mask_token_id);
  }
  check_drafter_fits_target(s.cfg, s.target);
  for (const std::string& t : s.cfg.layers.layer_types)
    DF_CHECK_HINT(t == "full_attention" || t == "sliding_attention", BadInput,
                  "drafter layer type '" << t << "' is not supported (full_attention, sliding_attention)",
                  "DFlash drafters are Qwen3 decoder stacks");
  for (size_t l = 0; l < s.cfg.layers.layer_types.size(); ++l)
    DF_CHECK_HINT(s.cfg.layers.layer_types[l] != "sliding_attention" || s.cfg.layers.sliding_window > 0, BadInput,
                  "drafter layer " << l << " is sliding_attention but sliding_window is not set",
                  "set sliding_window in the drafter's config.json");
  s.layout = drafter_param_layout(s.cfg);
  const int64_t P = static_cast<int64_t>(drafter_param_count(s.cfg));
  s.params = Buffer(Device::CPU, DType::F32, {P});
  s.grads = Buffer(Device::CPU, DType::F32, {P});
  s.m = Buffer(Device::CPU, DType::F32, {P});
  s.v = Buffer(Device::CPU, DType::F32, {P});
  s.grads.zero();
  s.m.zero();
  s.v.zero();
  if (!drafter_dir.empty()) {
    load_drafter_weights(drafter_dir, s.cfg, s.params.ptr<float>());
  } else {
    init_drafter_weights(s.cfg, opt.seed, s.params.ptr<float>());
  }
  s.w = bind_drafter_views(s.cfg, s.params.ptr<float>());
  s.g = bind_drafter_views(s.cfg, s.grads.ptr<float>());

  // Frozen embedding and lm_head: only these two tensors of the target are read.
  const int64_t V = s.target.vocab_size, H = s.target.hidden_size;
  s.embed = Buffer(Device::CPU, DType::F32, {V, H});
  s.lm_head = Buffer(Device::CPU, DType::F32, {V, H});
  {
    Checkpoint ck(target_dir);
    ck.load_f32(s.target.weight_prefix + "embed_tokens.weight", {V, H}, s.embed.ptr<float>());
    if (s.target.tie_word_embeddings && !ck.has("lm_head.weight")) {
      std::memcpy(s.lm_head.ptr<float>(), s.embed.ptr<float>(), s.embed.t().nbytes());
    } else {
      ck.load_f32("lm_head.weight", {V, H}, s.lm_head.ptr<float>());
    }
  }

  const int64_t B = s.cfg.block_size;
  s.max_tokens = max_tokens;
  s.max_rows = static_cast<int64_t>(opt.max_anchors) * (B - 1);
  s.chunk_rows = std::max<int64_t>(1, std::min<int64_t>(s.max_rows, static_cast<int64_t>(kLogitFloatsPerChunk / V)));
  s.net = std::make_unique<DrafterNet>(s.cfg, ctx, max_tokens, opt.max_anchors);
  auto f = [&](int64_t rows, int64_t cols) { return Buffer(Device::CPU, DType::F32, {rows, cols}); };
  s.h_rows = f(s.max_rows, H);
  s.t_rows = f(s.max_rows, H);
  s.dh_rows = f(s.max_rows, H);
  s.labels = Buffer(Device::CPU, DType::I32, {s.max_rows});
  s.row_w = Buffer(Device::CPU, DType::F32, {s.max_rows});
  s.ce = Buffer(Device::CPU, DType::F32, {s.max_rows});
  s.kl = Buffer(Device::CPU, DType::F32, {s.max_rows});
  s.am_q = Buffer(Device::CPU, DType::I32, {s.max_rows});
  s.am_p = Buffer(Device::CPU, DType::I32, {s.max_rows});
  s.workspace = Buffer(Device::CPU, DType::F32,
                       {static_cast<int64_t>(ops::lm_loss_workspace_floats(s.chunk_rows, V, true))});
}

DrafterTrainer::~DrafterTrainer() = default;

const DrafterConfig& DrafterTrainer::config() const { return impl_->cfg; }
const std::vector<ParamSpec>& DrafterTrainer::param_layout() const { return impl_->layout; }
double DrafterTrainer::current_lr() const {
  const TrainOptions& o = impl_->opt;
  return lr_schedule(impl_->step, o.lr, o.warmup_steps, o.total_steps, o.min_lr_ratio);
}

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

}  // namespace

StepStats DrafterTrainer::Impl::run(const FeatureBatch& fb, const std::vector<int64_t>& given, bool train) {
  DF_CHECK(fb.batch != nullptr, Internal, "FeatureBatch without its PackedBatch");
  const PackedBatch& batch = *fb.batch;
  const int64_t T = batch.num_tokens(), H = cfg.layers.hidden_size, B = cfg.block_size;
  const int64_t K = static_cast<int64_t>(cfg.target_layer_ids.size());
  DF_CHECK(batch.num_seqs() >= 1 && batch.cu_seqlens.front() == 0 && batch.cu_seqlens.back() == T, BadInput,
           "packed batch: cu_seqlens does not cover the " << T << " tokens");
  DF_CHECK(batch.loss_mask.size() == static_cast<size_t>(T), BadInput,
           "packed batch: " << batch.loss_mask.size() << " loss_mask entries for " << T << " tokens");
  DF_CHECK(T <= max_tokens, BadInput, "packed batch of " << T << " tokens exceeds the drafter's limit " << max_tokens);
  DF_CHECK(fb.features.device == Device::CPU && fb.features.dtype == DType::F32 && fb.features.ndim == 3 &&
               fb.features.shape[0] == K && fb.features.shape[1] == T && fb.features.shape[2] == H,
           Internal, "drafter features " << fb.features.shape_str() << ", expected F32 [" << K << ", " << T << ", " << H
                                         << "] on the CPU");
  const bool kl_loss = opt.loss == LossKind::KL;
  const bool have_teacher = !fb.final_norm.empty();
  DF_CHECK_HINT(!kl_loss || have_teacher, Internal, "the KL objective needs the target's final_norm in the batch",
                "the target ranks must capture final_norm for --loss kl");
  if (have_teacher)
    DF_CHECK(fb.final_norm.dtype == DType::F32 && fb.final_norm.numel() == static_cast<size_t>(T * H), Internal,
             "final_norm " << fb.final_norm.shape_str() << ", expected [" << T << ", " << H << "]");

  // ---- anchors (global) and the sequence each belongs to
  std::vector<int64_t> anchors64 = given.empty() ? (train ? sampler : eval_sampler).sample(batch, opt.max_anchors)
                                                 : given;
  DF_CHECK(static_cast<int64_t>(anchors64.size()) <= opt.max_anchors, Internal,
           anchors64.size() << " anchors exceed max_anchors " << opt.max_anchors);
  in.anchors.clear();
  in.seq_begin.clear();
  seq_end.clear();
  in.ctx_pos.resize(static_cast<size_t>(T));
  for (int sq = 0; sq < batch.num_seqs(); ++sq)
    for (int32_t t = batch.cu_seqlens[sq]; t < batch.cu_seqlens[sq + 1]; ++t) in.ctx_pos[t] = t - batch.cu_seqlens[sq];
  for (int64_t a : anchors64) {
    DF_CHECK(a >= 0 && a < T, Internal, "anchor " << a << " outside the batch of " << T << " tokens");
    const auto it = std::upper_bound(batch.cu_seqlens.begin(), batch.cu_seqlens.end(), static_cast<int32_t>(a));
    const int sq = static_cast<int>(it - batch.cu_seqlens.begin()) - 1;
    in.anchors.push_back(static_cast<int32_t>(a));
    in.seq_begin.push_back(batch.cu_seqlens[sq]);
    seq_end.push_back(batch.cu_seqlens[sq + 1]);
  }
  StepStats st;
  st.tokens = T;
  st.anchors = static_cast<int64_t>(in.anchors.size());
  st.lr = lr_schedule(step, opt.lr, opt.warmup_steps, opt.total_steps, opt.min_lr_ratio);
  st.noise = train ? opt.hs_noise : 0.0;
  st.per_pos_acc.assign(static_cast<size_t>(B), 0.0);
  if (train) grads.zero();
  train::build_loss_rows(batch, in.anchors, seq_end, static_cast<int>(B), opt.gamma, rows);
  const int64_t R = static_cast<int64_t>(rows.size());
  if (R == 0) return st;  // nothing to learn from: zero gradients, zero loss

  // ---- drafter forward
  in.features = fb.features;
  in.tokens = batch.tokens.data();
  in.noise_std = train ? opt.hs_noise : 0.f;
  Tensor hf = net->forward(w, embed.t(), in, &noise_rng);

  // ---- loss rows
  gather_rows(h_rows.ptr<float>(), hf.ptr<float>(), rows.block_row, H);
  if (have_teacher) gather_rows(t_rows.ptr<float>(), fb.final_norm.ptr<float>(), rows.teacher_at, H);
  std::memcpy(labels.ptr<int32_t>(), rows.label.data(), sizeof(int32_t) * static_cast<size_t>(R));
  double wsum = 0;
  for (float x : rows.weight) wsum += x;
  float* rw = row_w.ptr<float>();
  for (int64_t r = 0; r < R; ++r) rw[r] = static_cast<float>(rows.weight[r] / wsum);
  const Tensor h = rows_view(h_rows, R), teacher = have_teacher ? rows_view(t_rows, R) : Tensor();
  const Tensor lab = rows_view(labels, R), rwt = rows_view(row_w, R), dh = rows_view(dh_rows, R);
  ops::LmLossRowsOut lo;
  lo.ce = rows_view(ce, R);
  lo.kl = kl_loss ? rows_view(kl, R) : Tensor();
  lo.argmax_q = rows_view(am_q, R);
  lo.argmax_p = have_teacher ? rows_view(am_p, R) : Tensor();
  const ops::LossObjective objective = kl_loss ? ops::LossObjective::KL : ops::LossObjective::CE;
  const bool fused = train && !opt.dpace;
  ops::lm_loss_forward(ctx, lo, h, lm_head.t(), lab, teacher, workspace.t(), chunk_rows, fused ? dh : Tensor(),
                       fused ? rwt : Tensor(), objective);
  const float* loss_r = kl_loss ? kl.ptr<float>() : ce.ptr<float>();
  double num = 0;
  for (int64_t r = 0; r < R; ++r) num += static_cast<double>(rows.weight[r]) * loss_r[r];
  st.loss = num / wsum;
  st.weight_sum = wsum;
  train::fill_metrics(rows, am_q.ptr<int32_t>(), have_teacher ? am_p.ptr<int32_t>() : nullptr,
                      static_cast<int64_t>(in.anchors.size()), static_cast<int>(B), st);
  DF_CHECK_HINT(std::isfinite(st.loss), NonFiniteLoss, "drafter loss is " << st.loss << " at step " << step,
                "lower --lr or check the target features for NaN/Inf");
  if (!train) return st;

  if (opt.dpace) {
    // D-PACE needs this step's probabilities before the gradient: weights from the forward, then the
    // backward recomputes the logits.
    train::dpace_factors(rows, ce.ptr<float>(), static_cast<int>(B), dpace);
    double dsum = 0;
    for (int64_t r = 0; r < R; ++r) dsum += rows.weight[r] * dpace[r];
    for (int64_t r = 0; r < R; ++r)
      rw[r] = dsum > 0 ? static_cast<float>(rows.weight[r] * dpace[r] / dsum) : static_cast<float>(rows.weight[r] / wsum);
    ops::lm_loss_backward(ctx, dh, rwt, objective, h, lm_head.t(), lab, teacher, workspace.t(), chunk_rows);
  }
  // ---- scatter the row gradients into the block stream and run the drafter backward
  Tensor d_out = net->d_out_buffer(static_cast<int64_t>(in.anchors.size()) * B);
  std::memset(d_out.data, 0, d_out.nbytes());
  float* dpo = d_out.ptr<float>();
  const float* dhr = dh_rows.ptr<float>();
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(dpo + static_cast<size_t>(rows.block_row[r]) * H, dhr + r * H, sizeof(float) * static_cast<size_t>(H));
  net->backward(w, g, d_out);
  return st;
}

StepStats DrafterTrainer::forward_backward(const FeatureBatch& fb, const std::vector<int64_t>& anchors) {
  return impl_->run(fb, anchors, true);
}

StepStats DrafterTrainer::evaluate(const FeatureBatch& fb, const std::vector<int64_t>& anchors) {
  return impl_->run(fb, anchors, false);
}

Tensor DrafterTrainer::grads() { return impl_->grads.t(); }

void DrafterTrainer::scale_grads(float s) {
  float* g = impl_->grads.ptr<float>();
  for (size_t i = 0; i < impl_->grads.numel(); ++i) g[i] *= s;
}

double DrafterTrainer::weights_checksum() {
  const float* p = impl_->params.ptr<float>();
  double sum = 0;
  for (size_t i = 0; i < impl_->params.numel(); ++i) sum += p[i] * static_cast<double>(i % 7 + 1);
  return sum;
}

double DrafterTrainer::optimizer_step() {
  Impl& s = *impl_;
  const double lr = current_lr();
  const double norm = ops::clip_grad_global_norm(s.ctx, s.grads.t(), s.opt.clip);
  DF_CHECK_HINT(std::isfinite(norm), NonFiniteLoss, "drafter gradient norm is " << norm << " at step " << s.step,
                "lower --lr or check the target features for NaN/Inf");
  ops::AdamWHyper hp;
  hp.lr = static_cast<float>(lr);
  hp.beta1 = s.opt.beta1;
  hp.beta2 = s.opt.beta2;
  hp.eps = s.opt.eps;
  hp.weight_decay = s.opt.weight_decay;
  ops::adamw_step(s.ctx, s.params.t(), s.grads.t(), s.m.t(), s.v.t(), hp, s.step + 1);
  ++s.step;
  return norm;
}

void DrafterTrainer::export_release(const std::string& dir, DType dtype) const {
  export_drafter(dir, impl_->cfg, impl_->params.ptr<float>(), dtype);
}

Tensor DrafterTrainer::master_weights() { return impl_->params.t(); }
Tensor DrafterTrainer::adam_m() { return impl_->m.t(); }
Tensor DrafterTrainer::adam_v() { return impl_->v.t(); }
int64_t DrafterTrainer::step() const { return impl_->step; }
void DrafterTrainer::set_step(int64_t s) { impl_->step = s; }

// Training anchors, evaluation anchors and feature noise, separated by '|' (the generators' text states
// are space-separated numbers).
std::string DrafterTrainer::rng_state() const {
  return impl_->sampler.state() + "|" + impl_->eval_sampler.state() + "|" + impl_->noise_rng.state();
}

void DrafterTrainer::set_rng_state(const std::string& s) {
  const size_t a = s.find('|'), b = a == std::string::npos ? a : s.find('|', a + 1);
  DF_CHECK_HINT(b != std::string::npos, BadInput, "malformed drafter rng state",
                "the checkpoint's rng state is damaged; resume from another checkpoint");
  impl_->sampler.set_state(s.substr(0, a));
  impl_->eval_sampler.set_state(s.substr(a + 1, b - a - 1));
  impl_->noise_rng.set_state(s.substr(b + 1));
}

}  // namespace dflash
