#include "swiglu.cuh"

#include <algorithm>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"
#include "fp8_quant.cuh"
#include "fp8_rows.cuh"

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

// silu(g) * u with one MUFU.EX2 and one MUFU.RCP (bf16_util's fast_sigmoid) instead of an IEEE divide.
__device__ __forceinline__ uint4 swiglu8(const uint4& gate, const uint4& up) {
  float g[8], u[8];
  unpack8(gate, g);
  unpack8(up, u);
#pragma unroll
  for (int i = 0; i < 8; ++i) g[i] = g[i] * fast_sigmoid(g[i]) * u[i];
  return pack8_u4(g);
}

// The fused gate|up input: row n holds the gate at [n*2I, n*2I + I) and the up values right after it.
// Rows are spread over blockIdx.y (grid-stride) and a row's columns over x, so no thread divides an index
// by I. Vector path (I % 8 == 0, 16-byte aligned tensors): 16-byte chunks of 8 columns, two rows per visit
// with all four loads issued before any math, so each thread keeps 64 bytes in flight (one row a visit and
// an IEEE divide streamed at ~3.7 TB/s on the H200; the norm kernels reach ~4.2 with loads first).
__global__ void swiglu_fused_vec_kernel(uint4* __restrict__ out, const uint4* __restrict__ gate_up, int64_t N,
                                        int64_t units) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t row_step = gridDim.y;
  for (int64_t n = blockIdx.y; n < N; n += 2 * row_step) {
    const int64_t n2 = n + row_step;
    const bool two = n2 < N;
    const uint4* gu0 = gate_up + n * 2 * units;
    const uint4* gu1 = gate_up + (two ? n2 : n) * 2 * units;
    for (int64_t c = first; c < units; c += stride) {
      const uint4 g0 = __ldg(gu0 + c), u0 = __ldg(gu0 + units + c);
      uint4 g1{0, 0, 0, 0}, u1{0, 0, 0, 0};
      if (two) {
        g1 = __ldg(gu1 + c);
        u1 = __ldg(gu1 + units + c);
      }
      out[n * units + c] = swiglu8(g0, u0);
      if (two) out[n2 * units + c] = swiglu8(g1, u1);
    }
  }
}

// Scalar path (I odd or misaligned views): one column a thread.
__global__ void swiglu_fused_scalar_kernel(__nv_bfloat16* out, const __nv_bfloat16* gate_up, int64_t N, int64_t I) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const __nv_bfloat16* gate = gate_up + n * 2 * I;
    const __nv_bfloat16* up = gate + I;
    for (int64_t c = first; c < I; c += stride) {
      const float g = __bfloat162float(gate[c]);
      out[n * I + c] = __float2bfloat16_rn(g * fast_sigmoid(g) * __bfloat162float(up[c]));
    }
  }
}

// swiglu_fp8_forward: one block per row, each thread holding up to kFp8Chunks of the row's 16-byte output
// chunks in registers (computed by swiglu8, as the vector kernel above: the same bf16 values), all four of
// a thread's gate and up loads issued before any math; the block's amax, then each thread converts what it
// holds (kernels/fp8_quant.cuh) and stores 8 codes at a time. out (may be null) gets the bf16 row as well.
constexpr int kFp8Chunks = 4;  // per thread: I up to 1024 * 4 * 8 = 32768

__global__ void swiglu_fp8_kernel(uint4* __restrict__ out, uint2* __restrict__ codes, float* __restrict__ scales,
                                  const uint4* __restrict__ gate_up, int units) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const uint4* gu = gate_up + row * 2 * units;
  uint4 g[kFp8Chunks], u[kFp8Chunks];
#pragma unroll
  for (int i = 0; i < kFp8Chunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    g[i] = c < units ? __ldg(gu + c) : uint4{0, 0, 0, 0};
    u[i] = c < units ? __ldg(gu + units + c) : uint4{0, 0, 0, 0};
  }
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kFp8Chunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    g[i] = swiglu8(g[i], u[i]);  // a chunk past the row's end: silu(0) * 0 = 0
    amax = amax8(g[i], amax);
    if (out && c < units) out[row * units + c] = g[i];
  }
  store_row_codes(g, amax, scratch, codes + row * units, scales + row, units);
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
    swiglu_fused_vec_kernel<<<grid, kThreads, 0, stream_of(ctx)>>>(reinterpret_cast<uint4*>(o),
                                                                  reinterpret_cast<const uint4*>(gu), N, units);
  } else {
    swiglu_fused_scalar_kernel<<<grid, kThreads, 0, stream_of(ctx)>>>(o, gu, N, I);
  }
  DF_CUDA_LAUNCH();
}

void swiglu_fp8_forward(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales,
                        const Tensor& gate_up) {
  constexpr const char* op = "swiglu_fp8_forward";
  backend_of(ctx);
  DF_CHECK(gate_up.dtype == DType::BF16 && (out.empty() || out.dtype == DType::BF16), Internal,
           op << ": gate_up and out must be BF16 on the CUDA backend");
  const int64_t N = codes.size(0), I = codes.size(1), units = I / 8;
  DF_CHECK(I % 8 == 0 && aligned16(gate_up.data) && (out.empty() || aligned16(out.data)) &&
               (reinterpret_cast<uintptr_t>(codes.data) & 7) == 0 && N < (int64_t(1) << 31),
           Internal,
           op << ": needs I % 8 == 0, gate_up and out 16-byte aligned, codes 8-byte aligned (I " << I << ")");
  if (N == 0 || I == 0) return;
  if (units > 1024 * kFp8Chunks) {  // wider than one block holds: the activation, then the row quantizer
    DF_CHECK(!out.empty(), Internal, op << ": I > 32768 needs out (the activation, then the row quantizer)");
    swiglu_fused_forward(ctx, out, gate_up);
    return launch_rows_quantize(ctx, codes.data, static_cast<float*>(scales.data), out.data, N, I);
  }
  const int threads = row_block_threads<kFp8Chunks>(units);  // I = 12288: 384
  swiglu_fp8_kernel<<<static_cast<unsigned>(N), threads, 0, stream_of(ctx)>>>(
      out.empty() ? nullptr : static_cast<uint4*>(out.data), static_cast<uint2*>(codes.data),
      static_cast<float*>(scales.data), static_cast<const uint4*>(gate_up.data), static_cast<int>(units));
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
