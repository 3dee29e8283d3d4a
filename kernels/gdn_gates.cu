// Elementwise over [T, nv], grid-stride. The tensors are tiny (nv ~ 32..64 per token), so no vector loads;
// full-precision expf/log1pf keep the fp32 gates within a few ulp of the CPU twin.
#include "gdn_gates.cuh"

#include <algorithm>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class TIn, class TParam>
__global__ void gdn_gates_kernel(float* __restrict__ g, float* __restrict__ beta, const TIn* __restrict__ a,
                                 const TIn* __restrict__ b, const TParam* __restrict__ A_log,
                                 const TParam* __restrict__ dt_bias, size_t n, int nv) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int h = static_cast<int>(i % nv);
    const float x = to_f32(a[i]) + to_f32(dt_bias[h]);
    const float softplus = x > 20.f ? x : log1pf(expf(x));  // torch: beta 1, threshold 20
    g[i] = -expf(to_f32(A_log[h])) * softplus;
    beta[i] = 1.f / (1.f + expf(-to_f32(b[i])));
  }
}

template <class TIn, class TParam>
void launch(const Ctx& ctx, const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& b,
            const Tensor& A_log, const Tensor& dt_bias, size_t n, int nv) {
  const unsigned blocks = grid_stride_blocks(ctx, static_cast<int64_t>(n), 256, 8);
  gdn_gates_kernel<TIn, TParam><<<blocks, 256, 0, stream_of(ctx)>>>(
      static_cast<float*>(g.data), static_cast<float*>(beta.data), static_cast<const TIn*>(a.data),
      static_cast<const TIn*>(b.data), static_cast<const TParam*>(A_log.data), static_cast<const TParam*>(dt_bias.data),
      n, nv);
  DF_CUDA_LAUNCH();
}

bool bf16_or_f32(DType t) { return t == DType::BF16 || t == DType::F32; }

}  // namespace

void gdn_gates_forward(const Ctx& ctx, const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& b,
                       const Tensor& A_log, const Tensor& dt_bias) {
  constexpr const char* op = "gdn_gates_forward";
  backend_of(ctx);
  DF_CHECK(g.dtype == DType::F32 && beta.dtype == DType::F32, Internal,
           op << ": g and beta must be F32 on the CUDA backend, got " << dtype_name(g.dtype) << "/"
              << dtype_name(beta.dtype));
  DF_CHECK(bf16_or_f32(a.dtype) && b.dtype == a.dtype, Internal,
           op << ": a and b must both be BF16 or both F32, got " << dtype_name(a.dtype) << "/" << dtype_name(b.dtype));
  DF_CHECK(bf16_or_f32(A_log.dtype) && dt_bias.dtype == A_log.dtype, Internal,
           op << ": A_log and dt_bias must both be F32 or both BF16, got " << dtype_name(A_log.dtype) << "/"
              << dtype_name(dt_bias.dtype));
  const int64_t nv = a.size(-1);
  const size_t n = a.numel();
  DF_CHECK(nv > 0 && g.numel() == n && beta.numel() == n && b.numel() == n && A_log.numel() == size_t(nv) &&
               dt_bias.numel() == size_t(nv),
           Internal, op << ": g " << g.shape_str() << ", beta " << beta.shape_str() << ", a " << a.shape_str()
                        << ", b " << b.shape_str() << ", A_log " << A_log.shape_str() << ", dt_bias "
                        << dt_bias.shape_str());
  if (n == 0) return;
  const int h = static_cast<int>(nv);
  const bool in_bf16 = a.dtype == DType::BF16, par_bf16 = A_log.dtype == DType::BF16;
  if (in_bf16 && !par_bf16) return launch<__nv_bfloat16, float>(ctx, g, beta, a, b, A_log, dt_bias, n, h);
  if (in_bf16 && par_bf16) return launch<__nv_bfloat16, __nv_bfloat16>(ctx, g, beta, a, b, A_log, dt_bias, n, h);
  if (!in_bf16 && !par_bf16) return launch<float, float>(ctx, g, beta, a, b, A_log, dt_bias, n, h);
  return launch<float, __nv_bfloat16>(ctx, g, beta, a, b, A_log, dt_bias, n, h);
}

}  // namespace dflash::cuda
