// DrafterTrainer's GradHooks on the CPU (include/dflash/drafter.h), golden case qwen3-tiny-a: begin() once,
// first, with the batch's weight sum; then every parameter's range of grads() once (the CPU reports layer by
// layer, each of the layer's parameters), the final norm first and fc last, each range already holding its
// final value when reported (a copy taken then equals the gradient after the step, bit for bit); the hooks
// change nothing; a batch without loss rows reports weight 0 and the whole (zero) gradient at once. Fused CE
// and D-PACE's second pass. The CUDA twin: tests/gpu/test_trainer_grad_hooks.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "dflash/drafter.h"
#include "dflash/drafter_model.h"
#include "drafter/drafter_golden.h"

namespace dflash {
namespace {

using Range = std::pair<size_t, size_t>;  // [first, second) of grads()

const train::GoldenInputs& golden() {
  static const train::GoldenInputs g =
      train::load_golden_inputs(std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a");
  return g;
}

// What the hooks saw in one forward_backward: the weight sum, the ranges in order, and a copy of each range
// taken when it was reported.
struct HookLog {
  int begins = 0, readies_before_begin = 0;
  double weight_sum = -1;
  std::vector<Range> ranges;
  std::vector<std::vector<float>> snapshots;
};

HookLog run_with_hooks(DrafterTrainer& tr, const FeatureBatch& fb, const std::vector<int64_t>& anchors, StepStats* st) {
  HookLog log;
  GradHooks hooks;
  hooks.begin = [&](double w) {
    ++log.begins;
    log.weight_sum = w;
  };
  hooks.ready = [&](size_t b, size_t e) {
    if (log.begins == 0) ++log.readies_before_begin;
    log.ranges.push_back({b, e});
    const float* g = tr.grads().ptr<float>();
    log.snapshots.emplace_back(g + b, g + e);
  };
  *st = tr.forward_backward(fb, hooks, anchors);
  return log;
}

TEST(TrainerGradHooks, CpuReportsEveryParameterOnceAlreadyFinal) {
  const train::GoldenInputs& g = golden();
  const FeatureBatch fb = g.feature_batch();
  for (bool dpace : {false, true}) {
    SCOPED_TRACE(dpace ? "dpace" : "ce");
    TrainOptions opt = g.opt;
    opt.dpace = dpace;
    DrafterTrainer tr(g.target_dir, g.drafter_dir, 0, opt, cpu_ctx(), g.batch.num_tokens());
    StepStats st;
    const HookLog log = run_with_hooks(tr, fb, g.anchors, &st);
    EXPECT_EQ(log.begins, 1);
    EXPECT_EQ(log.readies_before_begin, 0);
    EXPECT_EQ(log.weight_sum, st.weight_sum);
    EXPECT_GT(st.weight_sum, 0);
    // Every parameter once (the CPU reports per layer, parameter by parameter): norm first, fc last.
    const auto& layout = tr.param_layout();
    ASSERT_EQ(log.ranges.size(), layout.size());
    auto range_of = [&](const std::string& name) {
      for (const ParamSpec& p : layout)
        if (p.name == name) return Range{p.offset, p.offset + p.numel()};
      return Range{};
    };
    EXPECT_EQ(log.ranges.front(), range_of("norm.weight"));
    EXPECT_EQ(log.ranges.back(), range_of("fc.weight"));
    std::vector<Range> sorted = log.ranges;
    std::sort(sorted.begin(), sorted.end(), [](const Range& a, const Range& b) { return a.first < b.first; });
    for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i], range_of(layout[i].name)) << layout[i].name;
    // Final when reported: the copy taken then equals the gradient after forward_backward, bit for bit.
    const float* grad = tr.grads().ptr<float>();
    for (size_t k = 0; k < log.ranges.size(); ++k) {
      const Range& r = log.ranges[k];
      EXPECT_EQ(std::memcmp(log.snapshots[k].data(), grad + r.first, (r.second - r.first) * sizeof(float)), 0)
          << "range [" << r.first << ", " << r.second << ") changed after it was reported final";
    }
    // The hooks change nothing: the same step without them gives the same gradient.
    const std::vector<float> with(grad, grad + tr.grads().numel());
    tr.forward_backward(fb, g.anchors);
    EXPECT_EQ(std::memcmp(with.data(), tr.grads().ptr<float>(), with.size() * sizeof(float)), 0);
  }
}

TEST(TrainerGradHooks, BatchWithoutLossRowsReportsEverythingAtOnce) {
  const train::GoldenInputs& g = golden();
  DrafterTrainer tr(g.target_dir, g.drafter_dir, 0, g.opt, cpu_ctx(), g.batch.num_tokens());
  StepStats st;
  const HookLog log = run_with_hooks(tr, g.feature_batch(), {static_cast<int64_t>(g.batch.cu_seqlens[1]) - 1}, &st);
  EXPECT_EQ(log.begins, 1);
  EXPECT_EQ(log.weight_sum, 0.0);
  ASSERT_EQ(log.ranges.size(), 1u);
  EXPECT_EQ(log.ranges[0], (Range{0, tr.grads().numel()}));
  for (float x : log.snapshots[0]) ASSERT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace dflash
