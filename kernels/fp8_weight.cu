// An FP8 linear's weight dequantized for an ordinary GEMM on CUDA (LinearMode::Fp8Dequant, docs/fp8.md):
// each linear call expands its e4m3 codes into the target's one bf16 scratch, on GPUs where cuBLASLt has no
// 128-block-scaled FP8 GEMM (kernels/fp8_linear.cu), so the weights stay 1 byte each in memory. The
// arithmetic is the host's (include/dflash/fp8.h): the code's exact value times its float32 scale, one IEEE
// multiply (__fmul_rn), rounded once to out's dtype (round to nearest even), so the values equal the CPU
// twin's -- and the loader's host dequantization -- bit for bit. Memory-bound: a thread expands 8
// consecutive codes of a row (one 8-byte load; 8 | 128, so they share one scale) where K % 8 == 0, else one.
#include "fp8_weight.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "dflash/error.h"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kGroup = 128;  // fp8::kBlock: input channels per scale
constexpr int kVec = 8;      // codes per thread on the vector path

__device__ __forceinline__ float e4m3_value(__nv_fp8_storage_t q) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));  // exact
}

__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }

// One code per thread (any K).
template <class Out>
__global__ void dequantize_kernel(Out* __restrict__ out, const __nv_fp8_storage_t* __restrict__ codes,
                                  const float* __restrict__ scales, int64_t O, int64_t K) {
  const int64_t n = O * K;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = i / K, k = i % K;
    store(out + i, __fmul_rn(e4m3_value(codes[i]), scales[(k / kGroup) * O + o]));
  }
}

// kVec consecutive codes of one row per thread (K % kVec == 0, so a vector never crosses a row or a group).
template <class Out>
__global__ void dequantize_vec_kernel(Out* __restrict__ out, const uint2* __restrict__ codes,
                                      const float* __restrict__ scales, int64_t O, int64_t K) {
  const int64_t vecs = O * K / kVec;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vecs;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = v * kVec, o = i / K, k = i % K;
    const float s = scales[(k / kGroup) * O + o];
    const uint2 packed = codes[v];
    const auto* q = reinterpret_cast<const __nv_fp8_storage_t*>(&packed);
    __align__(16) Out r[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) store(&r[j], __fmul_rn(e4m3_value(q[j]), s));
    if constexpr (sizeof(Out) == 2) {
      *reinterpret_cast<uint4*>(out + i) = *reinterpret_cast<const uint4*>(r);
    } else {
      reinterpret_cast<float4*>(out + i)[0] = reinterpret_cast<const float4*>(r)[0];
      reinterpret_cast<float4*>(out + i)[1] = reinterpret_cast<const float4*>(r)[1];
    }
  }
}

unsigned grid_for(int64_t items) {
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);  // grid-stride beyond
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class Out>
void launch(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales, int64_t O, int64_t K) {
  auto* o = static_cast<Out*>(out.data);
  const auto* s = static_cast<const float*>(scales.data);
  if (K % kVec == 0 && aligned(codes.data, sizeof(uint2)) && aligned(out.data, kVec * sizeof(Out)))
    dequantize_vec_kernel<Out><<<grid_for(O * K / kVec), kThreads, 0, stream_of(ctx)>>>(
        o, static_cast<const uint2*>(codes.data), s, O, K);
  else
    dequantize_kernel<Out><<<grid_for(O * K), kThreads, 0, stream_of(ctx)>>>(
        o, static_cast<const __nv_fp8_storage_t*>(codes.data), s, O, K);
  DF_CUDA_LAUNCH();
}

}  // namespace

void fp8_weight_dequantize(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales) {
  DF_CHECK(out.dtype == DType::BF16 || out.dtype == DType::F32, Internal,
           "fp8_weight_dequantize: out must be BF16 or F32, got " << dtype_name(out.dtype));
  const int64_t O = codes.size(0), K = codes.size(1);
  if (O * K == 0) return;
  if (out.dtype == DType::BF16)
    launch<__nv_bfloat16>(ctx, out, codes, scales, O, K);
  else
    launch<float>(ctx, out, codes, scales, O, K);
}

}  // namespace dflash::cuda
