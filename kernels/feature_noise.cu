#include "feature_noise.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

__host__ __device__ __forceinline__ uint64_t mix64(uint64_t x) {  // splitmix64's finaliser: a bijective 64-bit hash
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One 64-bit hash per element, split into two 24-bit uniforms for Box-Muller (cos branch only, so every
// element is independent of its neighbours' indices). u1 in (0, 1] keeps log finite; the tails end at
// sqrt(2 ln 2^24) = 5.8 sigma, irrelevant for a regulariser.
__global__ void feature_noise_kernel(__nv_bfloat16* __restrict__ x, size_t n, uint64_t key, float sigma) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t r = mix64(key ^ mix64(static_cast<uint64_t>(i)));
    const float u1 = (static_cast<float>(r >> 40) + 1.f) * (1.f / 16777216.f);
    const float u2 = static_cast<float>((r >> 8) & 0xffffffull) * (1.f / 16777216.f);
    const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + sigma * z);
  }
}

}  // namespace

void add_feature_noise(const Ctx& ctx, const Tensor& x, float sigma, uint64_t seed, uint64_t counter) {
  backend_of(ctx);
  DF_CHECK(x.device == Device::CUDA && x.dtype == DType::BF16, Internal,
           "add_feature_noise: needs a BF16 device tensor, got " << dtype_name(x.dtype) << " " << x.shape_str());
  DF_CHECK(sigma >= 0.f && std::isfinite(sigma), Internal, "add_feature_noise: sigma " << sigma);
  const size_t n = x.numel();
  if (n == 0 || sigma == 0.f) return;
  // (seed, counter) -> one key; hashing each part keeps consecutive counters (and seeds) unrelated.
  const uint64_t key = mix64(mix64(seed) ^ mix64(counter ^ 0x632be59bd9b4e019ull));
  const unsigned blocks = grid_stride_blocks(ctx, static_cast<int64_t>(n), 256, 16);
  feature_noise_kernel<<<blocks, 256, 0, stream_of(ctx)>>>(static_cast<__nv_bfloat16*>(x.data), n, key, sigma);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
