// The bucketed gradient sum on CUDA, run by mpirun with 1 and 2 ranks (tests/CMakeLists.txt:
// gpu_mpi.grad_reduce_np1/np2, labels gpu and mpi). Each rank uses GPU rank % visible GPUs; one rank alone
// sums nothing, but runs every stream, event and prescale of the path (NCCL included, on one GPU).
//   HostMpi staging (needs 1 GPU; both ranks may share it): device gradients written on the trainer's
//     stream bucket by bucket, each write behind a kernel that only waits and after the whole buffer was
//     poisoned with NaN, so a bucket staged before its "final" event would carry NaN or the last step's
//     sum; the result must equal the one-shot sum bit for bit (2 ranks: one addition).
//   NCCL (needs a GPU per rank; skipped otherwise): the same, ncclAllReduce per bucket on the reducer's
//     own stream.
//   The CUDA trainer (golden case qwen3-tiny-a) feeding either reducer through GradHooks: the sum equals
//     Σ_r Σw_r · grad_r computed locally by a second trainer (1e-5 relative: the local gradients are
//     recomputed, and not every CUDA kernel promises bit-identical results run to run).
// Every test skips itself, with the reason, where the GPUs it needs are not there.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../mpi/grad_test_util.h"
#include "dflash/backend.h"
#include "dflash/device_async.h"
#include "dflash/drafter.h"
#include "dflash/grad_reducer.h"
#include "gpu_spin.h"
#include "drafter/drafter_golden.h"

namespace dflash {
namespace {

using namespace test;

// "" when this job can run `kind` on CUDA, else why not (the same answer on every rank).
std::string missing_gpus(GradReduceKind kind) {
  const int gpus = cuda_device_count(), size = world_size();
  if (gpus == 0) return "no CUDA device visible";
  if (kind == GradReduceKind::Nccl && gpus < size)
    return "the NCCL reducer needs a GPU per rank: " + std::to_string(size) + " ranks, " + std::to_string(gpus) +
           " GPU(s) visible (run on a machine with 2 GPUs)";
  return "";
}

Ctx my_gpu() { return make_ctx(Device::CUDA, world_rank() % cuda_device_count()); }

void synthetic(GradReduceKind kind) {
  const int rank = world_rank(), size = world_size();
  const Ctx ctx = my_gpu();
  std::mt19937 layout_rng(42);
  std::vector<size_t> sizes;
  for (int i = 0; i < 23; ++i) sizes.push_back(1 + layout_rng() % (i == 5 ? 40000 : 6000));
  const std::vector<GradRange> params = ranges_of(sizes);
  const size_t P = params.back().end;
  Buffer grads(Device::CUDA, DType::F32, {static_cast<int64_t>(P)});
  HostBuffer staged(P * sizeof(float), HostMemory::Pinned);  // this rank's gradient, written from here
  float* host = static_cast<float*>(staged.data());
  std::vector<float> out(P);
  for (size_t cap : {size_t{0}, size_t{1}, size_t{2500}, size_t{12000}, size_t{1} << 22}) {
    SCOPED_TRACE("cap " + std::to_string(cap));
    const std::vector<GradRange> plan = plan_grad_buckets(params, cap);
    auto reducer = make_gradient_reducer(kind, MPI_COMM_WORLD, ctx, plan, 60);
    ASSERT_EQ(reducer->kind(), kind);
    for (int step = 0; step < 3; ++step) {
      synchronize(ctx);  // the last step's sums are read; host is free again
      const std::vector<float> mine = seeded(P, rank, step);
      std::copy(mine.begin(), mine.end(), host);
      DF_CHECK(cudaMemsetAsync(grads.t().data, 0xff, grads.t().nbytes(), static_cast<cudaStream_t>(ctx.stream)) ==
                   cudaSuccess, Internal, "memset");
      reducer->begin_step(grads.t(), prescale_of(rank, step));
      // The "backward": parameters from the last, each written after a wait, then reported final.
      for (size_t k = params.size(); k-- > 0;) {
        gpu_spin(ctx, 200);
        const GradRange& p = params[k];
        copy_bytes_async(ctx, grads.ptr<float>() + p.begin, host + p.begin, p.size() * sizeof(float));
        reducer->ready(p.begin, p.end);
      }
      ASSERT_TRUE(wait_done(*reducer)) << "the sum did not complete";
      // The trainer's stream is ordered after the sums: read them there.
      copy_tensor(ctx, cpu_view(out.data(), {static_cast<int64_t>(P)}), grads.t());
      std::vector<float> want(P, 0.f), magnitude(P, 0.f);
      for (int r = 0; r < size; ++r) {
        const std::vector<float> x = seeded(P, r, step);
        const float s = prescale_of(r, step);
        for (size_t i = 0; i < P; ++i) {
          want[i] += x[i] * s;
          magnitude[i] += std::fabs(x[i] * s);
        }
      }
      EXPECT_EQ(compare_sum(out.data(), want, magnitude, "step " + std::to_string(step)), 0u);
    }
  }
}

TEST(GradReduceCudaMpi, HostMpiStagedBucketsEqualTheOneShotSum) {
  const std::string why = missing_gpus(GradReduceKind::HostMpi);
  if (!why.empty()) GTEST_SKIP() << why;
  synthetic(GradReduceKind::HostMpi);
}

TEST(GradReduceCudaMpi, NcclBucketsEqualTheOneShotSum) {
  const std::string why = missing_gpus(GradReduceKind::Nccl);
  if (!why.empty()) GTEST_SKIP() << why;
  synthetic(GradReduceKind::Nccl);
}

// ---- the CUDA trainer ------------------------------------------------------------------------------------

const train::GoldenInputs& golden() {
  static const train::GoldenInputs g = [] {
    const char* env_data = std::getenv("DFLASH_TEST_DATA");
    return train::load_golden_inputs(std::string(env_data ? env_data : DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a");
  }();
  return g;
}

std::vector<int64_t> anchors_of(int r) {
  std::vector<int64_t> a = golden().anchors;
  std::mt19937 rng(100u + static_cast<uint32_t>(r));
  std::shuffle(a.begin(), a.end(), rng);
  a.resize(std::min(a.size(), static_cast<size_t>(5 + 2 * r)));
  std::sort(a.begin(), a.end());
  return a;
}

void trainer(GradReduceKind kind) {
  const int rank = world_rank(), size = world_size();
  const Ctx ctx = my_gpu();
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
    DrafterTrainer mine(g.target_dir, g.drafter_dir, 0, opt, ctx, T);
    DrafterTrainer ref(g.target_dir, g.drafter_dir, 0, opt, ctx, T);
    const size_t P = mine.grads().numel();
    std::vector<double> want(P, 0.0);
    std::vector<float> x(P);
    for (int r = 0; r < size; ++r) {
      const StepStats st = ref.forward_backward(fb, anchors_of(r));
      copy_tensor(ctx, cpu_view(x.data(), {static_cast<int64_t>(P)}), ref.grads());
      const float s = static_cast<float>(st.weight_sum);
      for (size_t i = 0; i < P; ++i) want[i] += x[i] * s;
    }
    std::vector<GradRange> params;
    for (const ParamSpec& p : mine.param_layout()) params.push_back({p.offset, p.offset + p.numel()});
    for (size_t cap : {size_t{0}, size_t{1}, size_t{20000}}) {
      SCOPED_TRACE("cap " + std::to_string(cap));
      auto reducer = make_gradient_reducer(kind, MPI_COMM_WORLD, ctx, plan_grad_buckets(params, cap), 60);
      size_t reports = 0, launched_before_last = 0;
      GradHooks hooks;
      hooks.begin = [&](double w) { reducer->begin_step(mine.grads(), static_cast<float>(w)); };
      hooks.ready = [&](size_t b, size_t e) {
        launched_before_last = reducer->launched();
        reducer->ready(b, e);
        ++reports;
      };
      mine.forward_backward(fb, hooks, anchors_of(rank));
      EXPECT_EQ(reports, params.size()) << "the CUDA backward reports each parameter once";
      if (cap == 1) {
        EXPECT_GT(launched_before_last, 0u) << "buckets launch while the backward is enqueued";
      }
      ASSERT_TRUE(wait_done(*reducer)) << "the sum did not complete";
      copy_tensor(ctx, cpu_view(x.data(), {static_cast<int64_t>(P)}), mine.grads());
      double num = 0, den = 0;
      for (size_t i = 0; i < P; ++i) {
        num += (x[i] - want[i]) * (x[i] - want[i]);
        den += want[i] * want[i];
      }
      EXPECT_LE(std::sqrt(num / den), 1e-5) << "the bucketed sum against the local Σ_r Σw_r grad_r";
    }
  }
}

TEST(GradReduceCudaMpi, TrainerThroughHostMpiBuckets) {
  const std::string why = missing_gpus(GradReduceKind::HostMpi);
  if (!why.empty()) GTEST_SKIP() << why;
  trainer(GradReduceKind::HostMpi);
}

TEST(GradReduceCudaMpi, TrainerThroughNcclBuckets) {
  const std::string why = missing_gpus(GradReduceKind::Nccl);
  if (!why.empty()) GTEST_SKIP() << why;
  trainer(GradReduceKind::Nccl);
}

}  // namespace
}  // namespace dflash
