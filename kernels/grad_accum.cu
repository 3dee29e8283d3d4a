// Gradient accumulation on CUDA; see grad_accum.cuh. Memory-bound, one grid-stride pass, scalar accesses:
// a range of the flat gradient starts at any parameter's offset, so no vector alignment is assumed.
// The products are rounded before the add (__fmul_rn), as the CPU reference computes them.
#include "grad_accum.cuh"

#include "backend.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) accumulate_kernel(float* __restrict__ acc, const float* __restrict__ g,
                                                              int64_t n, float s, bool add) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = __fmul_rn(s, g[i]);
    acc[i] = add ? __fadd_rn(acc[i], x) : x;
  }
}

__global__ void __launch_bounds__(kThreads) fold_kernel(float* __restrict__ g, const float* __restrict__ acc, int64_t n,
                                                        float s) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    g[i] = s == 0.f ? acc[i] : __fadd_rn(__fmul_rn(s, g[i]), acc[i]);
}

void check_pair(const char* op, const Tensor& a, const Tensor& b) {
  DF_CHECK(a.dtype == DType::F32 && b.dtype == DType::F32 && a.numel() == b.numel() && a.device == Device::CUDA &&
               b.device == Device::CUDA,
           Internal, op << ": two F32 device tensors of the same length");
}

}  // namespace

void grad_accumulate(const Ctx& ctx, const Tensor& acc, const Tensor& g, float s, ops::AccumInto into) {
  check_pair("grad_accumulate (CUDA)", acc, g);
  const int64_t n = static_cast<int64_t>(acc.numel());
  if (n == 0) return;
  accumulate_kernel<<<grid_stride_blocks(ctx, n, kThreads, 8), kThreads, 0, stream_of(ctx)>>>(
      static_cast<float*>(acc.data), static_cast<const float*>(g.data), n, s, into == ops::AccumInto::Add);
  DF_CUDA_LAUNCH();
}

void grad_fold(const Ctx& ctx, const Tensor& g, const Tensor& acc, float s) {
  check_pair("grad_fold (CUDA)", g, acc);
  const int64_t n = static_cast<int64_t>(g.numel());
  if (n == 0) return;
  fold_kernel<<<grid_stride_blocks(ctx, n, kThreads, 8), kThreads, 0, stream_of(ctx)>>>(
      static_cast<float*>(g.data), static_cast<const float*>(acc.data), n, s);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
