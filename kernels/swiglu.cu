#include "swiglu.cuh"

#include <algorithm>

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

// The fused gate|up input: row n holds the gate at [n*2I, n*2I + I) and the up values right after it.
// Rows are spread over blockIdx.y (grid-stride) and a row's columns over x, so no thread divides an index
// by I. kVec: 16-byte chunks of 8 columns (I % 8 == 0, 16-byte aligned tensors); else one column each.
template <bool kVec>
__global__ void swiglu_fused_kernel(__nv_bfloat16* out, const __nv_bfloat16* gate_up, int64_t N, int64_t I) {
  const int64_t units = kVec ? I / 8 : I;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const __nv_bfloat16* gate = gate_up + n * 2 * I;
    const __nv_bfloat16* up = gate + I;
    __nv_bfloat16* o = out + n * I;
    for (int64_t c = first; c < units; c += stride) {
      if constexpr (kVec) {
        float g[8], u[8];
        unpack8(reinterpret_cast<const Bf16x8*>(gate)[c], g);
        unpack8(reinterpret_cast<const Bf16x8*>(up)[c], u);
#pragma unroll
        for (int i = 0; i < 8; ++i) g[i] = g[i] / (1.f + __expf(-g[i])) * u[i];
        reinterpret_cast<Bf16x8*>(o)[c] = pack8(g);
      } else {
        const float g = __bfloat162float(gate[c]);
        o[c] = __float2bfloat16_rn(g / (1.f + __expf(-g)) * __bfloat162float(up[c]));
      }
    }
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

void swiglu_fused_forward(const Ctx& ctx, const Tensor& out, const Tensor& gate_up) {
  backend_of(ctx);
  DF_CHECK(out.dtype == DType::BF16 && gate_up.dtype == DType::BF16, Internal,
           "swiglu_fused_forward: tensors must be BF16 on the CUDA backend");
  DF_CHECK(out.ndim == 2 && gate_up.ndim == 2 && gate_up.size(0) == out.size(0) &&
               gate_up.size(1) == 2 * out.size(1),
           Internal, "swiglu_fused_forward: out " << out.shape_str() << " must be [N, I], gate_up "
                                                  << gate_up.shape_str() << " [N, 2I]");
  const int64_t N = out.size(0), I = out.size(1);
  if (N == 0 || I == 0) return;
  constexpr int kThreads = 256;
  const bool vec = I % 8 == 0 && aligned16(out.data) && aligned16(gate_up.data);
  const int64_t units = vec ? I / 8 : I;
  // x covers one row's units (a few blocks on the 8B shape: 1536 chunks of 8); y takes rows, enough blocks
  // in all for 16 per SM (what the unfused swiglu launches), each looping over its share of rows.
  const unsigned bx = grid_stride_blocks(ctx, units, kThreads, 16);
  const int64_t by_cap = std::max<int64_t>(1, grid_stride_blocks(ctx, N * units, kThreads, 16) / bx);
  const unsigned by = static_cast<unsigned>(std::min<int64_t>({N, by_cap, 65535}));
  const dim3 grid(bx, by);
  auto* o = static_cast<__nv_bfloat16*>(out.data);
  const auto* gu = static_cast<const __nv_bfloat16*>(gate_up.data);
  if (vec) {
    swiglu_fused_kernel<true><<<grid, kThreads, 0, stream_of(ctx)>>>(o, gu, N, I);
  } else {
    swiglu_fused_kernel<false><<<grid, kThreads, 0, stream_of(ctx)>>>(o, gu, N, I);
  }
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
