// DrafterTrainer: the drafter rank's training step (see include/dflash/drafter.h).
//
// One step: anchors -> drafter forward -> loss rows (positive weight only) -> chunked lm_head loss with
// its gradient -> drafter backward into the flat gradient buffer. optimizer_step() clips and applies
// AdamW on the flat buffers. What must mean the same on every backend (checks, anchors, loss rows,
// D-PACE weights, metrics, schedule, RNG) lives here; the network, loss and optimizer run in a backend
// engine (drafter/trainer_engine.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/device_runtime.h"  // fatal_no_cuda
#include "dflash/anchors.h"
#include "dflash/backend.h"
#include "dflash/drafter.h"
#include "dflash/drafter_model.h"
#include "dflash/drafter_ops.h"
#include "dflash/error.h"
#include "dflash/optim.h"
#include "dflash/safetensors.h"
#include "drafter/loss_chunk.h"
#include "drafter/objective.h"
#include "drafter/trainer_engine.h"

namespace dflash {

struct DrafterTrainer::Impl {
  TrainOptions opt;
  Ctx ctx;
  Qwen3Config target;
  DrafterConfig cfg;
  std::vector<ParamSpec> layout;
  int64_t max_tokens = 0;
  std::unique_ptr<train::TrainerEngine> engine;
  AnchorSampler sampler;
  AnchorSampler eval_sampler;      // evaluation draws must not move the training stream
  Rng noise_rng;                   // feature noise on the CPU
  uint64_t noise_seed = 0;         // feature noise on CUDA: counter-based, (seed, noise_calls)
  uint64_t noise_calls = 0;        // training forwards with noise so far
  int64_t step = 0;
  // host scratch reused across steps
  train::LossRows rows;
  DrafterStepInput in;
  std::vector<int32_t> seq_end;
  std::vector<double> dpace;
  std::vector<float> dpace_w;
  std::vector<int32_t> eval_argmax;  // argmax_q per row of the last forward-only run (draft_block)
  // DFlash2: the last forward-only run's strict top-K [R, K] and u [R, r] (draft_block's selector walk)
  std::vector<int32_t> eval_topk_ids;
  std::vector<float> eval_topk_vals, eval_u;
  // Gradient accumulation (MicroBatch): Σ s_i g_i of the step's micro-batches so far (F32 [P] on ctx's
  // device, allocated by the first MicroBatch::Accumulate) and how many it holds.
  Buffer accum;
  int64_t accumulated = 0;

  Impl(const TrainOptions& o, const Ctx& c) : opt(o), ctx(c), sampler(o.seed), eval_sampler(o.seed ^ 0x5eed5eedULL),
                                              noise_rng(o.seed * 0x9e3779b97f4a7c15ULL + 1),
                                              noise_seed(o.seed * 0x9e3779b97f4a7c15ULL + 2) {}

  // block_rows: DrafterStepInput::block_rows (draft_block's shortened last block; 0 = whole blocks).
  StepStats run(const FeatureBatch& fb, const std::vector<int64_t>& given, bool train, const GradHooks* hooks,
                MicroBatch micro = MicroBatch::Whole, int block_rows = 0);
  // grads() = s * grads() + accum over [b, e) (MicroBatch::Last, range by range).
  void fold(size_t b, size_t e, float s) {
    const Tensor g = engine->grads();
    const int64_t lo = static_cast<int64_t>(b), hi = static_cast<int64_t>(e);
    if (hi > lo) ops::grad_fold(ctx, g.slice_rows(lo, hi), accum.t().slice_rows(lo, hi), s);
  }
};

namespace {

// Passes an engine's final ranges on to GradHooks::ready and, once the engine returns, reports whatever it
// did not (all of it for an engine that reports nothing), so the caller sees [0, P) exactly once.
class ReadyRanges {
 public:
  // before (may be empty): applied to each range just before it is reported (MicroBatch::Last's fold); with
  // no ready hook, to all of [0, P) at once in finish().
  ReadyRanges(const GradHooks* hooks, size_t P, std::function<void(size_t, size_t)> before = {})
      : hooks_(hooks && hooks->ready ? hooks : nullptr), P_(P), before_(std::move(before)) {}
  // The callback for DrafterBatch::ready (empty without a ready hook).
  std::function<void(size_t, size_t)> callback() {
    if (!hooks_) return {};
    return [this](size_t b, size_t e) {
      DF_CHECK(b <= e && e <= P_, Internal, "drafter backward reported range [" << b << ", " << e << ") of " << P_);
      seen_.push_back({b, e});
      if (before_) before_(b, e);
      hooks_->ready(b, e);
    };
  }
  // Reports the rest, from the last element down (the backward's order).
  void finish() {
    if (!hooks_) {
      if (before_) before_(0, P_);
      return;
    }
    std::sort(seen_.begin(), seen_.end());
    std::vector<std::pair<size_t, size_t>> gaps;
    size_t at = 0;
    for (const auto& [b, e] : seen_) {
      DF_CHECK(b >= at, Internal, "drafter backward reported part of [" << b << ", " << e << ") twice");
      if (b > at) gaps.push_back({at, b});
      at = e;
    }
    if (at < P_) gaps.push_back({at, P_});
    for (size_t i = gaps.size(); i-- > 0;) {
      if (before_) before_(gaps[i].first, gaps[i].second);
      hooks_->ready(gaps[i].first, gaps[i].second);
    }
    seen_.clear();
  }

 private:
  const GradHooks* hooks_;
  size_t P_;
  std::function<void(size_t, size_t)> before_;
  std::vector<std::pair<size_t, size_t>> seen_;
};

}  // namespace

DrafterTrainer::DrafterTrainer(const std::string& target_dir, const std::string& drafter_dir, int num_layers,
                               const TrainOptions& opt, const Ctx& ctx, int64_t max_tokens)
    : DrafterTrainer(DrafterSource::from_dirs(target_dir, drafter_dir, num_layers, opt), opt, ctx, max_tokens) {}

DrafterTrainer::DrafterTrainer(const DrafterSource& source, const TrainOptions& opt, const Ctx& ctx, int64_t max_tokens)
    : impl_(std::make_unique<Impl>(opt, ctx)) {
  const std::string& target_dir = source.target_dir;
  const std::string& drafter_dir = source.drafter_dir;
  Impl& s = *impl_;
  DF_CHECK(ctx.device == Device::CPU || ctx.device == Device::CUDA, BadOptions, "DrafterTrainer: unknown backend");
  DF_CHECK_HINT(opt.max_anchors >= 1, BadOptions, "--max-anchors must be at least 1 (got " << opt.max_anchors << ")",
                "use e.g. --max-anchors 512");
  DF_CHECK_HINT(opt.anchors_per_record >= 0, BadOptions, "--anchors-per-record must be >= 0 (got " << opt.anchors_per_record << ")",
                "0 = per batch only; the reference trainers draw 512 per record");
  DF_CHECK(max_tokens >= 1, BadOptions, "drafter max_tokens " << max_tokens);
  DF_CHECK_HINT(opt.gamma > 0.f, BadOptions, "--gamma must be positive (got " << opt.gamma << ")", "DFlash uses 7");
  s.target = source.target;
  s.cfg = source.drafter;
  check_drafter_fits_target(s.cfg, s.target);
  for (const std::string& t : s.cfg.layers.layer_types)
    DF_CHECK_HINT(t == "full_attention" || t == "sliding_attention", BadInput,
                  "drafter layer type '" << t << "' is not supported (full_attention, sliding_attention)",
                  "DFlash drafters are Qwen3 decoder stacks");
  for (size_t l = 0; l < s.cfg.layers.layer_types.size(); ++l)
    DF_CHECK_HINT(s.cfg.layers.layer_types[l] != "sliding_attention" || s.cfg.layers.sliding_window > 0, BadInput,
                  "drafter layer " << l << " is sliding_attention but sliding_window is not set",
                  "set sliding_window in the drafter's config.json");
  DF_CHECK_HINT(ctx.device == Device::CPU || s.cfg.input_embedding_scale == 1.0f, BadOptions,
                "the CUDA drafter step does not scale the noise embedding (input_embedding_scale "
                    << s.cfg.input_embedding_scale << ") yet",
                "train this drafter with --backend cpu (docs/dflash2.md says what is built)");
  if (ctx.device == Device::CUDA && s.cfg.arch == DraftArch::DFlash2 && deterministic_kernels())
    std::printf("[dflash] note: deterministic kernels are on, but DFlash2's conv base-kernel and codebook gradients "
                "on CUDA are summed with atomics: steps are close, not bit-identical, across runs (docs/dflash2.md)\n");
  s.layout = drafter_param_layout(s.cfg);
  const int64_t P = static_cast<int64_t>(drafter_param_count(s.cfg));
  // Initial weights on the host, the same on every backend (the CUDA engine uploads them).
  train::EngineSetup es;
  es.params = Buffer(Device::CPU, DType::F32, {P});
  if (!drafter_dir.empty()) {
    load_drafter_weights(drafter_dir, s.cfg, es.params.ptr<float>());
  } else {
    init_drafter_weights(s.cfg, opt.seed, es.params.ptr<float>());
  }

  // Frozen embedding and lm_head: only these two tensors of the target are read.
  const int64_t V = s.target.vocab_size, H = s.target.hidden_size;
  es.embed = Buffer(Device::CPU, DType::F32, {V, H});
  es.lm_head = Buffer(Device::CPU, DType::F32, {V, H});
  {
    Checkpoint ck(target_dir);
    ck.load_f32(s.target.weight_prefix + "embed_tokens.weight", {V, H}, es.embed.ptr<float>());
    // Tied as Hugging Face ties them: embed_tokens is the head, whatever lm_head.weight the files hold.
    if (s.target.tie_word_embeddings) {
      std::memcpy(es.lm_head.ptr<float>(), es.embed.ptr<float>(), es.embed.t().nbytes());
      es.tied = true;
    } else {
      ck.load_f32("lm_head.weight", {V, H}, es.lm_head.ptr<float>());
    }
  }

  const int64_t B = s.cfg.block_size;
  s.max_tokens = max_tokens;
  const int64_t max_rows = static_cast<int64_t>(opt.max_anchors) * (B - 1);
  es.chunk_rows = train::loss_chunk_rows(ctx.device, V, max_rows);
  es.cfg = s.cfg;
  es.layout = s.layout;
  es.ctx = ctx;
  es.loss = opt.loss;
  es.max_tokens = max_tokens;
  es.max_anchors = opt.max_anchors;
  es.selector_candidates = opt.selector_candidates;
  es.selector_stop_gradient = opt.selector_stop_gradient;
  es.optimizer_state = opt.optimizer_state;
  // The stochastic rounding's key: from --seed, as the other streams above (Impl's constructor), so the
  // drafters, which all apply the same summed gradient, round alike and stay identical.
  es.sr_seed = opt.seed * 0x9e3779b97f4a7c15ULL + 3;
  if (ctx.device == Device::CPU) {
    s.engine = train::make_cpu_trainer_engine(std::move(es));
  } else {
    if (!train::make_cuda_trainer_engine) fatal_no_cuda("the drafter was asked to train on CUDA");
    s.engine = train::make_cuda_trainer_engine(std::move(es));
  }
}

namespace train {
void check_grad_norm(double norm, int64_t step) {
  DF_CHECK_HINT(std::isfinite(norm), NonFiniteLoss, "drafter gradient norm is " << norm << " at step " << step,
                "lower --lr or check the target features for NaN/Inf");
}
}  // namespace train

DrafterTrainer::~DrafterTrainer() = default;

const DrafterConfig& DrafterTrainer::config() const { return impl_->cfg; }
const std::vector<ParamSpec>& DrafterTrainer::param_layout() const { return impl_->layout; }
double DrafterTrainer::current_lr() const {
  const TrainOptions& o = impl_->opt;
  return lr_schedule(impl_->step, o.lr, o.warmup_steps, o.total_steps, o.min_lr_ratio);
}

namespace {
// A non-finite drafter loss: say whose problem it is. Non-finite values already in the target's features
// (or its final norm) come from the target -- its weights or its forward -- and no drafter setting fixes
// them; only a loss that went non-finite on clean inputs points at the drafter's training. Checked only
// here, on the way to the fatal error (a copy of the batch to the host).
[[noreturn]] void fail_non_finite_loss(const Ctx& ctx, const FeatureBatch& fb, double loss, int64_t step) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"features", &fb.features},
                                std::pair<const char*, const Tensor*>{"final norm", &fb.final_norm}}) {
    if (t->empty()) continue;
    std::vector<float> host(t->numel());
    copy_tensor(ctx, cpu_view(host.data(), {static_cast<int64_t>(host.size())}), *t);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < host.size(); ++i)
      if (!std::isfinite(host[i]) && bad++ == 0) first = i;
    if (bad == 0) continue;
    const int64_t row = static_cast<int64_t>(first) / t->shape[t->ndim - 1];
    fatal(ExitCode::NonFiniteLoss,
          "step " + std::to_string(step) + ": the target's " + name + " for this batch hold " + std::to_string(bad) +
              " non-finite value(s) (the first in row " + std::to_string(row) + " of " + t->shape_str() +
              "): the drafter's loss is " + std::to_string(loss) + " because its input is",
          "a target problem, not a drafter setting: check the target checkpoint (dflash-selftest on a golden case, "
          "its dtype) and its forward on --backend; lowering --lr will not help");
  }
  fatal(ExitCode::NonFiniteLoss, "drafter loss is " + std::to_string(loss) + " at step " + std::to_string(step) +
                                     " (the target's features are finite)",
        "lower --lr or add --warmup-steps; check the dataset for broken records");
}
}  // namespace

StepStats DrafterTrainer::Impl::run(const FeatureBatch& fb, const std::vector<int64_t>& given, bool train,
                                    const GradHooks* hooks, MicroBatch micro, int block_rows) {
  DF_CHECK(train || micro == MicroBatch::Whole, Internal, "evaluation is not a micro-batch");
  DF_CHECK(!train || micro != MicroBatch::Whole || accumulated == 0, Internal,
           "MicroBatch::Whole inside an accumulated step (" << accumulated << " micro-batch(es) accumulated)");
  DF_CHECK(fb.batch != nullptr, Internal, "FeatureBatch without its PackedBatch");
  const PackedBatch& batch = *fb.batch;
  const int64_t T = batch.num_tokens(), H = cfg.layers.hidden_size, B = cfg.block_size;
  const int64_t K = static_cast<int64_t>(cfg.target_layer_ids.size());
  DF_CHECK(batch.num_seqs() >= 1 && batch.cu_seqlens.front() == 0 && batch.cu_seqlens.back() == T, BadInput,
           "packed batch: cu_seqlens does not cover the " << T << " tokens");
  DF_CHECK(batch.loss_mask.size() == static_cast<size_t>(T), BadInput,
           "packed batch: " << batch.loss_mask.size() << " loss_mask entries for " << T << " tokens");
  DF_CHECK(T <= max_tokens, BadInput, "packed batch of " << T << " tokens exceeds the drafter's limit " << max_tokens);
  const DType fdt = engine->feature_dtype();
  const char* where = ctx.device == Device::CPU ? "on the CPU" : "on the GPU";
  DF_CHECK(fb.features.device == ctx.device && fb.features.dtype == fdt && fb.features.ndim == 3 &&
               fb.features.shape[0] == K && fb.features.shape[1] == T && fb.features.shape[2] == H,
           Internal, "drafter features " << dtype_name(fb.features.dtype) << " " << fb.features.shape_str()
                                         << ", expected " << dtype_name(fdt) << " [" << K << ", " << T << ", " << H
                                         << "] " << where);
  const bool kl_loss = opt.loss == LossKind::KL;
  const bool have_teacher = !fb.final_norm.empty();
  DF_CHECK_HINT(!kl_loss || have_teacher, Internal, "the KL objective needs the target's final_norm in the batch",
                "the target ranks must capture final_norm for --loss kl");
  if (have_teacher)
    DF_CHECK(fb.final_norm.device == ctx.device && fb.final_norm.dtype == fdt &&
                 fb.final_norm.numel() == static_cast<size_t>(T * H),
             Internal, "final_norm " << dtype_name(fb.final_norm.dtype) << " " << fb.final_norm.shape_str()
                                     << ", expected " << dtype_name(fdt) << " [" << T << ", " << H << "] " << where);

  // ---- anchors (global) and the sequence each belongs to
  std::vector<int64_t> anchors64 = given.empty() ? (train ? sampler : eval_sampler).sample(batch, opt.max_anchors, opt.anchors_per_record)
                                                 : given;
  DF_CHECK(static_cast<int64_t>(anchors64.size()) <= opt.max_anchors, Internal,
           anchors64.size() << " anchors exceed max_anchors " << opt.max_anchors);
  if (!train) eval_argmax.clear();
  DF_CHECK(!train || block_rows == 0, Internal, "a training step over shortened blocks (" << block_rows << " rows)");
  in.block_rows = block_rows;
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
  if (cfg.arch == DraftArch::DFlash2)
    st.selector_alpha = selector_alpha_schedule(step, opt.selector_loss_alpha, opt.selector_warmup_ratio,
                                                opt.selector_ramp_ratio, opt.total_steps);
  st.noise = train ? opt.hs_noise : 0.0;
  st.per_pos_acc.assign(static_cast<size_t>(B), 0.0);
  st.per_pos_rows.assign(static_cast<size_t>(B), 0.0);
  st.per_pos_correct.assign(static_cast<size_t>(B), 0.0);
  train::build_loss_rows(batch, in.anchors, seq_end, static_cast<int>(B), opt.gamma, rows);
  const int64_t R = static_cast<int64_t>(rows.size());
  // The normalisation is known here, before any gradient work: GradHooks::begin gets it first.
  double wsum = 0;
  for (float x : rows.weight) wsum += x;
  // Gradient accumulation: an Accumulate micro-batch reports nothing (its gradient goes into accum once the
  // backward is done); the Last one folds each range into the accumulated sum before reporting it.
  const size_t P = static_cast<size_t>(engine->grads().numel());
  if (micro != MicroBatch::Whole)
    DF_CHECK(micro == MicroBatch::Accumulate || accumulated > 0, Internal,
             "MicroBatch::Last without an accumulated micro-batch before it (use Whole)");
  if (micro == MicroBatch::Accumulate && accum.t().empty()) accum = Buffer(ctx.device, DType::F32, {static_cast<int64_t>(P)});
  const GradHooks* step_hooks = micro == MicroBatch::Accumulate ? nullptr : hooks;
  std::function<void(size_t, size_t)> fold_range;
  if (micro == MicroBatch::Last) fold_range = [this, s = static_cast<float>(wsum)](size_t b, size_t e) { fold(b, e, s); };
  ReadyRanges ready(step_hooks, P, fold_range);
  auto begin_backward = [&] {
    if (step_hooks && step_hooks->begin) step_hooks->begin(micro == MicroBatch::Last ? 1.0 : wsum);
  };
  auto end_backward = [&] {
    ready.finish();
    if (micro == MicroBatch::Accumulate)
      ops::grad_accumulate(ctx, accum.t(), engine->grads(), static_cast<float>(wsum),
                           accumulated++ == 0 ? ops::AccumInto::Overwrite : ops::AccumInto::Add);
    else if (micro == MicroBatch::Last)
      accumulated = 0;
  };
  if (R == 0) {  // nothing to learn from: zero gradients, zero loss
    if (train) {
      begin_backward();
      engine->zero_grads();
      end_backward();
    }
    return st;
  }

  // ---- drafter forward and loss rows (fused with the gradient when the weights are known: no D-PACE)
  in.tokens = batch.tokens.data();
  train::DrafterBatch eb;
  eb.fb = &fb;
  eb.in = &in;
  eb.rows = &rows;
  eb.noise_std = train ? opt.hs_noise : 0.f;
  eb.noise_rng = &noise_rng;
  if (cfg.arch == DraftArch::DFlash2) eb.selector_alpha = static_cast<float>(st.selector_alpha);
  eb.noise_seed = noise_seed;
  eb.noise_counter = noise_calls;
  if (eb.noise_std > 0.f) ++noise_calls;
  const bool fused = train && !opt.dpace;
  if (fused) {
    begin_backward();
    eb.ready = ready.callback();
  }
  const train::EngineRows out = engine->forward(eb, fused);
  if (fused) end_backward();
  double num = 0;
  for (int64_t r = 0; r < R; ++r) num += static_cast<double>(rows.weight[r]) * out.loss[r];
  st.loss = num / wsum;
  st.weight_sum = wsum;
  train::fill_metrics(rows, out.argmax_q, have_teacher ? out.argmax_p : nullptr,
                      static_cast<int64_t>(in.anchors.size()), static_cast<int>(B), st);
  if (out.sel_ce) train::fill_selector_metrics(rows, out, st);
  if (!std::isfinite(st.loss)) fail_non_finite_loss(ctx, fb, st.loss, step);
  if (!train) eval_argmax.assign(out.argmax_q, out.argmax_q + R);
  if (!train && out.topk_ids) {
    const int64_t K = cfg.d2.selector_top_k, rank = cfg.d2.selector_rank;
    eval_topk_ids.assign(out.topk_ids, out.topk_ids + R * K);
    eval_topk_vals.assign(out.topk_vals, out.topk_vals + R * K);
    eval_u.assign(out.u, out.u + R * rank);
  }
  if (!train || fused) return st;

  // D-PACE needs this step's probabilities before the gradient: weights from the forward, then the
  // backward recomputes the logits.
  train::dpace_factors(rows, out.ce, static_cast<int>(B), dpace);
  double dsum = 0;
  for (int64_t r = 0; r < R; ++r) dsum += rows.weight[r] * dpace[r];
  dpace_w.resize(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r)
    dpace_w[r] = dsum > 0 ? static_cast<float>(rows.weight[r] * dpace[r] / dsum) : static_cast<float>(rows.weight[r] / wsum);
  begin_backward();
  eb.ready = ready.callback();
  engine->backward(eb, dpace_w);
  end_backward();
  return st;
}

StepStats DrafterTrainer::forward_backward(const FeatureBatch& fb, const std::vector<int64_t>& anchors) {
  return impl_->run(fb, anchors, true, nullptr);
}

StepStats DrafterTrainer::forward_backward(const FeatureBatch& fb, const GradHooks& hooks,
                                           const std::vector<int64_t>& anchors) {
  return impl_->run(fb, anchors, true, &hooks);
}

StepStats DrafterTrainer::forward_backward(const FeatureBatch& fb, MicroBatch micro, const GradHooks& hooks,
                                           const std::vector<int64_t>& anchors) {
  return impl_->run(fb, anchors, true, &hooks, micro);
}

void DrafterTrainer::finish_accumulation() {
  Impl& s = *impl_;
  DF_CHECK(s.accumulated > 0, Internal, "finish_accumulation without an accumulated micro-batch");
  s.fold(0, static_cast<size_t>(s.engine->grads().numel()), 0.f);
  s.accumulated = 0;
}

StepStats DrafterTrainer::evaluate(const FeatureBatch& fb, const std::vector<int64_t>& anchors) {
  return impl_->run(fb, anchors, false, nullptr);
}

std::vector<int32_t> DrafterTrainer::draft_block(const FeatureBatch& fb, int64_t anchor, int block_rows) {
  return std::move(draft_blocks(fb, {anchor}, block_rows)[0]);
}

std::vector<std::vector<int32_t>> DrafterTrainer::draft_blocks(const FeatureBatch& fb, const std::vector<int64_t>& anchors,
                                                               int block_rows) {
  Impl& s = *impl_;
  const int B = s.cfg.block_size;
  const size_t A = anchors.size();
  DF_CHECK(block_rows >= 2 && block_rows <= B, Internal, "draft_block: a block of " << block_rows << " rows (B " << B << ")");
  DF_CHECK(A >= 1, Internal, "draft_blocks without an anchor");
  // A shorter block: the forward hides the block's later keys (its rows there are computed and dropped).
  s.run(fb, anchors, false, nullptr, MicroBatch::Whole, block_rows < B ? block_rows : 0);
  DF_CHECK(s.eval_argmax.size() == A * (B - 1) && s.rows.size() == A * (B - 1), Internal,
           "draft_blocks at " << A << " anchor(s): " << s.rows.size() << " block positions with loss_mask 1, expected "
                              << A * (B - 1));
  const int n = block_rows - 1;
  std::vector<std::vector<int32_t>> out(A, std::vector<int32_t>(static_cast<size_t>(n)));
  for (size_t a = 0; a < A; ++a)
    for (int r = 0; r < n; ++r) {  // anchor a's rows: a (B - 1) + (0 .. B - 2), offsets 1 .. B - 1 (build_loss_rows)
      const size_t row = a * (B - 1) + static_cast<size_t>(r);
      DF_CHECK(s.rows.offset[row] == r + 1 && s.rows.block[row] == static_cast<int32_t>(a), Internal,
               "draft_blocks: rows out of block order");
      out[a][static_cast<size_t>(r)] = s.eval_argmax[row];
    }
  if (s.cfg.arch != DraftArch::DFlash2) return out;
  // DFlash2 (docs/dflash2.md 2.4): the selector walks the unary top-K of rows 1..n from the anchor token.
  const int64_t K = s.cfg.d2.selector_top_k, rank = s.cfg.d2.selector_rank;
  const DrafterViews w = bind_drafter_views(s.cfg, s.engine->master_weights().ptr<float>());
  for (size_t a = 0; a < A; ++a) {
    const size_t row = a * (B - 1);
    int32_t anchor_token = fb.batch->tokens[static_cast<size_t>(anchors[a])];
    ops::selector_walk(cpu_ctx(), cpu_view(out[a].data(), {1, n}), Tensor(),
                       cpu_view(s.eval_topk_ids.data() + row * K, {1, n, K}),
                       cpu_view(s.eval_topk_vals.data() + row * K, {1, n, K}),
                       cpu_view(s.eval_u.data() + row * rank, {1, n, rank}), cpu_view(&anchor_token, {1}),
                       w.sel_pred_codebook, w.sel_succ_codebook, 0.0f);
  }
  return out;
}

int DrafterTrainer::max_anchors() const { return impl_->opt.max_anchors; }

int64_t DrafterTrainer::max_tokens() const { return impl_->max_tokens; }

std::vector<int32_t> DrafterTrainer::draft_block_sampled(const FeatureBatch& fb, int64_t anchor, int block_rows,
                                                         float temperature, const std::function<double()>& uniform,
                                                         std::vector<float>& q, std::vector<int32_t>& cand) {
  std::vector<std::vector<float>> qs;
  std::vector<std::vector<int32_t>> cands;
  std::vector<std::vector<int32_t>> out = draft_blocks_sampled(fb, {anchor}, block_rows, temperature, {uniform}, qs, cands);
  q = std::move(qs[0]);
  cand = std::move(cands[0]);
  return std::move(out[0]);
}

std::vector<std::vector<int32_t>> DrafterTrainer::draft_blocks_sampled(
    const FeatureBatch& fb, const std::vector<int64_t>& anchors, int block_rows, float temperature,
    const std::vector<std::function<double()>>& uniforms, std::vector<std::vector<float>>& q,
    std::vector<std::vector<int32_t>>& cand) {
  Impl& s = *impl_;
  DF_CHECK(s.cfg.arch == DraftArch::DFlash2 && temperature > 0.f && uniforms.size() == anchors.size(), Internal,
           "draft_blocks_sampled: a DFlash2 drafter at a positive temperature, one generator an anchor");
  draft_blocks(fb, anchors, block_rows);  // the forward; eval_topk_* and eval_u hold every block's rows
  const int64_t K = s.cfg.d2.selector_top_k, rank = s.cfg.d2.selector_rank, n = block_rows - 1, B = s.cfg.block_size;
  const size_t A = anchors.size();
  std::vector<std::vector<int32_t>> out(A, std::vector<int32_t>(static_cast<size_t>(n)));
  q.assign(A, {});
  cand.assign(A, {});
  const DrafterViews w = bind_drafter_views(s.cfg, s.engine->master_weights().ptr<float>());
  for (size_t a = 0; a < A; ++a) {  // anchor a's rows from a (B - 1) (draft_blocks)
    const size_t row = a * static_cast<size_t>(B - 1);
    q[a].assign(static_cast<size_t>(n * K), 0.f);
    cand[a].assign(s.eval_topk_ids.begin() + static_cast<int64_t>(row) * K, s.eval_topk_ids.begin() + static_cast<int64_t>(row) * K + n * K);
    int32_t anchor_token = fb.batch->tokens[static_cast<size_t>(anchors[a])];
    ops::selector_walk(cpu_ctx(), cpu_view(out[a].data(), {1, n}), cpu_view(q[a].data(), {1, n, K}),
                       cpu_view(cand[a].data(), {1, n, K}), cpu_view(s.eval_topk_vals.data() + row * K, {1, n, K}),
                       cpu_view(s.eval_u.data() + row * rank, {1, n, rank}), cpu_view(&anchor_token, {1}),
                       w.sel_pred_codebook, w.sel_succ_codebook, temperature, uniforms[a]);
  }
  return out;
}

Tensor DrafterTrainer::draft_hidden() { return impl_->engine->last_hidden(); }

Tensor DrafterTrainer::grads() { return impl_->engine->grads(); }

void DrafterTrainer::scale_grads(float s) { impl_->engine->scale_grads(s); }

double DrafterTrainer::optimizer_step() {
  Impl& s = *impl_;
  const double lr = current_lr();
  ops::AdamWHyper hp;
  hp.lr = static_cast<float>(lr);
  hp.beta1 = s.opt.beta1;
  hp.beta2 = s.opt.beta2;
  hp.eps = s.opt.eps;
  hp.weight_decay = s.opt.weight_decay;
  const double norm = s.engine->optimizer_step(hp, s.step + 1, s.opt.clip);
  train::check_grad_norm(norm, s.step);
  ++s.step;
  return norm;
}

void DrafterTrainer::export_release(const std::string& dir, DType dtype) const {
  export_drafter(dir, impl_->cfg, impl_->engine->master_weights().ptr<float>(), dtype);
}

Tensor DrafterTrainer::master_weights() { return impl_->engine->master_weights(); }
Tensor DrafterTrainer::adam_m() { return impl_->engine->adam_m(); }
Tensor DrafterTrainer::adam_v() { return impl_->engine->adam_v(); }
void DrafterTrainer::state_loaded() { impl_->engine->state_loaded(); }

double DrafterTrainer::weights_checksum() {
  const Tensor w = impl_->engine->master_weights();
  const float* p = w.ptr<float>();
  double sum = 0;
  for (size_t i = 0, n = w.numel(); i < n; ++i) sum += static_cast<double>(p[i]) * static_cast<double>(i % 7 + 1);
  return sum;
}

int64_t DrafterTrainer::step() const { return impl_->step; }
void DrafterTrainer::set_step(int64_t s) { impl_->step = s; }

// Training anchors, evaluation anchors, the CPU's feature-noise generator and the CUDA noise counter,
// separated by '|' (the generators' text states are space-separated numbers). States written before the
// counter existed (three fields) still load, with the counter at 0.
std::string DrafterTrainer::rng_state() const {
  return impl_->sampler.state() + "|" + impl_->eval_sampler.state() + "|" + impl_->noise_rng.state() + "|" +
         std::to_string(impl_->noise_calls);
}

void DrafterTrainer::set_rng_state(const std::string& s) {
  const size_t a = s.find('|'), b = a == std::string::npos ? a : s.find('|', a + 1);
  DF_CHECK_HINT(b != std::string::npos, BadInput, "malformed drafter rng state",
                "the checkpoint's rng state is damaged; resume from another checkpoint");
  const size_t c = s.find('|', b + 1);
  uint64_t calls = 0;
  if (c != std::string::npos) {
    const std::string f = s.substr(c + 1);
    char* end = nullptr;
    calls = std::strtoull(f.c_str(), &end, 10);
    DF_CHECK_HINT(!f.empty() && end == f.c_str() + f.size(), BadInput, "malformed drafter rng state (noise counter '"
                                                                          << f << "')",
                  "the checkpoint's rng state is damaged; resume from another checkpoint");
  }
  impl_->sampler.set_state(s.substr(0, a));
  impl_->eval_sampler.set_state(s.substr(a + 1, b - a - 1));
  impl_->noise_rng.set_state(s.substr(b + 1, c == std::string::npos ? std::string::npos : c - b - 1));
  impl_->noise_calls = calls;
}

}  // namespace dflash
