// The FP8 hidden-state wire on CUDA (docs/fp8.md "The FP8 wire"): one warp per token row. The arithmetic is
// the host's (include/dflash/fp8.h, one activation group per row): s = amax / 448 and x / s with IEEE
// division (__fdiv_rn), then the hardware's saturating round-to-nearest-even e4m3 conversion, as
// kernels/fp8_linear.cu's activation quantization, so codes and scales equal the CPU twin's bit for bit; the
// dequantization multiplies in fp32 and rounds once to bf16.
#include "fp8_rows.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "dflash/error.h"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;  // 8 rows per block

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__global__ void rows_quantize_kernel(__nv_fp8_storage_t* __restrict__ codes, float* __restrict__ scales,
                                     const __nv_bfloat16* __restrict__ in, int64_t N, int64_t H) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const __nv_bfloat16* x = in + row * H;
  float amax = 0.f;
  for (int64_t c = lane; c < H; c += 32) amax = fmaxf(amax, fabsf(__bfloat162float(x[c])));
  amax = warp_max(amax);
  const float s = __fdiv_rn(amax, 448.f);
  __nv_fp8_storage_t* q = codes + row * H;
  for (int64_t c = lane; c < H; c += 32)
    q[c] = s > 0.f ? __nv_cvt_float_to_fp8(__fdiv_rn(__bfloat162float(x[c]), s), __NV_SATFINITE, __NV_E4M3) : 0;
  if (lane == 0) scales[row] = s;
}

__global__ void rows_dequantize_kernel(__nv_bfloat16* __restrict__ out, const __nv_fp8_storage_t* __restrict__ codes,
                                       const float* __restrict__ scales, int64_t N, int64_t H) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float s = scales[row];
  const __nv_fp8_storage_t* q = codes + row * H;
  __nv_bfloat16* o = out + row * H;
  for (int64_t c = lane; c < H; c += 32) {
    const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(q[c], __NV_E4M3)));  // exact
    o[c] = __float2bfloat16_rn(__fmul_rn(v, s));
  }
}

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>((rows * 32 + kThreads - 1) / kThreads); }

}  // namespace

void fp8_rows_quantize(const Ctx& ctx, const Tensor& codes, const Tensor& scales, const Tensor& in) {
  DF_CHECK(in.dtype == DType::BF16, Internal, "fp8_rows_quantize: in must be BF16, got " << dtype_name(in.dtype));
  const int64_t N = in.size(0), H = in.size(1);
  if (N == 0) return;
  rows_quantize_kernel<<<blocks_for(N), kThreads, 0, stream_of(ctx)>>>(
      static_cast<__nv_fp8_storage_t*>(codes.data), static_cast<float*>(scales.data),
      static_cast<const __nv_bfloat16*>(in.data), N, H);
  DF_CUDA_LAUNCH();
}

void fp8_rows_dequantize(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales) {
  DF_CHECK(out.dtype == DType::BF16, Internal, "fp8_rows_dequantize: out must be BF16, got " << dtype_name(out.dtype));
  const int64_t N = out.size(0), H = out.size(1);
  if (N == 0) return;
  rows_dequantize_kernel<<<blocks_for(N), kThreads, 0, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(out.data), static_cast<const __nv_fp8_storage_t*>(codes.data),
      static_cast<const float*>(scales.data), N, H);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
