// Drafter golden check (see drafter_golden.h).
#include "drafter/drafter_golden.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>

#include <nlohmann/json.hpp>

#include "dflash/backend.h"
#include "dflash/drafter.h"
#include "dflash/error.h"
#include "dflash/safetensors.h"
#include "io/json_file.h"

namespace dflash::train {
namespace {

using nlohmann::json;

constexpr double kScalarTol = 1e-5;  // losses, metrics (float32 vs the float64 reference)
constexpr double kTensorTol = 1e-4;  // gradients, weights after two AdamW steps
// A loss after AdamW steps (the selector schedule's): a gradient entry that clipping brings near Adam's eps
// (|g| x clip / norm ~ 1e-8) gets a first update g / (|g| + eps) that float32 rounding moves by a good part
// of lr, and the steps after amplify it. dflash2-tiny-strict: every gradient within 1.3e-6 of
// the float64 reference, fc.weight[481] 2.2e-7 there and 3.3e-7 here, the weight 1e-4 apart after one step,
// the loss after three steps 2.1e-5 apart. The weights after AdamW steps have kTensorTol already.
constexpr double kSteppedLossTol = kTensorTol;
// The same on CUDA (bf16): each step's update carries the step's gradient error (the budget of all gradients
// together, 3e-2 below) and the selector's strict top-K can swap a near-tied candidate in bf16. Measured on an
// H100 (bench/results/h100-issue44-45-46-20261206b): dflash2-tiny-strict's loss after three steps 1.64e-2 from
// the float64 reference, the first step's within the 1e-2 loss budget.
constexpr double kSteppedLossTolCuda = 3e-2;

// Tolerances of one backend (see run_drafter_golden in the header).
struct Tolerances {
  double loss, grad_norm, grad_tensor, metric, stepped_loss;
};
Tolerances tolerances_for(Device d) {
  if (d == Device::CPU) return {kScalarTol, kScalarTol, kTensorTol, kScalarTol, kSteppedLossTol};
  return {1e-2, 3e-2, 6e-2, 0.1, kSteppedLossTolCuda};
}

double scalar_err(double x, double ref) {
  const double d = std::fabs(x - ref);
  return ref == 0.0 ? d : d / std::fabs(ref);
}

GoldenCheck tensor_check(const std::string& name, const std::vector<int64_t>& shape, const float* x,
                         const std::vector<float>& ref) {
  double num = 0, den = 0, max_abs = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(x[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
    max_abs = std::max(max_abs, std::fabs(d));
  }
  GoldenCheck c{name, den == 0 ? std::sqrt(num) : std::sqrt(num / den), kTensorTol, shape, max_abs};
  if (!std::isfinite(num)) c.err = std::numeric_limits<double>::infinity();
  return c;
}

std::vector<float> read_f32(SafetensorsFile& f, const std::string& name, size_t expect_numel) {
  const TensorInfo& t = f.get(name);
  DF_CHECK(t.numel() == expect_numel, BadInput,
           f.path() << ": tensor " << name << " has " << t.numel() << " elements, expected " << expect_numel);
  std::vector<float> out(t.numel());
  tensor_to_f32(t, out.data(), f.path());
  return out;
}

template <class T> std::vector<T> read_ints(SafetensorsFile& f, const std::string& name, DType dt) {
  const TensorInfo& t = f.get(name);
  DF_CHECK(t.dtype == dt, BadInput, f.path() << ": tensor " << name << " is " << dtype_name(t.dtype) << ", expected "
                                             << dtype_name(dt));
  const T* p = static_cast<const T*>(t.data);
  return std::vector<T>(p, p + t.numel());
}

json read_json(const std::string& path) {
  return read_json_file(path, "a golden case directory holds case.json (tests/data/golden/README.md)", JsonExpect::Any);
}

}  // namespace

bool DrafterGoldenReport::ok() const { return failures() == 0; }
int DrafterGoldenReport::failures() const {
  return static_cast<int>(std::count_if(checks.begin(), checks.end(), [](const GoldenCheck& c) { return !c.ok(); }));
}

FeatureBatch GoldenInputs::feature_batch() const {
  const int64_t K = static_cast<int64_t>(layer_ids.size()), T = batch.num_tokens();
  FeatureBatch fb;
  fb.batch = &batch;
  fb.features = cpu_view(features.data(), {K, T, hidden});
  fb.final_norm = cpu_view(final_norm.data(), {T, hidden});
  return fb;
}

GoldenInputs golden_sequences(const GoldenInputs& g, int s0, int s1) {
  DF_CHECK(0 <= s0 && s0 < s1 && s1 <= g.batch.num_seqs(), Internal,
           "golden_sequences [" << s0 << ", " << s1 << ") of " << g.batch.num_seqs());
  GoldenInputs p;
  p.target_dir = g.target_dir;
  p.drafter_dir = g.drafter_dir;
  p.layer_ids = g.layer_ids;
  p.num_layers = g.num_layers;
  p.hidden = g.hidden;
  p.opt = g.opt;
  const int64_t T = g.batch.num_tokens(), t0 = g.batch.cu_seqlens[s0], t1 = g.batch.cu_seqlens[s1], H = g.hidden;
  const int64_t K = static_cast<int64_t>(g.layer_ids.size());
  p.batch.tokens.assign(g.batch.tokens.begin() + t0, g.batch.tokens.begin() + t1);
  p.batch.loss_mask.assign(g.batch.loss_mask.begin() + t0, g.batch.loss_mask.begin() + t1);
  for (int s = s0; s <= s1; ++s) p.batch.cu_seqlens.push_back(g.batch.cu_seqlens[s] - static_cast<int32_t>(t0));
  for (int64_t k = 0; k < K; ++k)
    p.features.insert(p.features.end(), g.features.begin() + (k * T + t0) * H, g.features.begin() + (k * T + t1) * H);
  if (!g.final_norm.empty()) p.final_norm.assign(g.final_norm.begin() + t0 * H, g.final_norm.begin() + t1 * H);
  for (int64_t a : g.anchors)
    if (a >= t0 && a < t1) p.anchors.push_back(a - t0);
  return p;
}

GoldenInputs load_golden_inputs(const std::string& case_dir) {
  const json cj = read_json(case_dir + "/case.json");
  SafetensorsFile gold(case_dir + "/golden.safetensors");
  GoldenInputs g;
  g.target_dir = case_dir + "/target";
  g.drafter_dir = case_dir + "/drafter_init";
  PackedBatch& batch = g.batch;
  batch.tokens = read_ints<int32_t>(gold, "tokens", DType::I32);
  batch.cu_seqlens = read_ints<int32_t>(gold, "cu_seqlens", DType::I32);
  batch.loss_mask = read_ints<uint8_t>(gold, "loss_mask", DType::U8);
  const int64_t T = batch.num_tokens();
  const TensorInfo& hid = gold.get("target.hidden");
  DF_CHECK(hid.shape.size() == 3 && hid.shape[1] == T, BadInput, "target.hidden has shape " << hid.shape_str());
  const int64_t L = hid.shape[0], H = hid.shape[2];
  g.num_layers = L;
  g.hidden = H;
  std::vector<float> hidden(hid.numel());
  tensor_to_f32(hid, hidden.data(), gold.path());
  g.final_norm = read_f32(gold, "target.final_norm", static_cast<size_t>(T * H));
  g.layer_ids = cj.at("layer_ids").get<std::vector<int>>();
  const int64_t K = static_cast<int64_t>(g.layer_ids.size());
  g.features.resize(static_cast<size_t>(K * T * H));
  for (int64_t i = 0; i < K; ++i) {
    DF_CHECK(g.layer_ids[i] >= 0 && g.layer_ids[i] < L, BadInput, "case layer id " << g.layer_ids[i] << " out of range");
    std::copy_n(hidden.begin() + static_cast<std::ptrdiff_t>(g.layer_ids[i] * T * H), T * H,
                g.features.begin() + static_cast<std::ptrdiff_t>(i * T * H));
  }
  const auto per_seq = cj.at("anchors").get<std::vector<std::vector<int64_t>>>();
  DF_CHECK(static_cast<int>(per_seq.size()) == batch.num_seqs(), BadInput, "case.json anchors per sequence");
  for (size_t s = 0; s < per_seq.size(); ++s)
    for (int64_t a : per_seq[s]) g.anchors.push_back(a + batch.cu_seqlens[s]);
  const json& aw = cj.at("adamw");
  TrainOptions& opt = g.opt;
  opt.gamma = cj.at("gamma").get<float>();
  opt.max_anchors = static_cast<int>(g.anchors.size());
  opt.lr = aw.at("lr").get<float>();
  opt.beta1 = aw.at("beta1").get<float>();
  opt.beta2 = aw.at("beta2").get<float>();
  opt.eps = aw.at("eps").get<float>();
  opt.weight_decay = aw.at("weight_decay").get<float>();
  opt.clip = aw.at("clip").get<float>();
  opt.warmup_steps = 0;
  opt.total_steps = 0;
  opt.hs_noise = 0.f;
  return g;
}

namespace {

// case.json "selector_schedule" (issue 47): AdamW steps on d2 under --selector-warmup-ratio and
// --selector-ramp-ratio over total_steps (constant lr: min_lr_ratio 1), each step's selector weight and loss
// against SpecForge's schedule as the generator transcribes it (alphas 0, then the ramp, then alpha). The
// losses after the first step: Tolerances::stepped_loss.
void run_schedule_golden(const json& cj, const GoldenInputs& in, const FeatureBatch& fb, const Ctx& ctx,
                         SelectorCandidates mode, const Tolerances& tol, DrafterGoldenReport& rep) {
  const json& s = cj.at("selector_schedule");
  TrainOptions opt = in.opt;
  opt.loss = LossKind::CE;
  opt.selector_loss_alpha = cj.at("selector_loss_alpha").get<float>();
  opt.selector_candidates = mode;
  opt.total_steps = s.at("total_steps").get<int64_t>();
  opt.selector_warmup_ratio = s.at("warmup_ratio").get<double>();
  opt.selector_ramp_ratio = s.at("ramp_ratio").get<double>();
  opt.min_lr_ratio = 1.0f;  // the cosine from lr to lr: the generator's constant lr
  const auto alphas = s.at("alphas").get<std::vector<double>>(), losses = s.at("losses").get<std::vector<double>>();
  DF_CHECK(alphas.size() == losses.size() && !alphas.empty(), BadInput, "selector_schedule: alphas and losses differ");
  DrafterTrainer tr(in.target_dir, in.drafter_dir, 0, opt, ctx, in.batch.num_tokens());
  for (size_t i = 0; i < alphas.size(); ++i) {
    const StepStats st = tr.forward_backward(fb, in.anchors);
    const std::string at = "[" + std::to_string(i) + "]";
    rep.checks.push_back({"schedule.alpha" + at, scalar_err(st.selector_alpha, alphas[i]), kScalarTol, {},
                          std::fabs(st.selector_alpha - alphas[i])});
    rep.checks.push_back({"schedule.loss" + at, std::isfinite(st.loss) ? scalar_err(st.loss, losses[i])
                                                                       : std::numeric_limits<double>::infinity(),
                          i == 0 ? tol.loss : tol.stepped_loss, {}, std::fabs(st.loss - losses[i])});
    tr.optimizer_step();
  }
}

// A DFlash2 case (case.json has "objectives"; docs/dflash2.md 5): four objectives (ce = the unary CE
// alone, d2 = CE + alpha * selector, d2sg = the same with the selector's inputs detached, kl2 = KL + alpha *
// selector), each with its loss, both terms, gradient norm and every gradient; the metrics; two AdamW steps
// on d2. Same tolerances as the DFlash case.
void run_dflash2_golden(const json& cj, SafetensorsFile& gold, const GoldenInputs& in, const FeatureBatch& fb,
                        const Ctx& ctx, const Tolerances& dflash_tol, DrafterGoldenReport& rep,
                        const std::function<const float*(const Tensor&)>& host_f32) {
  const bool cpu = ctx.device == Device::CPU;
  // CUDA: all gradients together to 5e-2 instead of DFlash's 3e-2. Each layer adds four bf16-rounded
  // tensors (the conv-prepared inputs and the sublayer outputs before the finish conv, the dynamic kernels in
  // bf16) and the selector's dh joins in bf16: measured on the H200 3.35e-2 .. 3.76e-2 for every objective of
  // both cases, spread evenly over the tensors (each within the unchanged 6e-2; DFlash's case: 1.06e-2),
  // losses within 1e-3 (bench/results/gpu-checks-issue29-20261204).
  // Each gradient tensor to 1e-1 instead of 6e-2: the held-out case's layer-0 input_layernorm weight (48
  // elements, d2) measured 6.1e-2 and 7.1e-2 in two builds that differ only in where dh is rounded; every
  // other tensor of both cases stays within 4e-2.
  Tolerances tol = dflash_tol;
  if (!cpu) {
    tol.grad_norm = 5e-2;
    tol.grad_tensor = 1e-1;
  }
  auto scalar = [&](const std::string& name, double x, double ref, double t) {
    const double e = std::isfinite(x) ? scalar_err(x, ref) : std::numeric_limits<double>::infinity();
    rep.checks.push_back({name, e, t, {}, std::fabs(x - ref)});
  };
  const int64_t T = in.batch.num_tokens();
  const json& objectives = cj.at("objectives");
  // The training candidates (issue 47): the cases made before it inserted the gold and say nothing.
  const std::string candidates = cj.value("selector_candidates", std::string("insert"));
  DF_CHECK(candidates == "strict" || candidates == "insert", BadInput, "case.json: selector_candidates " << candidates);
  const SelectorCandidates mode = candidates == "strict" ? SelectorCandidates::Strict : SelectorCandidates::Insert;
  struct Objective {
    const char* name;
    LossKind loss;
    bool alpha, stop_gradient;
  };
  for (const Objective& o : {Objective{"ce", LossKind::CE, false, false}, Objective{"d2", LossKind::CE, true, false},
                             Objective{"d2sg", LossKind::CE, true, true}, Objective{"kl2", LossKind::KL, true, false}}) {
    const std::string obj = o.name;
    const json& ref = objectives.at(obj);
    TrainOptions opt = in.opt;
    opt.loss = o.loss;
    opt.selector_loss_alpha = o.alpha ? cj.at("selector_loss_alpha").get<float>() : 0.0f;
    opt.selector_stop_gradient = o.stop_gradient;
    opt.selector_candidates = mode;
    DrafterTrainer tr(in.target_dir, in.drafter_dir, 0, opt, ctx, T);
    DF_CHECK(tr.config().arch == DraftArch::DFlash2, BadInput, "the case's drafter_init is not a DFlash2 drafter");
    DF_CHECK(tr.config().block_size == cj.at("block_size").get<int>(), BadInput, "block_size differs from case.json");
    const StepStats st = tr.forward_backward(fb, in.anchors);
    scalar(obj + ".loss", st.loss, ref.at("loss").get<double>(), tol.loss);
    scalar(obj + ".unary", st.loss_unary, ref.at("unary").get<double>(), tol.loss);
    scalar(obj + ".sel", st.loss_sel, ref.at("sel").get<double>(), tol.loss);
    const Tensor g = tr.grads();
    const float* gp = host_f32(g);
    double gn = 0;
    for (size_t i = 0; i < g.numel(); ++i) gn += static_cast<double>(gp[i]) * gp[i];
    scalar(obj + ".grad_norm", std::sqrt(gn), ref.at("grad_norm").get<double>(), tol.grad_norm);
    std::vector<float> ref_all(cpu ? 0 : g.numel(), 0.f);
    for (const ParamSpec& p : tr.param_layout()) {
      const std::string name = "grad." + obj + "." + p.name;
      const std::vector<float> r = read_f32(gold, name, p.numel());
      rep.checks.push_back(tensor_check(name, p.shape, gp + p.offset, r));
      rep.checks.back().tol = tol.grad_tensor;
      if (!cpu) std::copy(r.begin(), r.end(), ref_all.begin() + static_cast<std::ptrdiff_t>(p.offset));
    }
    if (!cpu) {
      rep.checks.push_back(tensor_check("grad." + obj + ".all", {static_cast<int64_t>(g.numel())}, gp, ref_all));
      rep.checks.back().tol = tol.grad_norm;
    }
    if (obj != "d2") continue;
    const json& m = cj.at("metrics");
    scalar("acc", st.acc, m.at("acc").get<double>(), tol.metric);
    scalar("agree_with_target", st.agree, m.at("agree_with_target").get<double>(), tol.metric);
    scalar("streak", st.streak, m.at("streak").get<double>(), tol.metric);
    scalar("candidate_recall", st.candidate_recall, m.at("candidate_recall").get<double>(), tol.metric);
    scalar("selector_acc", st.selector_acc, m.at("selector_acc").get<double>(), tol.metric);
    scalar("weight_sum", st.weight_sum, m.at("weight_sum").get<double>(), kScalarTol);
    const auto ppa = m.at("per_pos_acc").get<std::vector<double>>();
    for (size_t k = 0; k < ppa.size() && k < st.per_pos_acc.size(); ++k)
      scalar("per_pos_acc[" + std::to_string(k) + "]", st.per_pos_acc[k], ppa[k], tol.metric);
    // ---- two AdamW steps on d2 (clip before each), as torch.optim.AdamW
    const auto ref_losses = cj.at("adamw_d2_losses").get<std::vector<double>>();
    DF_CHECK(ref_losses.size() == 3, BadInput, "adamw_d2_losses needs 3 values");
    scalar("adamw_d2_losses[0]", st.loss, ref_losses[0], tol.loss);
    tr.optimizer_step();
    const StepStats st2 = tr.forward_backward(fb, in.anchors);
    scalar("adamw_d2_losses[1]", st2.loss, ref_losses[1], tol.loss);
    tr.optimizer_step();
    scalar("adamw_d2_losses[2]", tr.evaluate(fb, in.anchors).loss, ref_losses[2], tol.loss);
    if (!cpu) continue;
    const float* wp = tr.master_weights().ptr<float>();
    for (const ParamSpec& p : tr.param_layout()) {
      const std::string name = "after2." + p.name;
      rep.checks.push_back(tensor_check(name, p.shape, wp + p.offset, read_f32(gold, name, p.numel())));
    }
  }
  if (cj.contains("selector_schedule")) run_schedule_golden(cj, in, fb, ctx, mode, tol, rep);
}

}  // namespace

DrafterGoldenReport run_drafter_golden(const std::string& case_dir, const Ctx& ctx) {
  const json cj = read_json(case_dir + "/case.json");
  SafetensorsFile gold(case_dir + "/golden.safetensors");
  DrafterGoldenReport rep;
  const bool cpu = ctx.device == Device::CPU;
  const Tolerances tol = tolerances_for(ctx.device);
  auto scalar = [&](const std::string& name, double x, double ref, double t) {
    const double e = std::isfinite(x) ? scalar_err(x, ref) : std::numeric_limits<double>::infinity();
    rep.checks.push_back({name, e, t, {}, std::fabs(x - ref)});
  };
  const GoldenInputs in = load_golden_inputs(case_dir);
  FeatureBatch fb = in.feature_batch();
  // On CUDA the trainer takes BF16 device tensors: the case's features and final_norm, converted.
  Buffer d_features, d_final_norm;
  if (!cpu) {
    d_features = Buffer(ctx.device, DType::BF16, {fb.features.shape[0], fb.features.shape[1], fb.features.shape[2]});
    d_final_norm = Buffer(ctx.device, DType::BF16, {fb.final_norm.shape[0], fb.final_norm.shape[1]});
    copy_tensor(ctx, d_features, fb.features);
    copy_tensor(ctx, d_final_norm, fb.final_norm);
    fb.features = d_features.t();
    fb.final_norm = d_final_norm.t();
  }
  std::vector<float> host;  // grads / weights downloaded on CUDA
  auto host_f32 = [&](const Tensor& t) -> const float* {
    if (t.device == Device::CPU) return t.ptr<float>();
    host.resize(t.numel());
    copy_tensor(ctx, cpu_view(host.data(), {static_cast<int64_t>(host.size())}), t);
    return host.data();
  };
  if (cj.contains("objectives")) {
    run_dflash2_golden(cj, gold, in, fb, ctx, tol, rep, host_f32);
    return rep;
  }
  const std::vector<int64_t>& anchors = in.anchors;
  const std::vector<int>& layer_ids = in.layer_ids;
  const int64_t T = in.batch.num_tokens();
  TrainOptions opt = in.opt;
  const std::string& target_dir = in.target_dir;
  const std::string& drafter_dir = in.drafter_dir;

  for (LossKind kind : {LossKind::CE, LossKind::KL}) {
    const std::string obj = kind == LossKind::CE ? "ce" : "kl";
    opt.loss = kind;
    DrafterTrainer tr(target_dir, drafter_dir, 0, opt, ctx, T);
    DF_CHECK(tr.config().target_layer_ids == layer_ids, BadInput,
             "drafter_init's target_layer_ids differ from case.json layer_ids");
    DF_CHECK(tr.config().block_size == cj.at("block_size").get<int>(), BadInput, "block_size differs from case.json");
    const StepStats st = tr.forward_backward(fb, anchors);
    scalar("loss_" + obj, st.loss, cj.at("loss_" + obj).get<double>(), tol.loss);
    const Tensor g = tr.grads();
    const float* gp = host_f32(g);
    double gn = 0;
    for (size_t i = 0; i < g.numel(); ++i) gn += static_cast<double>(gp[i]) * gp[i];
    scalar("grad_norm_" + obj, std::sqrt(gn), cj.at("grad_norm_" + obj).get<double>(), tol.grad_norm);
    std::vector<float> ref_all(cpu ? 0 : g.numel(), 0.f);
    for (const ParamSpec& p : tr.param_layout()) {
      const std::string name = "grad." + obj + "." + p.name;
      const std::vector<float> ref = read_f32(gold, name, p.numel());
      rep.checks.push_back(tensor_check(name, p.shape, gp + p.offset, ref));
      rep.checks.back().tol = tol.grad_tensor;
      if (!cpu) std::copy(ref.begin(), ref.end(), ref_all.begin() + static_cast<std::ptrdiff_t>(p.offset));
    }
    if (!cpu) {  // bf16: the whole gradient is held to a tighter budget than each tensor
      rep.checks.push_back(tensor_check("grad." + obj + ".all", {static_cast<int64_t>(g.numel())}, gp, ref_all));
      rep.checks.back().tol = tol.grad_norm;
    }
    if (kind == LossKind::KL) continue;
    scalar("acc", st.acc, cj.at("acc").get<double>(), tol.metric);
    scalar("agree_with_target", st.agree, cj.at("agree_with_target").get<double>(), tol.metric);
    scalar("streak", st.streak, cj.at("streak").get<double>(), tol.metric);
    scalar("weight_sum", st.weight_sum, cj.at("weight_sum").get<double>(), kScalarTol);
    const auto ppa = cj.at("per_pos_acc").get<std::vector<double>>();
    for (size_t k = 0; k < ppa.size() && k < st.per_pos_acc.size(); ++k)
      scalar("per_pos_acc[" + std::to_string(k) + "]", st.per_pos_acc[k], ppa[k], tol.metric);

    // ---- two AdamW steps on the CE objective (clip before each), as torch.optim.AdamW
    const auto ref_losses = cj.at("adamw_ce_losses").get<std::vector<double>>();
    DF_CHECK(ref_losses.size() == 3, BadInput, "adamw_ce_losses needs 3 values");
    scalar("adamw_ce_losses[0]", st.loss, ref_losses[0], tol.loss);
    tr.optimizer_step();
    const StepStats st2 = tr.forward_backward(fb, anchors);
    scalar("adamw_ce_losses[1]", st2.loss, ref_losses[1], tol.loss);
    tr.optimizer_step();
    scalar("adamw_ce_losses[2]", tr.evaluate(fb, anchors).loss, ref_losses[2], tol.loss);
    if (!cpu) continue;
    const float* wp = tr.master_weights().ptr<float>();
    for (const ParamSpec& p : tr.param_layout()) {
      const std::string name = "after2." + p.name;
      rep.checks.push_back(tensor_check(name, p.shape, wp + p.offset, read_f32(gold, name, p.numel())));
    }
  }
  return rep;
}

}  // namespace dflash::train
