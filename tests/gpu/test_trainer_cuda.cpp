// DrafterTrainer on a CUDA context against the same trainer on the CPU (the float32 reference), on the
// golden case tests/data/golden/qwen3-tiny-a: the target's features come from the CPU target forward and
// are converted to BF16 on the device. Tolerances (bf16 compute, fp32 master weights; tests/gpu/tolerances.h):
//   per-step losses over 20 training steps: 3e-2 relative (the two runs see the same anchors; the bf16
//     forward and the diverging weights both add up; GpuDrafterStep allows 5e-2 over 50 steps), the
//     pre-clip gradient norms 1e-1, and the loss on the case's anchors must fall by 5% on both;
//   one D-PACE step: loss 1e-2 relative, all gradients 3e-2, each tensor 6e-2 (test_drafter_golden.cpp);
//   hs-noise: mean within 5 standard errors of 0, std within 2% of sigma over 2^18 elements;
//   state round trip: losses of the restored trainer within 1e-6 relative of the original's;
//   --optimizer-state bf16: the same 20-step and round-trip bounds, CPU and CUDA both in that mode.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dflash/backend.h"
#include "dflash/drafter.h"
#include "dflash/target.h"
#include "feature_noise.cuh"
#include "gpu_test_util.h"
#include "drafter/drafter_golden.h"

namespace dflash {
namespace {

using test::gpu;
using test::rel_err;
using test::to_host;

// The golden case with the CPU target's features [K, T, H] and final_norm [T, H] (float32, host).
struct GoldenCase {
  train::GoldenInputs in;
  std::vector<float> features, final_norm;
  int64_t K = 0, T = 0, H = 0;
};

const GoldenCase& golden() {
  static const GoldenCase c = [] {
    // DFLASH_TEST_DATA in the environment wins over the build's path (the binary may run in another checkout).
    const char* env_data = std::getenv("DFLASH_TEST_DATA");
    const std::string dir = std::string(env_data ? env_data : DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a";
    GoldenCase g;
    g.in = train::load_golden_inputs(dir);
    g.T = g.in.batch.num_tokens();
    const std::unique_ptr<TargetModel> target =
        make_target_model(load_target_config(g.in.target_dir), g.in.target_dir, cpu_ctx(), g.in.layer_ids, g.T);
    g.K = static_cast<int64_t>(target->capture_layers().size());
    g.H = target->config().hidden_size;
    g.features.assign(static_cast<size_t>(g.K * g.T * g.H), NAN);
    g.final_norm.assign(static_cast<size_t>(g.T * g.H), NAN);
    CaptureOut out;
    out.features = cpu_view(g.features.data(), {g.K, g.T, g.H});
    out.final_norm = cpu_view(g.final_norm.data(), {g.T, g.H});
    target->forward(g.in.batch, out);
    return g;
  }();
  return c;
}

// The case's batch on both backends: host F32 views and BF16 device copies.
struct Batches {
  Buffer d_features, d_final_norm;
  FeatureBatch cpu, cuda;
  explicit Batches(const Ctx& g) {
    const GoldenCase& c = golden();
    d_features = Buffer(Device::CUDA, DType::BF16, {c.K, c.T, c.H});
    d_final_norm = Buffer(Device::CUDA, DType::BF16, {c.T, c.H});
    cpu.batch = cuda.batch = &c.in.batch;
    cpu.features = cpu_view(c.features.data(), {c.K, c.T, c.H});
    cpu.final_norm = cpu_view(c.final_norm.data(), {c.T, c.H});
    copy_tensor(g, d_features, cpu.features);
    copy_tensor(g, d_final_norm, cpu.final_norm);
    synchronize(g);
    cuda.features = d_features.t();
    cuda.final_norm = d_final_norm.t();
  }
};

// The case's first max_anchors anchors: what an evaluation probes with (a batch never carries more).
std::vector<int64_t> probe_anchors(const GoldenCase& c, const TrainOptions& opt) {
  const size_t n = std::min<size_t>(c.in.anchors.size(), static_cast<size_t>(opt.max_anchors));
  return std::vector<int64_t>(c.in.anchors.begin(), c.in.anchors.begin() + static_cast<std::ptrdiff_t>(n));
}

std::vector<float> host_copy(const Tensor& t) {
  const float* p = t.ptr<float>();
  return std::vector<float>(p, p + t.numel());
}

// A second trainer restored from a's state through the host F32 views (w, m, v: the checkpoint's path) has
// a's weights and moments and continues as a for three steps (losses, lr, gradient norms).
void expect_restored_state_continues(DrafterTrainer& a, const TrainOptions& opt, const std::vector<float>& w,
                                     const std::vector<float>& m, const std::vector<float>& v, const Ctx& g,
                                     const Batches& fb) {
  const GoldenCase& c = golden();
  DrafterTrainer b(c.in.target_dir, c.in.drafter_dir, 0, opt, g, c.T);
  std::memcpy(b.master_weights().data, w.data(), w.size() * sizeof(float));
  std::memcpy(b.adam_m().data, m.data(), m.size() * sizeof(float));
  std::memcpy(b.adam_v().data, v.data(), v.size() * sizeof(float));
  b.state_loaded();
  b.set_step(a.step());
  b.set_rng_state(a.rng_state());
  EXPECT_EQ(b.weights_checksum(), a.weights_checksum());
  EXPECT_EQ(0, std::memcmp(host_copy(b.adam_v()).data(), v.data(), v.size() * sizeof(float)));
  for (int s = 0; s < 3; ++s) {
    const StepStats sa = a.forward_backward(fb.cuda), sb = b.forward_backward(fb.cuda);
    EXPECT_NEAR(sb.loss, sa.loss, test::tol::kSameComputation * std::fabs(sa.loss)) << "step " << s;
    EXPECT_EQ(sb.lr, sa.lr);
    const double na = a.optimizer_step(), nb = b.optimizer_step();
    EXPECT_NEAR(nb, na, test::tol::kSameComputation * na) << "step " << s;
  }
}

TEST(TrainerCuda, CpuAndCudaTrackOverTwentySteps) {
  SKIP_WITHOUT_GPU();
  const GoldenCase& c = golden();
  Ctx g = gpu();
  Batches fb(g);
  for (LossKind kind : {LossKind::CE, LossKind::KL}) {
    SCOPED_TRACE(kind == LossKind::CE ? "CE" : "KL");
    TrainOptions opt = c.in.opt;
    opt.loss = kind;
    opt.seed = 3;
    opt.max_anchors = 8;  // sampled each step from the same stream on both backends
    DrafterTrainer cpu(c.in.target_dir, c.in.drafter_dir, 0, opt, cpu_ctx(), c.T);
    DrafterTrainer gpu_tr(c.in.target_dir, c.in.drafter_dir, 0, opt, g, c.T);
    EXPECT_EQ(cpu.weights_checksum(), gpu_tr.weights_checksum()) << "the same initial weights";
    EXPECT_EQ(gpu_tr.grads().device, Device::CUDA);
    const std::vector<int64_t> probe = probe_anchors(c, opt);
    const double eval0_cpu = cpu.evaluate(fb.cpu, probe).loss;
    const double eval0_gpu = gpu_tr.evaluate(fb.cuda, probe).loss;
    EXPECT_NEAR(eval0_gpu, eval0_cpu, test::tol::kStepLoss * eval0_cpu);
    for (int s = 0; s < 20; ++s) {
      const StepStats a = cpu.forward_backward(fb.cpu);
      const StepStats b = gpu_tr.forward_backward(fb.cuda);
      ASSERT_EQ(a.anchors, b.anchors) << "step " << s;
      EXPECT_EQ(a.weight_sum, b.weight_sum) << "step " << s << ": not the same anchors";
      EXPECT_NEAR(b.loss, a.loss, test::tol::kTrainerLoss * a.loss) << "step " << s;
      EXPECT_TRUE(std::isfinite(b.agree)) << "step " << s << ": no teacher argmax on CUDA";
      EXPECT_NEAR(b.acc, a.acc, test::tol::kTrainerAcc) << "step " << s;
      const double na = cpu.optimizer_step(), nb = gpu_tr.optimizer_step();
      EXPECT_NEAR(nb, na, test::tol::kTrainerGradNorm * na) << "step " << s << ": pre-clip gradient norm";
      EXPECT_EQ(cpu.current_lr(), gpu_tr.current_lr());
    }
    const double eval1_cpu = cpu.evaluate(fb.cpu, probe).loss;
    const double eval1_gpu = gpu_tr.evaluate(fb.cuda, probe).loss;
    EXPECT_LT(eval1_cpu, 0.95 * eval0_cpu) << "the CPU run did not learn: the comparison would be vacuous";
    EXPECT_LT(eval1_gpu, 0.95 * eval0_gpu);
    EXPECT_NEAR(eval1_gpu, eval1_cpu, test::tol::kTrainerLoss * eval1_cpu);
  }
}

// --anchors-per-record (include/dflash/anchors.h): the sampler is host code shared by both backends, so both
// draw the same per-record anchors; with a cap far above one batch's worth the CUDA step's buffers hold many
// more anchors than the per-batch default, and its losses and gradient norms track the CPU's.
TEST(TrainerCuda, PerRecordAnchorsTrackCpu) {
  SKIP_WITHOUT_GPU();
  const GoldenCase& c = golden();
  Ctx g = gpu();
  Batches fb(g);
  TrainOptions opt = c.in.opt;
  opt.seed = 9;
  opt.anchors_per_record = 12;  // the case's 3 records (37, 29, 53 tokens): up to 36, 4.5x the 8 above
  opt.max_anchors = static_cast<int>(c.T);  // a bound no batch reaches: every record's draws are kept
  DrafterTrainer cpu(c.in.target_dir, c.in.drafter_dir, 0, opt, cpu_ctx(), c.T);
  DrafterTrainer gpu_tr(c.in.target_dir, c.in.drafter_dir, 0, opt, g, c.T);
  for (int s = 0; s < 5; ++s) {
    const StepStats a = cpu.forward_backward(fb.cpu);
    const StepStats b = gpu_tr.forward_backward(fb.cuda);
    ASSERT_EQ(a.anchors, b.anchors) << "step " << s;
    EXPECT_GT(a.anchors, 2 * 12) << "step " << s << ": every record gets anchors";
    EXPECT_LE(a.anchors, 12 * c.in.batch.num_seqs()) << "step " << s;
    EXPECT_EQ(a.weight_sum, b.weight_sum) << "step " << s << ": not the same anchors";
    EXPECT_NEAR(b.loss, a.loss, test::tol::kTrainerLoss * a.loss) << "step " << s;
    EXPECT_NEAR(b.acc, a.acc, test::tol::kTrainerAcc) << "step " << s;
    const double na = cpu.optimizer_step(), nb = gpu_tr.optimizer_step();
    EXPECT_NEAR(nb, na, test::tol::kTrainerGradNorm * na) << "step " << s << ": pre-clip gradient norm";
  }
  const std::string sa = cpu.rng_state(), sb = gpu_tr.rng_state();
  EXPECT_EQ(sa.substr(0, sa.find('|')), sb.substr(0, sb.find('|'))) << "the same anchor draws from the same stream";
}

TEST(TrainerCuda, FeatureNoiseStatisticsAndReproducibility) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t n = int64_t{1} << 18;
  const float sigma = 0.5f;
  Buffer x(Device::CUDA, DType::BF16, {n});
  auto draw = [&](uint64_t seed, uint64_t counter) {
    x.zero();
    cudaDeviceSynchronize();  // Buffer::zero runs on the legacy stream, the op on ctx's
    cuda::add_feature_noise(g, x.t(), sigma, seed, counter);
    return to_host(g, x.t());
  };
  const std::vector<float> a = draw(7, 3), again = draw(7, 3), other = draw(7, 4), other_seed = draw(8, 3);
  double sum = 0, sq = 0;
  for (float v : a) {
    sum += v;
    sq += double(v) * v;
  }
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_LT(std::fabs(mean), test::tol::kNoiseMeanStdErrs * sigma / std::sqrt(double(n))) << "mean " << mean;
  EXPECT_NEAR(sd, sigma, test::tol::kNoiseStd * sigma) << "std";
  EXPECT_EQ(0, std::memcmp(a.data(), again.data(), a.size() * sizeof(float))) << "same seed and counter";
  size_t same = 0, same_seed = 0;
  for (int64_t i = 0; i < n; ++i) {
    same += a[i] == other[i];
    same_seed += a[i] == other_seed[i];
  }
  // Independent bf16 draws coincide now and then (about 0.5% here); the same stream would coincide everywhere.
  EXPECT_LT(same, size_t(n / 20)) << "a new counter must give new noise";
  EXPECT_LT(same_seed, size_t(n / 20)) << "a new seed must give new noise";

  // Through the trainer: noise only in training, reproducible from rng_state().
  const GoldenCase& c = golden();
  Batches fb(g);
  TrainOptions opt = c.in.opt;
  opt.hs_noise = 0.5f;
  DrafterTrainer tr(c.in.target_dir, c.in.drafter_dir, 0, opt, g, c.T);
  const double clean = tr.evaluate(fb.cuda, c.in.anchors).loss;
  EXPECT_EQ(clean, tr.evaluate(fb.cuda, c.in.anchors).loss) << "evaluation is deterministic, without noise";
  const std::string state = tr.rng_state();
  const StepStats s1 = tr.forward_backward(fb.cuda, c.in.anchors);
  EXPECT_NE(s1.loss, clean);
  EXPECT_FLOAT_EQ(s1.noise, 0.5f);
  const std::vector<float> g1 = to_host(g, tr.grads());
  const StepStats s2 = tr.forward_backward(fb.cuda, c.in.anchors);
  EXPECT_NE(s2.loss, s1.loss) << "the next step draws new noise";
  tr.set_rng_state(state);
  const StepStats s3 = tr.forward_backward(fb.cuda, c.in.anchors);
  EXPECT_EQ(s3.loss, s1.loss) << "same noise again after restoring the rng state";
  EXPECT_LT(rel_err(to_host(g, tr.grads()), g1), test::tol::kSameComputation);
  // A state written before the noise counter existed (three fields) still loads.
  const std::string old = state.substr(0, state.rfind('|'));
  tr.set_rng_state(old);
  EXPECT_EQ(tr.rng_state(), state);  // the counter was 0 in `state`
}

TEST(TrainerCuda, DpaceLossAndGradientsMatchCpu) {
  SKIP_WITHOUT_GPU();
  const GoldenCase& c = golden();
  Ctx g = gpu();
  Batches fb(g);
  for (LossKind kind : {LossKind::CE, LossKind::KL}) {
    SCOPED_TRACE(kind == LossKind::CE ? "CE" : "KL");
    TrainOptions opt = c.in.opt;
    opt.loss = kind;
    opt.dpace = true;
    DrafterTrainer cpu(c.in.target_dir, c.in.drafter_dir, 0, opt, cpu_ctx(), c.T);
    DrafterTrainer gpu_tr(c.in.target_dir, c.in.drafter_dir, 0, opt, g, c.T);
    opt.dpace = false;
    DrafterTrainer plain(c.in.target_dir, c.in.drafter_dir, 0, opt, g, c.T);
    const StepStats a = cpu.forward_backward(fb.cpu, c.in.anchors);
    const StepStats b = gpu_tr.forward_backward(fb.cuda, c.in.anchors);
    const StepStats p = plain.forward_backward(fb.cuda, c.in.anchors);
    EXPECT_NEAR(b.loss, a.loss, test::tol::kStepLoss * a.loss) << "the decay-weighted objective";
    EXPECT_NEAR(b.loss, p.loss, test::tol::kSameComputation * p.loss) << "D-PACE must not change StepStats::loss";
    const std::vector<float> ga = host_copy(cpu.grads()), gb = to_host(g, gpu_tr.grads());
    const std::vector<float> gp = to_host(g, plain.grads());
    EXPECT_LT(rel_err(gb, ga), test::tol::kStepGrads) << "all gradients";
    for (const ParamSpec& ps : cpu.param_layout()) {
      const std::vector<float> x(gb.begin() + ps.offset, gb.begin() + ps.offset + ps.numel());
      const std::vector<float> r(ga.begin() + ps.offset, ga.begin() + ps.offset + ps.numel());
      EXPECT_LT(rel_err(x, r), test::tol::kStepGradsPerTensor) << ps.name;
    }
    EXPECT_GT(rel_err(gp, gb), 0.1) << "the D-PACE weights did not reach the gradient";
  }
}

TEST(TrainerCuda, StateRoundTripContinuesIdentically) {
  SKIP_WITHOUT_GPU();
  const GoldenCase& c = golden();
  Ctx g = gpu();
  Batches fb(g);
  TrainOptions opt = c.in.opt;
  opt.max_anchors = 8;
  opt.seed = 5;
  opt.warmup_steps = 2;
  opt.total_steps = 20;
  DrafterTrainer a(c.in.target_dir, c.in.drafter_dir, 0, opt, g, c.T);
  for (int s = 0; s < 3; ++s) {
    a.forward_backward(fb.cuda);
    a.optimizer_step();
  }
  const std::vector<float> w = host_copy(a.master_weights()), m = host_copy(a.adam_m()), v = host_copy(a.adam_v());
  ASSERT_EQ(a.master_weights().device, Device::CPU);
  double mnorm = 0;
  for (float x : m) mnorm += double(x) * x;
  EXPECT_GT(mnorm, 0.0) << "AdamW state after three steps";

  expect_restored_state_continues(a, opt, w, m, v, g, fb);

  // Export works from the device weights: a CPU trainer loading the F32 export has them exactly.
  char tmpl[] = "/tmp/dflash_trainer_cudaXXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/drafter";
  a.export_release(dir, DType::F32);
  DrafterTrainer back(c.in.target_dir, dir, 0, opt, cpu_ctx(), c.T);
  EXPECT_EQ(back.weights_checksum(), a.weights_checksum());
  std::filesystem::remove_all(tmpl);
}

// --optimizer-state bf16: the CUDA trainer (bf16 weights and moments on the device, no fp32 copy) against the
// CPU trainer in the same mode (fp32 storage of bf16 values) over 20 steps, as CpuAndCudaTrackOverTwentySteps
// (kTrainerLoss); both start from the same weights rounded to bf16, every weight and moment the host views
// show is a bf16 value, and a state restored through those F32 views (the checkpoint's path) continues as
// the original (kSameComputation: the same bits are drawn at the same steps).
TEST(TrainerCuda, Bf16StateTracksCpuAndRoundTrips) {
  SKIP_WITHOUT_GPU();
  const GoldenCase& c = golden();
  Ctx g = gpu();
  Batches fb(g);
  TrainOptions opt = c.in.opt;
  opt.seed = 3;
  opt.max_anchors = 8;
  opt.optimizer_state = OptimizerState::Bf16;
  DrafterTrainer cpu(c.in.target_dir, c.in.drafter_dir, 0, opt, cpu_ctx(), c.T);
  DrafterTrainer a(c.in.target_dir, c.in.drafter_dir, 0, opt, g, c.T);
  EXPECT_EQ(cpu.weights_checksum(), a.weights_checksum()) << "the same initial weights, rounded to bf16";
  const std::vector<int64_t> probe = probe_anchors(c, opt);
  const double eval0 = cpu.evaluate(fb.cpu, probe).loss;
  for (int s = 0; s < 20; ++s) {
    const StepStats sc = cpu.forward_backward(fb.cpu), sg = a.forward_backward(fb.cuda);
    EXPECT_NEAR(sg.loss, sc.loss, test::tol::kTrainerLoss * sc.loss) << "step " << s;
    const double nc = cpu.optimizer_step(), ng = a.optimizer_step();
    EXPECT_NEAR(ng, nc, test::tol::kTrainerGradNorm * nc) << "step " << s;
  }
  const double eval_cpu = cpu.evaluate(fb.cpu, probe).loss, eval_gpu = a.evaluate(fb.cuda, probe).loss;
  EXPECT_LT(eval_cpu, 0.95 * eval0) << "the CPU run did not learn: the comparison would be vacuous";
  EXPECT_NEAR(eval_gpu, eval_cpu, test::tol::kTrainerLoss * eval_cpu);
  const std::vector<float> w = host_copy(a.master_weights()), m = host_copy(a.adam_m()), v = host_copy(a.adam_v());
  for (const std::vector<float>* t : {&w, &m, &v})
    for (float x : *t) ASSERT_EQ(x, bf16_to_f32(f32_to_bf16(x))) << "a state value that is no bf16";

  expect_restored_state_continues(a, opt, w, m, v, g, fb);
}

// The host mirror of the weights (master_weights) comes down only when the device's weights changed, and
// always then: after an optimizer step and after state_loaded (the bf16 state: what the device rounded to),
// not after a forward. A stale mirror would export, checkpoint and draft (DFlash2's selector) old weights.
TEST(TrainerCuda, MasterWeightsMirrorFollowsTheDevice) {
  SKIP_WITHOUT_GPU();
  const GoldenCase& c = golden();
  Ctx g = gpu();
  Batches fb(g);
  for (OptimizerState state : {OptimizerState::Fp32, OptimizerState::Bf16}) {
    SCOPED_TRACE(state == OptimizerState::Fp32 ? "fp32 state" : "bf16 state");
    TrainOptions opt = c.in.opt;
    opt.max_anchors = 8;
    opt.optimizer_state = state;
    DrafterTrainer a(c.in.target_dir, c.in.drafter_dir, 0, opt, g, c.T);
    const std::vector<float> w0 = host_copy(a.master_weights());
    EXPECT_EQ(host_copy(a.master_weights()), w0) << "a second read without a change";
    a.forward_backward(fb.cuda);
    a.optimizer_step();
    const std::vector<float> w1 = host_copy(a.master_weights());
    size_t moved = 0;
    for (size_t i = 0; i < w0.size(); ++i) moved += w1[i] != w0[i];
    EXPECT_GT(moved, w0.size() / 10) << "the optimizer step is not in the mirror";
    const std::vector<int64_t> probe = probe_anchors(c, opt);
    a.evaluate(fb.cuda, probe);
    EXPECT_EQ(host_copy(a.master_weights()), w1) << "a forward changed the mirror";
    // Weights written through the mirror (a checkpoint's path), off the bf16 grid: what comes back is what
    // the device holds.
    std::vector<float> w2(w1.size());
    for (size_t i = 0; i < w1.size(); ++i) w2[i] = w1[i] * 1.0009765625f + 1e-5f;
    std::memcpy(a.master_weights().data, w2.data(), w2.size() * sizeof(float));
    a.state_loaded();
    const std::vector<float> back = host_copy(a.master_weights());
    size_t bad = 0;
    for (size_t i = 0; i < w2.size(); ++i)
      bad += back[i] != (state == OptimizerState::Fp32 ? w2[i] : bf16_to_f32(f32_to_bf16(w2[i])));
    EXPECT_EQ(bad, 0u);
    a.forward_backward(fb.cuda);
    a.optimizer_step();
    EXPECT_NE(host_copy(a.master_weights()), back) << "the step after state_loaded is not in the mirror";
  }
}

TEST(TrainerCuda, ScaleGradsOnBothBackends) {
  SKIP_WITHOUT_GPU();
  const GoldenCase& c = golden();
  Ctx g = gpu();
  Batches fb(g);
  DrafterTrainer gpu_tr(c.in.target_dir, c.in.drafter_dir, 0, c.in.opt, g, c.T);
  DrafterTrainer cpu(c.in.target_dir, c.in.drafter_dir, 0, c.in.opt, cpu_ctx(), c.T);
  gpu_tr.forward_backward(fb.cuda, c.in.anchors);
  cpu.forward_backward(fb.cpu, c.in.anchors);
  const std::vector<float> g0 = to_host(g, gpu_tr.grads()), c0 = host_copy(cpu.grads());
  gpu_tr.scale_grads(0.25f);  // a power of two: exact in fp32
  cpu.scale_grads(0.25f);
  const std::vector<float> g1 = to_host(g, gpu_tr.grads()), c1 = host_copy(cpu.grads());
  size_t bad = 0, nonzero = 0;
  for (size_t i = 0; i < g0.size(); ++i) {
    bad += g1[i] != 0.25f * g0[i];
    bad += c1[i] != 0.25f * c0[i];
    nonzero += g0[i] != 0.f;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(nonzero, g0.size() / 2);
}

}  // namespace
}  // namespace dflash
