// Grid-stride over 16-byte chunks when every pointer is 16-byte aligned (a scalar tail covers numel % 8),
// else all scalar. No __restrict__ on out and x: the attention output is gated in place.
#include "sigmoid_gate.cuh"

#include <algorithm>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

__device__ __forceinline__ float gate_of(float x, float g) { return x / (1.f + __expf(-g)); }

__global__ void sigmoid_gate_kernel(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* __restrict__ gate,
                                    size_t n, bool vec) {
  const size_t chunks = vec ? n / 8 : 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t c = tid; c < chunks; c += stride) {
    float v[8], g[8];
    unpack8(reinterpret_cast<const Bf16x8*>(x)[c], v);
    unpack8(reinterpret_cast<const Bf16x8*>(gate)[c], g);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = gate_of(v[i], g[i]);
    reinterpret_cast<Bf16x8*>(out)[c] = pack8(v);
  }
  for (size_t i = chunks * 8 + tid; i < n; i += stride)
    out[i] = __float2bfloat16_rn(gate_of(__bfloat162float(x[i]), __bfloat162float(gate[i])));
}

}  // namespace

void sigmoid_gate_forward(const Ctx& ctx, const Tensor& out, const Tensor& x, const Tensor& gate) {
  constexpr const char* op = "sigmoid_gate_forward";
  backend_of(ctx);
  DF_CHECK(out.dtype == DType::BF16 && x.dtype == DType::BF16 && gate.dtype == DType::BF16, Internal,
           op << ": tensors must be BF16 on the CUDA backend");
  DF_CHECK(out.numel() == x.numel() && gate.numel() == x.numel(), Internal,
           op << ": out " << out.shape_str() << ", x " << x.shape_str() << ", gate " << gate.shape_str());
  const size_t n = x.numel();
  if (n == 0) return;
  const bool vec = aligned16(out.data) && aligned16(x.data) && aligned16(gate.data);
  const size_t work = vec ? (n + 7) / 8 : n;
  const unsigned blocks = grid_stride_blocks(ctx, static_cast<int64_t>(work), 256, 16);
  sigmoid_gate_kernel<<<blocks, 256, 0, stream_of(ctx)>>>(static_cast<__nv_bfloat16*>(out.data),
                                                          static_cast<const __nv_bfloat16*>(x.data),
                                                          static_cast<const __nv_bfloat16*>(gate.data), n, vec);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
