#include "swiglu.cuh"

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

// Grid-stride over 16-byte chunks; the scalar tail handles numel % 8.
__global__ void swiglu_kernel(__nv_bfloat16* out, const __nv_bfloat16* gate, const __nv_bfloat16* up, size_t n) {
  size_t chunks = n / 8;
  size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t c = tid; c < chunks; c += stride) {
    float g[8], u[8];
    unpack8(reinterpret_cast<const Bf16x8*>(gate)[c], g);
    unpack8(reinterpret_cast<const Bf16x8*>(up)[c], u);
#pragma unroll
    for (int i = 0; i < 8; ++i) g[i] = g[i] / (1.f + __expf(-g[i])) * u[i];
    reinterpret_cast<Bf16x8*>(out)[c] = pack8(g);
  }
  for (size_t i = chunks * 8 + tid; i < n; i += stride) {
    float g = __bfloat162float(gate[i]);
    out[i] = __float2bfloat16_rn(g / (1.f + __expf(-g)) * __bfloat162float(up[i]));
  }
}

}  // namespace

void swiglu_forward(const Ctx& ctx, const Tensor& out, const Tensor& gate, const Tensor& up) {
  backend_of(ctx);
  DF_CHECK(out.dtype == DType::BF16 && gate.dtype == DType::BF16 && up.dtype == DType::BF16, Internal,
           "swiglu_forward: tensors must be BF16 on the CUDA backend");
  DF_CHECK(out.numel() == gate.numel() && up.numel() == gate.numel(), Internal,
           "swiglu_forward: out " << out.shape_str() << ", gate " << gate.shape_str() << ", up " << up.shape_str());
  DF_CHECK(aligned16(out.data) && aligned16(gate.data) && aligned16(up.data), Internal,
           "swiglu_forward: tensors must be 16-byte aligned");
  size_t n = out.numel();
  if (n == 0) return;
  size_t chunks = (n + 7) / 8;
  unsigned blocks = grid_stride_blocks(ctx, static_cast<int64_t>(chunks), 256, 16);
  swiglu_kernel<<<blocks, 256, 0, stream_of(ctx)>>>(static_cast<__nv_bfloat16*>(out.data),
                                                    static_cast<const __nv_bfloat16*>(gate.data),
                                                    static_cast<const __nv_bfloat16*>(up.data), n);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
