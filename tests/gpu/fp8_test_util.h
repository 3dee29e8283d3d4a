// What the FP8 GPU tests share: random block-scaled FP8 operands on the host and the device.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <vector>

#include "dflash/backend.h"
#include "dflash/tensor.h"

namespace dflash::test {

// e4m3 codes [O, K] (random, NaN codes 0x7F / 0xFF avoided) and positive scales per (kb, o), kb-major
// [KB = K/128, O] (ops::fp8_linear_forward's w_scales layout; also an activation's act_scales with O = N),
// uniform in [lo, hi), on the host and on the device.
struct RandomFp8Linear {
  int64_t K, O, KB;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Buffer d_codes, d_scales;
  RandomFp8Linear(int64_t k, int64_t o, uint32_t seed, float lo = 1e-4f, float hi = 2e-3f)
      : K(k), O(o), KB(k / 128), codes(static_cast<size_t>(o * k)), scales(static_cast<size_t>(KB * o)),
        d_codes(Device::CUDA, DType::F8E4M3, {o, k}), d_scales(Device::CUDA, DType::F32, {KB, o}) {
    std::mt19937 rng(seed);
    for (auto& c : codes) {
      c = static_cast<uint8_t>(rng() & 0xFF);
      if ((c & 0x7F) == 0x7F) c = 0x7E;
    }
    std::uniform_real_distribution<float> u(lo, hi);
    for (auto& s : scales) s = u(rng);
    cudaMemcpy(d_codes.t().data, codes.data(), codes.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(d_scales.t().data, scales.data(), scales.size() * 4, cudaMemcpyHostToDevice);
  }
  Tensor host_codes() { return Tensor(codes.data(), DType::F8E4M3, Device::CPU, {O, K}); }
  Tensor host_scales() { return cpu_view(scales.data(), {KB, O}); }
};

// The current device's compute capability as 10 * major + minor (90: H100 / H200, 120: RTX PRO 6000).
inline int compute_capability() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major * 10 + minor;
}

}  // namespace dflash::test
