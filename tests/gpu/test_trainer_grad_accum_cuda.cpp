// Gradient accumulation in the CUDA trainer (MicroBatch, include/dflash/drafter.h): the golden case
// qwen3-tiny-a's batch cut between its sequences into two micro-batches (Accumulate, then Last with the
// hooks folding each range before it is reported) trains as the one batch holding both halves, on the
// same weights on a second CUDA trainer: the loss Σ w·CE / Σ w within kStepLoss, the gradient (divided by the global Σw) within
// kStepGrads (bf16 compute on other batch shapes), every reported range already folded (its copy at the
// report equals the final gradient), prescale 1; finish_accumulation leaves Σw x the first half's gradient
// (kSameComputation: the same step on another trainer, atomic sums). The features are the case's (F32 -> BF16).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dflash/drafter.h"
#include "gpu_test_util.h"
#include "drafter/drafter_golden.h"

namespace dflash {
namespace {

using test::gpu;
using test::rel_err;
using test::to_host;

// A golden (sub)case's batch as BF16 device tensors.
struct DeviceBatch {
  Buffer features, final_norm;
  FeatureBatch fb;
  DeviceBatch(const Ctx& g, const train::GoldenInputs& in) {
    const FeatureBatch h = in.feature_batch();
    features = Buffer(Device::CUDA, DType::BF16, {h.features.shape[0], h.features.shape[1], h.features.shape[2]});
    final_norm = Buffer(Device::CUDA, DType::BF16, {h.final_norm.shape[0], h.final_norm.shape[1]});
    copy_tensor(g, features, h.features);
    copy_tensor(g, final_norm, h.final_norm);
    synchronize(g);
    fb.batch = h.batch;
    fb.features = features.t();
    fb.final_norm = final_norm.t();
  }
};

TEST(GpuTrainerGradAccum, TwoMicroBatchesMatchOneBatch) {
  SKIP_WITHOUT_GPU();
  const char* env_data = std::getenv("DFLASH_TEST_DATA");
  const train::GoldenInputs g =
      train::load_golden_inputs(std::string(env_data ? env_data : DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a");
  const train::GoldenInputs a = train::golden_sequences(g, 0, 2), b = train::golden_sequences(g, 2, 3);
  const Ctx ctx = gpu();
  const DeviceBatch dw(ctx, g), da(ctx, a), db(ctx, b);
  DrafterTrainer whole(g.target_dir, g.drafter_dir, 0, g.opt, ctx, g.batch.num_tokens());
  DrafterTrainer accum(g.target_dir, g.drafter_dir, 0, g.opt, ctx, g.batch.num_tokens());
  const StepStats sw = whole.forward_backward(dw.fb, g.anchors);
  const std::vector<float> want = to_host(ctx, whole.grads());

  int begins = 0;
  double prescale = -1;
  std::vector<std::pair<size_t, size_t>> ranges;
  std::vector<std::vector<float>> snapshots;
  GradHooks hooks;
  hooks.begin = [&](double p) {
    ++begins;
    prescale = p;
  };
  hooks.ready = [&](size_t lo, size_t hi) {
    synchronize(ctx);  // "final once the work enqueued so far has run"
    ranges.push_back({lo, hi});
    const std::vector<float> all = to_host(ctx, accum.grads());
    snapshots.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(lo), all.begin() + static_cast<std::ptrdiff_t>(hi));
  };
  const StepStats s1 = accum.forward_backward(da.fb, MicroBatch::Accumulate, hooks, a.anchors);
  EXPECT_EQ(begins, 0);
  EXPECT_TRUE(ranges.empty());
  const StepStats s2 = accum.forward_backward(db.fb, MicroBatch::Last, hooks, b.anchors);
  EXPECT_EQ(begins, 1);
  EXPECT_EQ(prescale, 1.0);
  synchronize(ctx);
  const std::vector<float> folded = to_host(ctx, accum.grads());
  size_t covered = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    covered += ranges[k].second - ranges[k].first;
    EXPECT_EQ(std::memcmp(snapshots[k].data(), folded.data() + ranges[k].first, snapshots[k].size() * sizeof(float)), 0)
        << "range " << ranges[k].first << " changed after it was reported";
  }
  EXPECT_EQ(covered, folded.size());
  const double wsum = s1.weight_sum + s2.weight_sum;
  EXPECT_NEAR(wsum, sw.weight_sum, 1e-9 * sw.weight_sum);
  const double loss = (s1.loss * s1.weight_sum + s2.loss * s2.weight_sum) / wsum;
  EXPECT_NEAR(loss, sw.loss, test::tol::kStepLoss * sw.loss);
  accum.scale_grads(static_cast<float>(1.0 / wsum));
  EXPECT_LT(rel_err(to_host(ctx, accum.grads()), want), test::tol::kStepGrads);
  // the end of the data mid-step: the accumulator alone
  accum.forward_backward(da.fb, MicroBatch::Accumulate, GradHooks{}, a.anchors);
  accum.finish_accumulation();
  DrafterTrainer only_a(g.target_dir, g.drafter_dir, 0, g.opt, ctx, g.batch.num_tokens());
  const StepStats sa = only_a.forward_backward(da.fb, a.anchors);
  std::vector<float> want_a = to_host(ctx, only_a.grads());
  for (float& x : want_a) x *= static_cast<float>(sa.weight_sum);
  EXPECT_LE(rel_err(to_host(ctx, accum.grads()), want_a), test::tol::kSameComputation) << "finish_accumulation";
}

}  // namespace
}  // namespace dflash
