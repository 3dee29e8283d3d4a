// Per-token FP8 rows on CUDA: the FP8 hidden-state wire (docs/fp8.md "The FP8 wire") and the per-token x
// per-channel FP8 GEMM's activations (kernels/fp8_linear.cu). The arithmetic is the host's
// (include/dflash/fp8.h, one activation group per row; kernels/fp8_quant.cuh), so codes and scales equal the
// CPU twin's bit for bit; the dequantization multiplies in fp32 and rounds once to bf16.
//
// Quantization, rows of H % 8 == 0 (16-byte aligned): one block per row, each thread holding up to
// kRowChunks 16-byte chunks of it in registers, all loaded before any use: the row is read from memory once,
// its amax reduced over the block, then each thread converts what it holds and stores 8 codes at a time.
// Other rows: one warp per row, two passes over it with 2-byte loads (the second from cache).
#include "fp8_rows.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "bf16_util.cuh"
#include "dflash/error.h"
#include "fp8_quant.cuh"

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

constexpr int kRowChunks = 4;  // per thread: rows up to 1024 * 4 * 8 = 32768 wide

__global__ void rows_quantize_vec_kernel(uint2* __restrict__ codes, float* __restrict__ scales,
                                         const uint4* __restrict__ in, int chunks) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const uint4* x = in + row * chunks;
  uint4 held[kRowChunks];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kRowChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    held[i] = c < chunks ? x[c] : uint4{0, 0, 0, 0};
  }
#pragma unroll
  for (int i = 0; i < kRowChunks; ++i) amax = amax8(held[i], amax);
  store_row_codes(held, amax, scratch, codes + row * chunks, scales + row, chunks);
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

void launch_rows_quantize(const Ctx& ctx, void* codes, float* scales, const void* in, int64_t N, int64_t H) {
  if (N == 0 || H == 0) return;
  cudaStream_t stream = stream_of(ctx);
  const int64_t chunks = H / 8;
  const bool vec = H % 8 == 0 && chunks <= 1024 * kRowChunks && aligned16(in) &&
                   (reinterpret_cast<uintptr_t>(codes) & 7) == 0 && N < (int64_t(1) << 31);
  if (vec) {
    const int threads = row_block_threads<kRowChunks>(chunks);
    rows_quantize_vec_kernel<<<static_cast<unsigned>(N), threads, 0, stream>>>(
        static_cast<uint2*>(codes), scales, static_cast<const uint4*>(in), static_cast<int>(chunks));
  } else {
    rows_quantize_kernel<<<blocks_for(N), kThreads, 0, stream>>>(static_cast<__nv_fp8_storage_t*>(codes), scales,
                                                                static_cast<const __nv_bfloat16*>(in), N, H);
  }
  DF_CUDA_LAUNCH();
}

void fp8_rows_quantize(const Ctx& ctx, const Tensor& codes, const Tensor& scales, const Tensor& in) {
  DF_CHECK(in.dtype == DType::BF16, Internal, "fp8_rows_quantize: in must be BF16, got " << dtype_name(in.dtype));
  launch_rows_quantize(ctx, codes.data, static_cast<float*>(scales.data), in.data, in.size(0), in.size(1));
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
