// The bucketed gradient sum over drafter ranks on the CPU backend (HostMpi reducer), run by mpirun with 2
// and 3 ranks (tests/CMakeLists.txt: mpi.grad_reduce_np2/np3). nccl-tests style: every rank regenerates
// every rank's input from a seed and computes the expected sum itself, so each rank checks its own result.
//   Synthetic: seeded gradients, each rank reporting its ranges in its own pieces and order, with a
//     collective of the caller's own issued in the middle (at a different point on each rank) — the sum
//     must equal the one-shot sum of the prescaled gradients for bucket caps 0 (one bucket), 1 element
//     (one bucket per parameter) and a few in between, over several steps of one reducer.
//   Trainer: DrafterTrainer (golden case qwen3-tiny-a, CPU) on a different batch per rank, the reducer fed
//     by GradHooks as the backward runs (fused CE, D-PACE's second pass, and a rank with no loss rows):
//     the result must equal the sum over ranks of Σw_r · grad_r computed locally, buckets must launch
//     during the backward when the cap allows, and the reported ranges must tile [0, P) once.
// Exactness: with 2 ranks a sum is one IEEE addition, so the result must be bit-identical to the local
// a + b (and to the one-bucket result); with 3 the MPI library picks the association, so within 1e-6
// relative to the sum of magnitudes.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dflash/drafter.h"
#include "dflash/grad_reducer.h"
#include "dflash/mpi_typed.h"
#include "grad_test_util.h"
#include "drafter/drafter_golden.h"

namespace dflash {
namespace {

using namespace test;

TEST(GradReduceMpi, SyntheticBucketsEqualTheOneShotSum) {
  const int rank = world_rank(), size = world_size();
  // Parameter sizes like a small drafter's: norms, projections, one oversize tensor.
  std::mt19937 layout_rng(42);
  std::vector<size_t> sizes;
  for (int i = 0; i < 23; ++i) sizes.push_back(1 + layout_rng() % (i == 5 ? 4000 : 600));
  const std::vector<GradRange> params = ranges_of(sizes);
  const size_t P = params.back().end;
  std::map<size_t, std::vector<float>> results;  // cap -> the last step's sum
  for (size_t cap : {size_t{0}, size_t{1}, size_t{250}, size_t{1200}, size_t{1} << 20}) {
    SCOPED_TRACE("cap " + std::to_string(cap));
    const std::vector<GradRange> plan = plan_grad_buckets(params, cap);
    auto reducer = make_gradient_reducer(GradReduceKind::HostMpi, MPI_COMM_WORLD, cpu_ctx(), plan, 60);
    ASSERT_EQ(reducer->buckets(), plan);
    std::mt19937 pieces(5u + static_cast<uint32_t>(rank));  // each rank reports in its own pieces
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g = seeded(P, rank, step);
      reducer->begin_step(cpu_view(g.data(), {static_cast<int64_t>(P)}), prescale_of(rank, step));
      // Parameters in an order of this rank's own (rank 0: from the last, like a backward; rank 1: from the
      // first; others: shuffled), each in 1-3 pieces from its top. Buckets must still launch in plan order.
      std::vector<size_t> order(params.size());
      for (size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
      if (rank == 1) std::reverse(order.begin(), order.end());
      if (rank >= 2) std::shuffle(order.begin(), order.end(), pieces);
      size_t reported = 0;
      bool side_done = false;
      for (size_t k : order) {
        size_t hi = params[k].end;
        while (hi > params[k].begin) {
          const size_t piece = std::max<size_t>(1, params[k].size() / (1 + pieces() % 3));
          const size_t lo = hi - std::min(piece, hi - params[k].begin);
          reducer->ready(lo, hi);
          reported += hi - lo;
          hi = lo;
        }
        // The caller's own collective (role_drafter: the step's numbers), at a different point per rank.
        if (!side_done && reported * size >= P * static_cast<size_t>(rank + 1) / 2) {
          double x = rank + 1.0;
          MPI_Request r = mpi::iallreduce(&x, 1, MPI_SUM, MPI_COMM_WORLD);
          mpi::wait(r, 60, [] { return std::string("side allreduce"); });
          EXPECT_EQ(x, size * (size + 1) / 2.0);
          side_done = true;
        }
      }
      EXPECT_EQ(reducer->launched(), plan.size());
      ASSERT_TRUE(wait_done(*reducer)) << "the sum did not complete";
      std::vector<float> want(P, 0.f), magnitude(P, 0.f);
      for (int r = 0; r < size; ++r) {
        const std::vector<float> x = seeded(P, r, step);
        const float s = prescale_of(r, step);
        for (size_t i = 0; i < P; ++i) {
          want[i] += x[i] * s;
          magnitude[i] += std::fabs(x[i] * s);
        }
      }
      EXPECT_EQ(compare_sum(g.data(), want, magnitude, "step " + std::to_string(step)), 0u);
      if (step == 2) results[cap] = g;
    }
  }
  // Every cap against one bucket: bit for bit with 2 ranks (one addition), reported with more.
  size_t differ = 0;
  for (const auto& [cap, v] : results)
    for (size_t i = 0; i < P; ++i) differ += std::memcmp(&v[i], &results.at(0)[i], sizeof(float)) != 0;
  if (size == 2) {
    EXPECT_EQ(differ, 0u);
  }
  if (rank == 0) std::printf("# %d ranks: %zu elements of %zu differ in the last bit between bucket caps\n", size, differ, P * results.size());
}

// ---- the trainer ---------------------------------------------------------------------------------------

const train::GoldenInputs& golden() {
  static const train::GoldenInputs g = [] {
    const char* env_data = std::getenv("DFLASH_TEST_DATA");
    return train::load_golden_inputs(std::string(env_data ? env_data : DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a");
  }();
  return g;
}

// Rank r's batch: a seeded subset of the case's anchors (sorted); `empty`: one anchor at the end of the
// first sequence (no loss rows: a zero gradient, weight sum 0).
std::vector<int64_t> anchors_of(int r, bool empty) {
  const train::GoldenInputs& g = golden();
  if (empty) return {static_cast<int64_t>(g.batch.cu_seqlens[1]) - 1};
  std::vector<int64_t> a = g.anchors;
  std::mt19937 rng(100u + static_cast<uint32_t>(r));
  std::shuffle(a.begin(), a.end(), rng);
  a.resize(std::min(a.size(), static_cast<size_t>(5 + 2 * r)));
  std::sort(a.begin(), a.end());
  return a;
}

struct Variant {
  const char* name;
  bool dpace;
  int empty_rank;  // this rank's batch has no loss rows (-1: none)
};

TEST(GradReduceMpi, TrainerBucketsEqualTheSumOfEveryRanksGradient) {
  const int rank = world_rank(), size = world_size();
  const train::GoldenInputs& g = golden();
  const FeatureBatch fb = g.feature_batch();
  for (const Variant v : {Variant{"ce", false, -1}, Variant{"dpace", true, -1}, Variant{"ce, rank 1 empty", false, 1}}) {
    SCOPED_TRACE(v.name);
    TrainOptions opt = g.opt;
    opt.dpace = v.dpace;
    DrafterTrainer mine(g.target_dir, g.drafter_dir, 0, opt, cpu_ctx(), g.batch.num_tokens());
    DrafterTrainer ref(g.target_dir, g.drafter_dir, 0, opt, cpu_ctx(), g.batch.num_tokens());
    const size_t P = mine.grads().numel();
    // Every rank's Σw_r · grad_r, computed here.
    std::vector<float> want(P, 0.f), magnitude(P, 0.f);
    for (int r = 0; r < size; ++r) {
      const StepStats st = ref.forward_backward(fb, anchors_of(r, r == v.empty_rank));
      const float s = static_cast<float>(st.weight_sum);
      const float* x = ref.grads().ptr<float>();
      for (size_t i = 0; i < P; ++i) {
        want[i] += x[i] * s;
        magnitude[i] += std::fabs(x[i] * s);
      }
    }
    std::vector<GradRange> params;
    size_t layer = 0;  // elements of layer 0
    for (const ParamSpec& p : mine.param_layout()) {
      params.push_back({p.offset, p.offset + p.numel()});
      if (p.name.rfind("layers.0.", 0) == 0) layer += p.numel();
    }
    for (size_t cap : {size_t{0}, size_t{1}, layer}) {
      SCOPED_TRACE("cap " + std::to_string(cap));
      auto reducer = make_gradient_reducer(GradReduceKind::HostMpi, MPI_COMM_WORLD, cpu_ctx(), plan_grad_buckets(params, cap), 60);
      double prescale = -1;
      std::vector<GradRange> seen;
      std::vector<size_t> launched_at;  // buckets launched after each report
      GradHooks hooks;
      hooks.begin = [&](double w) {
        prescale = w;
        reducer->begin_step(mine.grads(), static_cast<float>(w));
      };
      hooks.ready = [&](size_t b, size_t e) {
        seen.push_back({b, e});
        reducer->ready(b, e);
        launched_at.push_back(reducer->launched());
      };
      const StepStats st = mine.forward_backward(fb, hooks, anchors_of(rank, rank == v.empty_rank));
      EXPECT_EQ(prescale, st.weight_sum);
      // The reported ranges tile [0, P) exactly once.
      std::vector<GradRange> sorted = seen;
      std::sort(sorted.begin(), sorted.end(), [](const GradRange& a, const GradRange& b) { return a.begin < b.begin; });
      size_t at = 0;
      for (const GradRange& r : sorted) {
        EXPECT_EQ(r.begin, at);
        at = r.end;
      }
      EXPECT_EQ(at, P);
      // With a per-parameter cap the first bucket (the final norm) goes at the backward's first report;
      // with one bucket nothing goes before the last.
      ASSERT_FALSE(launched_at.empty());
      const bool empty_batch = rank == v.empty_rank;
      if (cap == 1 && !empty_batch) {
        EXPECT_GE(launched_at.front(), 1u);
      }
      if (cap == 0) {
        EXPECT_EQ(std::count(launched_at.begin(), launched_at.end(), size_t{0}), static_cast<long>(launched_at.size() - 1));
      }
      if (cap > 0 && !empty_batch) {
        EXPECT_GT(seen.size(), 3u) << "the CPU backward reports per layer";
      }
      ASSERT_TRUE(wait_done(*reducer)) << "the sum did not complete";
      EXPECT_EQ(compare_sum(mine.grads().ptr<float>(), want, magnitude, "gradient"), 0u);
    }
  }
}

}  // namespace
}  // namespace dflash
