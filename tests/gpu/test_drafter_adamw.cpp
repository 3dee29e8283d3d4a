// AdamW + global-norm clipping on CUDA against the CPU twin (src/ops/optim.cpp): the op-by-op path
// (grad_sumsq, clip, adamw_step) and the fused clip_adamw_step with its bf16 weight copy, over three steps
// on a buffer whose length is not a multiple of 4 (vector body + scalar tail); and the bf16 state's
// (--optimizer-state bf16) adamw_step_bf16state / clip_adamw_step_bf16state against the CPU op, on a length
// that is not a multiple of 8 (its vector width).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>

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

// The bf16 state's bits of a host F32 vector of bf16 values (the bf16 pattern of each).
std::vector<uint16_t> bf16_bits(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16(x[i]);
  return b;
}

// Elements whose bf16 patterns differ (counted) and the largest difference in ulps (same sign: the patterns
// are sign-magnitude, so one ulp is a difference of 1; a sign change counts as far apart).
struct UlpDiff {
  int64_t unequal = 0;
  int max_ulps = 0;
};
UlpDiff ulp_diff(const std::vector<float>& got, const std::vector<float>& want) {
  UlpDiff d;
  const std::vector<uint16_t> a = bf16_bits(got), b = bf16_bits(want);
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    ++d.unequal;
    const int ulps = (a[i] ^ b[i]) & 0x8000 ? 1 << 16 : std::abs(int(a[i]) - int(b[i]));
    d.max_ulps = std::max(d.max_ulps, ulps);
  }
  return d;
}

// Tolerance (tolerances.h kBf16StateUlps): every new p, m, v equal to the CPU op's or one bf16 ulp apart.
// Each step starts both sides from the same bf16 state (the CPU's), so the kernel is compared, not two
// trajectories. Step 2's gradient is under the clip threshold, the others are clipped.
TEST(GpuDrafterAdamW, Bf16StateMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const Ctx cpu = cpu_ctx();
  const int64_t n = 1000005;  // 125000 vectors of 8 + a tail of 5
  ops::AdamWHyper hp;
  hp.lr = 1e-3f;
  hp.weight_decay = 0.1f;
  const uint64_t seed = 0x5eedull;
  auto p = test::random_bf16(n, 1, 0.02f), m = test::random_bf16(n, 2, 1e-3f), v = test::random_bf16(n, 3, 1e-3f);
  for (float& x : v) x = x * x;  // positive, the size of a squared gradient
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  for (int64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    auto grad = normal(n, 10 + step, step == 2 ? 1e-4f : 0.01f);
    const float clip = 1.0f;
    const std::vector<float> p_before = p;
    // the GPU: fused clip from the same state, and the unfused op on the CPU's clipped gradient
    Buffer fp = test::to_device(g, p, {n}), fm = test::to_device(g, m, {n}), fv = test::to_device(g, v, {n});
    Buffer up = test::to_device(g, p, {n}), um = test::to_device(g, m, {n}), uv = test::to_device(g, v, {n});
    Buffer fg = f32_device(g, grad);
    // the CPU: clip in place, then the op on F32 storage of the bf16 values
    Tensor gc = cpu_view(grad.data(), {n});
    const double norm_cpu = ops::clip_grad_global_norm(cpu, gc, clip);
    Buffer ug = f32_device(g, grad);  // clipped
    ops::adamw_step_bf16state(cpu, cpu_view(p.data(), {n}), gc, cpu_view(m.data(), {n}), cpu_view(v.data(), {n}), hp,
                              step, seed);
    cuda::clip_adamw_step_bf16state(g, fp, fg, fm, fv, hp, step, clip, seed);
    EXPECT_NEAR(cuda::last_grad_norm(g), norm_cpu, test::tol::kGradNorm * norm_cpu);
    ops::adamw_step_bf16state(g, up, ug, um, uv, hp, step, seed);
    for (const auto& [name, got, want] : {std::tuple{"p fused", &fp, &p}, std::tuple{"m fused", &fm, &m},
                                          std::tuple{"v fused", &fv, &v}, std::tuple{"p", &up, &p},
                                          std::tuple{"m", &um, &m}, std::tuple{"v", &uv, &v}}) {
      const UlpDiff d = ulp_diff(to_host(g, *got), *want);
      EXPECT_LE(d.max_ulps, test::tol::kBf16StateUlps) << name << ": " << d.unequal << " of " << n << " differ";
      std::printf("[bf16 state] step %lld %-8s %lld of %lld values differ from the CPU's (max %d ulp)\n",
                  static_cast<long long>(step), name, static_cast<long long>(d.unequal), static_cast<long long>(n),
                  d.max_ulps);
    }
    EXPECT_GT(ulp_diff(p, p_before).unequal, n / 2) << "the weights hardly moved: the comparison would be vacuous";
  }
}

}  // namespace
}  // namespace dflash
