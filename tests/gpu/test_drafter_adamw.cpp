// AdamW + global-norm clipping on CUDA against the CPU twin (src/ops/optim.cpp): the op-by-op path
// (grad_sumsq, clip, adamw_step) and the fused clip_adamw_step with its bf16 weight copy, over three steps
// on a buffer whose length is not a multiple of 4 (vector body + scalar tail).
#include <gtest/gtest.h>

#include <random>

#include "adamw.cuh"
#include "dflash/optim.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::gpu;
using test::rel_err;
using test::to_host;

std::vector<float> normal(size_t n, uint32_t seed, float sigma, bool positive = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = positive ? std::fabs(d(rng)) : d(rng);
  return v;
}

Buffer f32_device(const Ctx& g, const std::vector<float>& h) {
  Buffer b(Device::CUDA, DType::F32, {static_cast<int64_t>(h.size())});
  copy_tensor(g, b, cpu_view(h.data(), {static_cast<int64_t>(h.size())}));
  return b;
}

TEST(GpuDrafterAdamW, StepsAndClipMatchCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const Ctx cpu = cpu_ctx();
  const int64_t n = 1000003;
  ops::AdamWHyper hp;
  hp.lr = 1e-3f;
  hp.weight_decay = 0.1f;
  auto p = normal(n, 1, 0.02f), m = normal(n, 2, 1e-3f), v = normal(n, 3, 1e-6f, true);
  Buffer dp = f32_device(g, p), dm = f32_device(g, m), dv = f32_device(g, v);           // op-by-op
  Buffer fp = f32_device(g, p), fm = f32_device(g, m), fv = f32_device(g, v);           // fused
  Buffer fbf(Device::CUDA, DType::BF16, {n});
  for (int64_t step = 1; step <= 3; ++step) {
    auto grad = normal(n, 10 + step, step == 2 ? 1e-4f : 0.01f);  // step 2 is under the clip threshold
    const float clip = 1.0f;
    Buffer dg = f32_device(g, grad), fg = f32_device(g, grad);
    Tensor gc = cpu_view(grad.data(), {n});
    const double sumsq_cpu = ops::grad_sumsq(cpu, gc);
    EXPECT_NEAR(ops::grad_sumsq(g, dg), sumsq_cpu, test::tol::kGradSumsq * sumsq_cpu) << "step " << step;
    const double norm_cpu = ops::clip_grad_global_norm(cpu, gc, clip);
    ops::adamw_step(cpu, cpu_view(p.data(), {n}), gc, cpu_view(m.data(), {n}), cpu_view(v.data(), {n}), hp, step);
    EXPECT_NEAR(ops::clip_grad_global_norm(g, dg, clip), norm_cpu, test::tol::kGradNorm * norm_cpu);
    ops::adamw_step(g, dp, dg, dm, dv, hp, step);
    cuda::clip_adamw_step(g, fp, fg, fm, fv, hp, step, clip, fbf);
    EXPECT_NEAR(cuda::last_grad_norm(g), norm_cpu, test::tol::kGradNorm * norm_cpu);
    for (const Buffer* b : {&dp, &fp}) EXPECT_LT(rel_err(to_host(g, *b), p), test::tol::kF32SumOrder) << "params step " << step;
    for (const Buffer* b : {&dm, &fm}) EXPECT_LT(rel_err(to_host(g, *b), m), test::tol::kF32SumOrder) << "m step " << step;
    for (const Buffer* b : {&dv, &fv}) EXPECT_LT(rel_err(to_host(g, *b), v), test::tol::kF32SumOrder) << "v step " << step;
    EXPECT_LT(rel_err(to_host(g, fbf), p), test::tol::kBf16Copy) << "bf16 copy step " << step;
  }
}

}  // namespace
}  // namespace dflash
