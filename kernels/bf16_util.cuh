// Small device helpers shared by the elementwise kernels: 16-byte bf16 vectors, warp reductions, a sigmoid
// without a divide.
#pragma once
#include <cuda_bf16.h>
#include <cstdint>

namespace dflash::cuda {

// Eight bf16 values moved as one 16-byte access.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

__device__ __forceinline__ void unpack8(const Bf16x8& v, float (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 p = __bfloat1622float2(v.h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}
__device__ __forceinline__ Bf16x8 pack8(const float (&f)[8]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

// The same 8 bf16 as a uint4 (what a 16-byte load or four 32-bit shuffles move): a bf16 is the top half of
// its float, so unpacking is one shift or mask per element (exact, as __bfloat1622float2).
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 pack8_u4(const float (&f)[8]) {
  uint32_t u[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    u[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return uint4{u[0], u[1], u[2], u[3]};
}

// 1 / (1 + e^-x) as one MUFU.EX2 and one MUFU.RCP (no IEEE divide; a few ulp, as __expf). e^-x = inf gives 0,
// where the CPU's float gives a denormal or 0; an e^-x small enough to flush vanishes in 1 + e^-x.
__device__ __forceinline__ float fast_sigmoid(float x) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(-1.4426950408889634f * x));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
  return r;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// The sum over each aligned group of `group` lanes (a power of two <= 32) that holds one row; every lane of
// the warp must call it.
__device__ __forceinline__ float group_sum(float v, int group) {
  for (int o = group / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__host__ __device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace dflash::cuda
