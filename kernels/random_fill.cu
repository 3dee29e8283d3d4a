#include "random_fill.cuh"

#include <cuda_bf16.h>

#include "backend.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
__global__ void fill_random_kernel(T* out, size_t n, uint64_t seed, float mean, float half_width) {
  size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float u = static_cast<float>(splitmix64(seed ^ (i * 0x2545f4914f6cdd1dull)) >> 40) * (1.f / 16777216.f);
    float v = mean + (2.f * u - 1.f) * half_width;
    if constexpr (sizeof(T) == 2) out[i] = __float2bfloat16_rn(v); else out[i] = v;
  }
}

}  // namespace

void fill_random(const Ctx& ctx, const Tensor& t, uint64_t seed, float mean, float stddev) {
  backend_of(ctx);
  DF_CHECK(t.device == Device::CUDA && (t.dtype == DType::BF16 || t.dtype == DType::F32), Internal,
           "fill_random: needs a BF16 or F32 device tensor");
  size_t n = t.numel();
  if (n == 0) return;
  float half_width = stddev * 1.7320508f;  // uniform [-a, a] has std a / sqrt(3)
  unsigned blocks = grid_stride_blocks(ctx, static_cast<int64_t>(n), 256, 32);
  if (t.dtype == DType::BF16)
    fill_random_kernel<<<blocks, 256, 0, stream_of(ctx)>>>(static_cast<__nv_bfloat16*>(t.data), n, seed, mean,
                                                           half_width);
  else
    fill_random_kernel<<<blocks, 256, 0, stream_of(ctx)>>>(static_cast<float*>(t.data), n, seed, mean, half_width);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
