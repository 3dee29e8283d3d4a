// Gradient accumulation on the CPU (include/dflash/drafter.h MicroBatch, ops::grad_accumulate / grad_fold):
// two micro-batches (the golden case qwen3-tiny-a's batch cut between its sequences, each half with its own
// anchors) train exactly as the one batch holding both halves: the loss Σ w·CE / Σ w over both, the
// gradient, the weights after an AdamW step, to float tolerance; CE and D-PACE. The Last micro-batch folds
// each range before GradHooks::ready reports it (prescale 1) and gives the same gradient with or without
// hooks; the end of the data mid-step (finish_accumulation) leaves the accumulated micro-batches' sum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dflash/drafter.h"
#include "dflash/optim.h"
#include "drafter/drafter_golden.h"

namespace dflash {
namespace {

const train::GoldenInputs& golden() {
  static const train::GoldenInputs g =
      train::load_golden_inputs(std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a");
  return g;
}

std::vector<float> copy_of(const Tensor& t) { return std::vector<float>(t.ptr<float>(), t.ptr<float>() + t.numel()); }

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

TEST(GradAccum, TwoMicroBatchesEqualOneBatchHoldingBoth) {
  const train::GoldenInputs& g = golden();
  ASSERT_EQ(g.batch.num_seqs(), 3);
  const train::GoldenInputs a = train::golden_sequences(g, 0, 2), b = train::golden_sequences(g, 2, 3);
  ASSERT_FALSE(a.anchors.empty());
  ASSERT_FALSE(b.anchors.empty());
  ASSERT_EQ(a.anchors.size() + b.anchors.size(), g.anchors.size());
  for (bool dpace : {false, true}) {
    SCOPED_TRACE(dpace ? "dpace" : "ce");
    TrainOptions opt = g.opt;
    opt.dpace = dpace;
    DrafterTrainer whole(g.target_dir, g.drafter_dir, 0, opt, cpu_ctx(), g.batch.num_tokens());
    DrafterTrainer accum(g.target_dir, g.drafter_dir, 0, opt, cpu_ctx(), g.batch.num_tokens());
    for (int step = 0; step < 2; ++step) {  // the second step: the accumulator is overwritten, not added to
      SCOPED_TRACE("step " + std::to_string(step));
      const StepStats sw = whole.forward_backward(g.feature_batch(), g.anchors);
      const StepStats s1 = accum.forward_backward(a.feature_batch(), MicroBatch::Accumulate, GradHooks{}, a.anchors);
      const StepStats s2 = accum.forward_backward(b.feature_batch(), MicroBatch::Last, GradHooks{}, b.anchors);
      const double wsum = s1.weight_sum + s2.weight_sum;
      EXPECT_NEAR(wsum, sw.weight_sum, 1e-9 * sw.weight_sum);
      EXPECT_NEAR((s1.loss * s1.weight_sum + s2.loss * s2.weight_sum) / wsum, sw.loss, 1e-6 * std::fabs(sw.loss));
      EXPECT_EQ(s1.tokens + s2.tokens, sw.tokens);
      EXPECT_EQ(s1.anchors + s2.anchors, sw.anchors);
      accum.scale_grads(static_cast<float>(1.0 / wsum));
      if (!dpace) EXPECT_LT(rel_err(copy_of(accum.grads()), copy_of(whole.grads())), 1e-5);
      const double nw = whole.optimizer_step(), na = accum.optimizer_step();
      // D-PACE's gradient weighs each batch's rows by that batch's own factor sum (as it does across
      // drafters, docs/pipeline.md): one large batch's loss, not its gradient (nor the weights after it).
      if (dpace) break;
      EXPECT_NEAR(na, nw, 1e-5 * nw);
      EXPECT_LT(rel_err(copy_of(accum.master_weights()), copy_of(whole.master_weights())), 1e-6);
    }
  }
}

TEST(GradAccum, LastFoldsEachRangeBeforeReportingIt) {
  const train::GoldenInputs& g = golden();
  const train::GoldenInputs a = train::golden_sequences(g, 0, 2), b = train::golden_sequences(g, 2, 3);
  DrafterTrainer plain(g.target_dir, g.drafter_dir, 0, g.opt, cpu_ctx(), g.batch.num_tokens());
  DrafterTrainer hooked(g.target_dir, g.drafter_dir, 0, g.opt, cpu_ctx(), g.batch.num_tokens());
  plain.forward_backward(a.feature_batch(), MicroBatch::Accumulate, GradHooks{}, a.anchors);
  plain.forward_backward(b.feature_batch(), MicroBatch::Last, GradHooks{}, b.anchors);
  int begins = 0, accumulate_calls = 0;
  double prescale = -1;
  std::vector<std::pair<size_t, size_t>> ranges;
  std::vector<std::vector<float>> snapshots;
  GradHooks hooks;
  hooks.begin = [&](double p) {
    ++begins;
    prescale = p;
  };
  hooks.ready = [&](size_t lo, size_t hi) {
    ranges.push_back({lo, hi});
    const float* gr = hooked.grads().ptr<float>();
    snapshots.emplace_back(gr + lo, gr + hi);
  };
  hooked.forward_backward(a.feature_batch(), MicroBatch::Accumulate, hooks, a.anchors);
  accumulate_calls = begins + static_cast<int>(ranges.size());
  EXPECT_EQ(accumulate_calls, 0) << "an Accumulate micro-batch reports nothing";
  hooked.forward_backward(b.feature_batch(), MicroBatch::Last, hooks, b.anchors);
  EXPECT_EQ(begins, 1);
  EXPECT_EQ(prescale, 1.0);
  const std::vector<float> want = copy_of(plain.grads());
  EXPECT_EQ(std::memcmp(copy_of(hooked.grads()).data(), want.data(), want.size() * sizeof(float)), 0);
  size_t covered = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    covered += ranges[k].second - ranges[k].first;
    EXPECT_EQ(std::memcmp(snapshots[k].data(), want.data() + ranges[k].first, snapshots[k].size() * sizeof(float)), 0)
        << "range " << ranges[k].first << " reported before it was folded";
  }
  EXPECT_EQ(covered, want.size());
}

TEST(GradAccum, EndOfDataMidStepLeavesTheAccumulatedSum) {
  const train::GoldenInputs& g = golden();
  const train::GoldenInputs a = train::golden_sequences(g, 0, 2);
  DrafterTrainer one(g.target_dir, g.drafter_dir, 0, g.opt, cpu_ctx(), g.batch.num_tokens());
  DrafterTrainer acc(g.target_dir, g.drafter_dir, 0, g.opt, cpu_ctx(), g.batch.num_tokens());
  const StepStats s = one.forward_backward(a.feature_batch(), a.anchors);
  std::vector<float> want = copy_of(one.grads());
  for (float& x : want) x *= static_cast<float>(s.weight_sum);
  acc.forward_backward(a.feature_batch(), MicroBatch::Accumulate, GradHooks{}, a.anchors);
  acc.finish_accumulation();
  EXPECT_EQ(std::memcmp(copy_of(acc.grads()).data(), want.data(), want.size() * sizeof(float)), 0);
  // The next step starts afresh: a Whole batch is allowed again.
  acc.forward_backward(a.feature_batch(), a.anchors);
}

TEST(GradAccum, CpuOpsAccumulateAndFold) {
  const Ctx cpu = cpu_ctx();
  std::vector<float> acc = {9, 9, 9}, g1 = {1, 2, 3}, g2 = {-1, 0.5f, 4}, last = {10, 20, 30};
  ops::grad_accumulate(cpu, cpu_view(acc.data(), {3}), cpu_view(g1.data(), {3}), 2.f, ops::AccumInto::Overwrite);
  EXPECT_EQ(acc, (std::vector<float>{2, 4, 6}));
  ops::grad_accumulate(cpu, cpu_view(acc.data(), {3}), cpu_view(g2.data(), {3}), 4.f, ops::AccumInto::Add);
  EXPECT_EQ(acc, (std::vector<float>{-2, 6, 22}));
  const Tensor tl = cpu_view(last.data(), {3}), ta = cpu_view(acc.data(), {3});
  ops::grad_fold(cpu, tl.slice_rows(1, 3), ta.slice_rows(1, 3), 0.5f);
  EXPECT_EQ(last, (std::vector<float>{10, 16, 37}));
  std::vector<float> nan = {NAN, NAN, NAN};
  ops::grad_fold(cpu, cpu_view(nan.data(), {3}), ta, 0.f);
  EXPECT_EQ(nan, acc);
}

}  // namespace
}  // namespace dflash
