// Gradient buckets (include/dflash/grad_reducer.h): the plan (plan_grad_buckets: every element once, in
// launch order = descending offsets, within the cap unless a single parameter is larger, greedy), the
// --grad-bucket-mb conversion, and the bookkeeping every reducer shares (a bucket launches once it is
// wholly reported, never before the buckets ahead of it in the plan; a range reported twice or a step left
// incomplete is an Internal error). The sums themselves run over MPI: tests/mpi/.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "dflash/drafter_model.h"
#include "dflash/grad_buckets.h"
#include "dflash/hf_config.h"
#include "dflash/options.h"

namespace dflash {
namespace {

std::vector<GradRange> ranges_of(const std::vector<size_t>& sizes) {
  std::vector<GradRange> r;
  size_t at = 0;
  for (size_t n : sizes) {
    r.push_back({at, at + n});
    at += n;
  }
  return r;
}

// Every property of a plan over `params` with cap `cap` (> 0).
void check_plan(const std::vector<GradRange>& params, size_t cap, const std::vector<GradRange>& plan) {
  ASSERT_FALSE(plan.empty());
  const size_t P = params.back().end;
  // Launch order: descending, contiguous, covering [0, P) exactly once.
  EXPECT_EQ(plan.front().end, P);
  EXPECT_EQ(plan.back().begin, 0u);
  for (size_t i = 0; i + 1 < plan.size(); ++i) EXPECT_EQ(plan[i + 1].end, plan[i].begin) << "bucket " << i;
  auto is_param_boundary = [&](size_t x) {
    return std::any_of(params.begin(), params.end(), [&](const GradRange& p) { return p.begin == x; }) || x == P;
  };
  for (size_t i = 0; i < plan.size(); ++i) {
    const GradRange& b = plan[i];
    EXPECT_GT(b.size(), 0u);
    EXPECT_TRUE(is_param_boundary(b.begin) && is_param_boundary(b.end)) << "bucket " << i << " cuts a parameter";
    const bool single = std::any_of(params.begin(), params.end(), [&](const GradRange& p) { return p == b; });
    EXPECT_TRUE(b.size() <= cap || single) << "bucket " << i << " of " << b.size() << " elements exceeds the cap " << cap;
    // Greedy: the parameter just below a bucket (the next one walked) did not fit into it.
    if (i + 1 < plan.size()) {
      const auto below = std::find_if(params.begin(), params.end(), [&](const GradRange& p) { return p.end == b.begin; });
      ASSERT_NE(below, params.end());
      EXPECT_GT(b.size() + below->size(), cap) << "bucket " << i << " could have taken the next parameter";
    }
  }
}

TEST(GradBuckets, CapZeroIsOneBucket) {
  const auto params = ranges_of({10, 3, 7});
  const auto plan = plan_grad_buckets(params, 0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0], (GradRange{0, 20}));
}

TEST(GradBuckets, TinyCapIsOneBucketPerParameterLastFirst) {
  const auto params = ranges_of({10, 3, 7, 1});
  const auto plan = plan_grad_buckets(params, 1);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0], (GradRange{20, 21}));
  EXPECT_EQ(plan[1], (GradRange{13, 20}));
  EXPECT_EQ(plan[2], (GradRange{10, 13}));
  EXPECT_EQ(plan[3], (GradRange{0, 10}));
  check_plan(params, 1, plan);
}

TEST(GradBuckets, MergesUpToTheCapAndKeepsOversizeParametersAlone) {
  const auto params = ranges_of({4, 4, 30, 2, 2, 2, 9, 1});
  const auto plan = plan_grad_buckets(params, 8);
  // From the top: {1} + {9}? 10 > 8: [1] alone; [9] alone (oversize); {2,2,2} = 6; [30] alone; {4,4} = 8.
  const std::vector<GradRange> want = {{53, 54}, {44, 53}, {38, 44}, {8, 38}, {0, 8}};
  EXPECT_EQ(plan, want);
  check_plan(params, 8, plan);
}

TEST(GradBuckets, ParametersInAnyOrder) {
  auto params = ranges_of({5, 6, 7, 8});
  std::reverse(params.begin(), params.end());
  EXPECT_EQ(plan_grad_buckets(params, 13), (std::vector<GradRange>{{18, 26}, {5, 18}, {0, 5}}));
}

TEST(GradBuckets, RandomLayoutsAndCaps) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> sizes(1 + rng() % 40);
    for (size_t& n : sizes) n = 1 + rng() % (rng() % 4 == 0 ? 5000 : 300);
    const auto params = ranges_of(sizes);
    const size_t cap = 1 + rng() % 2000;
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_plan(params, cap, plan_grad_buckets(params, cap));
  }
}

TEST(GradBuckets, DrafterLayoutOneBucketPerLayerAtTheLayerSize) {
  Qwen3Config L;
  L.hidden_size = 64;
  L.num_attention_heads = 4;
  L.num_key_value_heads = 2;
  L.head_dim = 16;
  L.intermediate_size = 96;
  L.num_hidden_layers = 3;
  L.vocab_size = 512;
  DrafterConfig c;
  c.layers = L;
  c.block_size = 4;
  c.target_layer_ids = {1, 3};
  const auto layout = drafter_param_layout(c);
  std::vector<GradRange> params;
  for (const ParamSpec& p : layout) params.push_back({p.offset, p.offset + p.numel()});
  // One layer's parameters: layers.1.* from its input_layernorm to its down_proj.
  size_t lb = 0, le = 0;
  for (const ParamSpec& p : layout) {
    if (p.name == "layers.1.input_layernorm.weight") lb = p.offset;
    if (p.name == "layers.1.mlp.down_proj.weight") le = p.offset + p.numel();
  }
  const size_t layer = le - lb;
  const auto plan = plan_grad_buckets(params, layer);
  check_plan(params, layer, plan);
  // P = fc 8192 + hidden_norm 64 + 3 layers of 30784 + norm 64: at least 4 buckets of at most a layer;
  // the final norm shifts every cut a little (the first bucket is the norm and most of the last layer).
  EXPECT_GE(plan.size(), 4u);
  EXPECT_LE(plan.size(), 6u);
  EXPECT_EQ(plan.front().end, drafter_param_count(c));
}

TEST(GradBuckets, CapInMiB) {
  EXPECT_EQ(grad_bucket_elements(0), 0u);
  EXPECT_EQ(grad_bucket_elements(25), size_t{25} * 1024 * 1024 / 4);
  EXPECT_EQ(grad_bucket_elements(1e-9), 1u);  // any positive cap: at least one element
  EXPECT_EQ(grad_bucket_elements(-1), 0u);
}

Options parse(std::vector<const char*> extra) {
  std::vector<const char*> argv = {"dflash-train", "--target", "t", "--data", "d.h5", "--out", "o"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return parse_options(static_cast<int>(argv.size()), argv.data()).options;
}

TEST(GradBuckets, OptionDefaultAndRange) {
  EXPECT_EQ(parse({}).grad_bucket_mb, 25.0);
  EXPECT_EQ(parse({"--grad-bucket-mb", "0"}).grad_bucket_mb, 0.0);
  EXPECT_EQ(parse({"--grad-bucket-mb", "0.5"}).grad_bucket_mb, 0.5);
  EXPECT_EXIT(parse({"--grad-bucket-mb", "-1"}), testing::ExitedWithCode(2), "grad-bucket-mb");
  EXPECT_EXIT(parse({"--grad-bucket-mb", "nan"}), testing::ExitedWithCode(2), "grad-bucket-mb");
}

TEST(GradBucketsDeath, ParametersMustTileTheGradient) {
  EXPECT_EXIT(plan_grad_buckets({{0, 4}, {5, 8}}, 4), testing::ExitedWithCode(9), "do not tile");
  EXPECT_EXIT(plan_grad_buckets({{0, 4}, {2, 8}}, 4), testing::ExitedWithCode(9), "do not tile");
  EXPECT_EXIT(plan_grad_buckets({}, 4), testing::ExitedWithCode(9), "empty gradient");
}

// The shared bookkeeping, with a reducer that records its launches and sums nothing.
class RecordingReducer final : public GradientReducer {
 public:
  explicit RecordingReducer(std::vector<GradRange> b) : GradientReducer(std::move(b)) {}
  GradReduceKind kind() const override { return GradReduceKind::HostMpi; }
  void abort() override {}
  std::vector<size_t> launches;
  std::vector<float> prescales;
  int steps = 0;

 protected:
  void on_begin_step() override {
    ++steps;
    launches.clear();
  }
  void launch(size_t i) override {
    launches.push_back(i);
    prescales.push_back(prescale());
    EXPECT_EQ(bucket_view(i).numel(), buckets()[i].size());
  }
  bool progress() override { return true; }
};

TEST(GradBucketBookkeeping, LaunchesInPlanOrderOnceWhole) {
  std::vector<float> g(20);
  const Tensor grads = cpu_view(g.data(), {20});
  // Plan: [15,20) [10,15) [0,10).
  RecordingReducer r({{15, 20}, {10, 15}, {0, 10}});
  r.begin_step(grads, 2.5f);
  r.ready(12, 15);  // part of bucket 1
  EXPECT_TRUE(r.launches.empty());
  r.ready(0, 10);  // bucket 2 whole, but 0 and 1 are not yet launched
  EXPECT_TRUE(r.launches.empty());
  r.ready(10, 12);  // bucket 1 whole; still waits for bucket 0
  EXPECT_TRUE(r.launches.empty());
  r.ready(17, 20);
  EXPECT_TRUE(r.launches.empty());
  r.ready(15, 17);  // bucket 0 whole: all three go, in order
  EXPECT_EQ(r.launches, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(r.launched(), 3u);
  EXPECT_TRUE(r.done());
  EXPECT_EQ(r.prescales, (std::vector<float>{2.5f, 2.5f, 2.5f}));

  // A second step; one range across every bucket.
  r.begin_step(grads, 1.0f);
  r.ready(0, 20);
  EXPECT_EQ(r.launches, (std::vector<size_t>{0, 1, 2}));
  EXPECT_TRUE(r.done());
  // The one-shot form.
  r.start(grads);
  EXPECT_EQ(r.launches.size(), 3u);
  EXPECT_TRUE(r.done());
  EXPECT_EQ(r.steps, 3);
}

TEST(GradBucketBookkeeping, BackwardOrderLaunchesAsItGoes) {
  std::vector<float> g(20);
  RecordingReducer r({{15, 20}, {10, 15}, {0, 10}});
  r.begin_step(cpu_view(g.data(), {20}), 1.0f);
  r.ready(15, 20);
  EXPECT_EQ(r.launches, (std::vector<size_t>{0}));
  r.ready(10, 15);
  EXPECT_EQ(r.launches, (std::vector<size_t>{0, 1}));
  r.ready(5, 10);
  r.ready(0, 5);
  EXPECT_EQ(r.launches, (std::vector<size_t>{0, 1, 2}));
  EXPECT_TRUE(r.done());
}

TEST(GradBucketBookkeepingDeath, MisuseIsAnInternalError) {
  std::vector<float> g(20);
  const Tensor grads = cpu_view(g.data(), {20});
  EXPECT_EXIT(
      {
        RecordingReducer r({{10, 20}, {0, 10}});
        r.begin_step(grads, 1.0f);
        r.ready(0, 12);
        r.ready(11, 20);
      },
      testing::ExitedWithCode(9), "reported final twice");
  EXPECT_EXIT(
      {
        RecordingReducer r({{10, 20}, {0, 10}});
        r.begin_step(grads, 1.0f);
        r.ready(10, 20);
        r.done();
      },
      testing::ExitedWithCode(9), "never reported final");
  EXPECT_EXIT(
      {
        RecordingReducer r({{10, 20}, {0, 10}});
        r.begin_step(grads, 1.0f);
        r.begin_step(grads, 1.0f);
      },
      testing::ExitedWithCode(9), "before the last one was done");
  EXPECT_EXIT(
      {
        RecordingReducer r({{10, 20}, {0, 10}});
        r.begin_step(cpu_view(g.data(), {19}), 1.0f);
      },
      testing::ExitedWithCode(9), "planned F32");
  EXPECT_EXIT(RecordingReducer({{10, 20}, {0, 9}}), testing::ExitedWithCode(9), "do not tile");
}

}  // namespace
}  // namespace dflash
