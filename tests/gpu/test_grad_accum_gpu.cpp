// Gradient accumulation on CUDA (kernels/grad_accum.cu) against the CPU twin (src/ops/grad_accum.cpp) on
// random data: three micro-batches accumulated (overwrite, then add), then the last folded in range by range
// over ranges that start at odd offsets (a bucket starts where a parameter does), and s = 0 (acc only).
#include <gtest/gtest.h>

#include <random>

#include "dflash/optim.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::gpu;
using test::rel_err;
using test::to_host;

std::vector<float> normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 0.01f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Buffer f32_device(const Ctx& g, const std::vector<float>& h) {
  Buffer b(Device::CUDA, DType::F32, {static_cast<int64_t>(h.size())});
  copy_tensor(g, b, cpu_view(h.data(), {static_cast<int64_t>(h.size())}));
  return b;
}

TEST(GpuGradAccum, AccumulateAndFoldMatchCpu) {
  SKIP_WITHOUT_GPU();
  const Ctx g = gpu(), cpu = cpu_ctx();
  const int64_t n = 100003;
  std::vector<float> acc(n, 7.f);  // overwritten by the first micro-batch
  Buffer dacc = f32_device(g, acc);
  const float s[3] = {113.f, 0.f, 87.5f};  // the middle micro-batch has no loss rows
  for (int m = 0; m < 3; ++m) {
    std::vector<float> grad = normal(n, 10 + m);
    Buffer dg = f32_device(g, grad);
    const ops::AccumInto into = m == 0 ? ops::AccumInto::Overwrite : ops::AccumInto::Add;
    ops::grad_accumulate(cpu, cpu_view(acc.data(), {n}), cpu_view(grad.data(), {n}), s[m], into);
    ops::grad_accumulate(g, dacc, dg, s[m], into);
    EXPECT_LT(rel_err(to_host(g, dacc), acc), test::tol::kF32Axpy) << "micro-batch " << m;
  }
  std::vector<float> last = normal(n, 20);
  Buffer dlast = f32_device(g, last);
  const Tensor hl = cpu_view(last.data(), {n}), ha = cpu_view(acc.data(), {n});
  const int64_t cuts[] = {n, 70001, 12345, 3, 0};  // descending, as the backward reports
  for (int i = 0; i + 1 < 5; ++i) {
    const int64_t b = cuts[i + 1], e = cuts[i];
    ops::grad_fold(cpu, hl.slice_rows(b, e), ha.slice_rows(b, e), 64.f);
    ops::grad_fold(g, dlast.t().slice_rows(b, e), dacc.t().slice_rows(b, e), 64.f);
  }
  EXPECT_LT(rel_err(to_host(g, dlast), last), test::tol::kF32Axpy) << "fold";
  // s = 0: the accumulator alone, even over a NaN gradient
  std::vector<float> nan(n, NAN);
  Buffer dnan = f32_device(g, nan);
  ops::grad_fold(g, dnan, dacc, 0.f);
  EXPECT_LT(rel_err(to_host(g, dnan), acc), test::tol::kF32Axpy) << "fold with s = 0";
}

}  // namespace
}  // namespace dflash
