// The CUDA trainer's GradHooks (include/dflash/drafter.h) on the golden case qwen3-tiny-a: begin() once,
// first, with the batch's weight sum; then every parameter's range once, norm first and fc last; and each
// range already final when reported. "Final" is checked the way a reducer uses it: at each report an
// event is recorded on the trainer's stream and a second stream, waiting for it, copies the range away;
// after the step every copy must equal the gradient bit for bit (a range reported before its last kernel
// would be copied half-written). Fused CE and D-PACE's second pass; the hooks must not change the gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "dflash/backend.h"
#include "dflash/device_async.h"
#include "dflash/drafter.h"
#include "gpu_test_util.h"
#include "drafter/drafter_golden.h"

namespace dflash {
namespace {

using test::gpu;
using Range = std::pair<size_t, size_t>;  // [first, second) of grads()

const train::GoldenInputs& golden() {
  static const train::GoldenInputs g = [] {
    const char* env_data = std::getenv("DFLASH_TEST_DATA");
    return train::load_golden_inputs(std::string(env_data ? env_data : DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a");
  }();
  return g;
}

std::vector<float> download(const Ctx& ctx, const Tensor& t) {
  std::vector<float> h(t.numel());
  copy_tensor(ctx, cpu_view(h.data(), {static_cast<int64_t>(h.size())}), t);
  return h;
}

TEST(TrainerGradHooksCuda, ReportsEveryParameterOnceAlreadyFinal) {
  SKIP_WITHOUT_GPU();
  const Ctx ctx = gpu();
  const Ctx side = side_ctx(ctx);
  const train::GoldenInputs& g = golden();
  const FeatureBatch host_fb = g.feature_batch();
  const int64_t K = host_fb.features.shape[0], T = host_fb.features.shape[1], H = host_fb.features.shape[2];
  Buffer features(Device::CUDA, DType::BF16, {K, T, H}), final_norm(Device::CUDA, DType::BF16, {T, H});
  copy_tensor(ctx, features, host_fb.features);
  copy_tensor(ctx, final_norm, host_fb.final_norm);
  synchronize(ctx);
  FeatureBatch fb;
  fb.batch = &g.batch;
  fb.features = features.t();
  fb.final_norm = final_norm.t();
  for (bool dpace : {false, true}) {
    SCOPED_TRACE(dpace ? "dpace" : "ce");
    TrainOptions opt = g.opt;
    opt.dpace = dpace;
    DrafterTrainer tr(g.target_dir, g.drafter_dir, 0, opt, ctx, T);
    const Tensor grads = tr.grads();
    const size_t P = grads.numel();
    Buffer copies(Device::CUDA, DType::F32, {static_cast<int64_t>(P)});  // each range, copied when reported
    std::vector<Event> events;
    events.reserve(256);
    int begins = 0, early = 0;
    double weight_sum = -1;
    std::vector<Range> ranges;
    GradHooks hooks;
    hooks.begin = [&](double w) {
      ++begins;
      weight_sum = w;
    };
    hooks.ready = [&](size_t b, size_t e) {
      if (begins == 0) ++early;
      ranges.push_back({b, e});
      events.emplace_back(ctx);
      events.back().record(ctx);
      events.back().order_before(side);
      copy_bytes_async(side, copies.ptr<float>() + b, grads.ptr<float>() + b, (e - b) * sizeof(float));
    };
    const StepStats st = tr.forward_backward(fb, hooks, g.anchors);
    synchronize(side);
    EXPECT_EQ(begins, 1);
    EXPECT_EQ(early, 0);
    EXPECT_EQ(weight_sum, st.weight_sum);
    const auto& layout = tr.param_layout();
    ASSERT_EQ(ranges.size(), layout.size()) << "one report per parameter";
    auto range_of = [&](const std::string& name) {
      for (const ParamSpec& p : layout)
        if (p.name == name) return Range{p.offset, p.offset + p.numel()};
      return Range{};
    };
    EXPECT_EQ(ranges.front(), range_of("norm.weight"));
    EXPECT_EQ(ranges.back(), range_of("fc.weight"));
    std::vector<Range> sorted = ranges;
    std::sort(sorted.begin(), sorted.end(), [](const Range& a, const Range& b) { return a.first < b.first; });
    for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i], range_of(layout[i].name)) << layout[i].name;
    const std::vector<float> final_grads = download(ctx, grads), copied = download(ctx, copies.t());
    for (const Range& r : ranges)
      EXPECT_EQ(std::memcmp(&copied[r.first], &final_grads[r.first], (r.second - r.first) * sizeof(float)), 0)
          << "range [" << r.first << ", " << r.second << ") changed after it was reported final";
    // The hooks change nothing (the same step again, without them).
    tr.forward_backward(fb, g.anchors);
    EXPECT_LE(test::rel_err(download(ctx, grads), final_grads), test::tol::kSameComputation);
  }
}

}  // namespace
}  // namespace dflash
