// Helpers for the GPU tests: skip without a GPU, bf16-rounded random inputs shared by both backends,
// device buffers poisoned with NaN so an unwritten output element fails the comparison.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "dflash/backend.h"
#include "dflash/tensor.h"
#include "tolerances.h"  // every tolerance of the GPU tests (tol::kOp, ...)

namespace dflash::test {

#define SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                      \
    if (::dflash::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";      \
  } while (0)

inline Ctx gpu() { return make_ctx(Device::CUDA, 0); }

// Normal(0, sigma) values rounded to bf16, so the float32 CPU twin sees exactly the GPU's inputs.
inline std::vector<float> random_bf16(size_t n, uint32_t seed, float sigma = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(d(rng)));
  return v;
}

// A BF16 device buffer holding `host`, or NaN everywhere when host is empty (an output to be written).
inline Buffer to_device(const Ctx& ctx, const std::vector<float>& host, std::initializer_list<int64_t> dims) {
  Buffer b(Device::CUDA, DType::BF16, dims);
  if (host.empty()) {
    cudaMemset(b.t().data, 0xff, b.t().nbytes());  // 0xffff is a bf16 NaN
  } else {
    copy_tensor(ctx, b, cpu_view(host.data(), dims));
  }
  return b;
}
inline Buffer to_device_i32(const Ctx& ctx, const std::vector<int32_t>& host) {
  Buffer b(Device::CUDA, DType::I32, {static_cast<int64_t>(host.size())});
  copy_tensor(ctx, b, cpu_view(host.data(), {static_cast<int64_t>(host.size())}));
  return b;
}
inline std::vector<float> to_host(const Ctx& ctx, const Tensor& t) {
  std::vector<float> h(t.numel());
  copy_tensor(ctx, Tensor(h.data(), DType::F32, Device::CPU, {static_cast<int64_t>(h.size())}), t);
  return h;
}

// ||a - b|| / ||b||; NaN anywhere in a gives +inf.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

// A GPU op's time at a real shape, as the timing tests report it: CUDA events around each call after 3
// warm-up calls, 20 timed calls, sorted; median, min and max in ms.
struct Timing {
  double median, min, max;
};
template <class Fn>
Timing time_calls(const Ctx& g, Fn fn) {
  for (int i = 0; i < 3; ++i) fn();
  cudaStream_t st = static_cast<cudaStream_t>(g.stream);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(e0, st);
    fn();
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    float m = 0;
    cudaEventElapsedTime(&m, e0, e1);
    ms.push_back(m);
  }
  synchronize(g);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

}  // namespace dflash::test
