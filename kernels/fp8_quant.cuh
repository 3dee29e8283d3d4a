// Per-token e4m3 quantization of bf16 rows held in registers as 16-byte chunks (8 values): the arithmetic of
// the host's fp8::quantize_activation_groups with one group per row (include/dflash/fp8.h): s = amax / 448
// and x / s with IEEE division (__fdiv_rn), then the hardware's saturating round-to-nearest-even e4m3
// conversion, so codes and scales equal the CPU twin's bit for bit. The max is order-free, so any reduction
// tree gives the same scale: the row kernels (kernels/fp8_rows.cu) and the fused producers
// (kernels/rmsnorm.cu, kernels/swiglu.cu) write the same codes for the same bf16 row.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cstdint>

namespace dflash::cuda {

// max |v| over 8 bf16 values (a bf16 is the top half of its float: the magnitude is the bits without the sign).
__device__ __forceinline__ float amax8(const uint4& v, float m) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m = fmaxf(m, __uint_as_float((u[i] << 16) & 0x7fffffffu));
    m = fmaxf(m, __uint_as_float(u[i] & 0x7fff0000u));
  }
  return m;
}

// The max over each aligned group of `group` lanes (a power of two <= 32); every lane of the warp calls it.
__device__ __forceinline__ float group_max(float v, int group) {
  for (int o = group / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The max over a block's threads (whole warps); scratch: 32 floats of shared memory. Every thread calls it.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  v = group_max(v, 32);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.f;
  return group_max(v, 32);
}

// The row's scale from its amax: 0 for an all-zero row (its codes are 0).
__device__ __forceinline__ float fp8_row_scale(float amax) { return __fdiv_rn(amax, 448.f); }

// The 8 codes of 8 bf16 values under scale s, as one 8-byte store's worth (code of value e in byte e).
__device__ __forceinline__ uint2 fp8_codes8(const uint4& v, float s) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
  uint32_t out[2] = {0, 0};
  if (s > 0.f) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float lo = __uint_as_float(u[i] << 16), hi = __uint_as_float(u[i] & 0xffff0000u);
      const uint32_t qlo = __nv_cvt_float_to_fp8(__fdiv_rn(lo, s), __NV_SATFINITE, __NV_E4M3);
      const uint32_t qhi = __nv_cvt_float_to_fp8(__fdiv_rn(hi, s), __NV_SATFINITE, __NV_E4M3);
      out[i / 2] |= (qlo | (qhi << 8)) << (16 * (i % 2));
    }
  }
  return uint2{out[0], out[1]};
}

// One block per row, each thread holding kChunks of its 16-byte chunks (chunk c at threadIdx.x + i * blockDim.x):
// the block's amax gives the row's scale, each thread stores the codes of the chunks it holds (8 a store), thread
// 0 the scale. Every thread of the block calls it (block_max synchronises).
template <int kChunks>
__device__ __forceinline__ void store_row_codes(const uint4 (&held)[kChunks], float amax, float* scratch, uint2* codes,
                                                float* scale, int chunks) {
  const float s = fp8_row_scale(block_max(amax, scratch));
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < chunks) codes[c] = fp8_codes8(held[i], s);
  }
  if (threadIdx.x == 0) *scale = s;
}

// The threads of such a block: the fewest whole warps that cover `chunks` at kChunks each (4096 wide at 4 a
// thread: 128; 12288: 384).
template <int kChunks>
inline int row_block_threads(int64_t chunks) {
  const int64_t per_thread = (chunks + kChunks - 1) / kChunks;
  return static_cast<int>(per_thread <= 32 ? 32 : (per_thread + 31) / 32 * 32);
}

}  // namespace dflash::cuda
