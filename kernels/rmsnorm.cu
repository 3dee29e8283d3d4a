// One block per row; each thread holds its (at most kMaxChunks) 16-byte chunks of the row in registers,
// so the row is read once and written once: the block sums squares in fp32, then scales what it holds.
#include "rmsnorm.cuh"

#include <algorithm>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

constexpr int kMaxChunks = 4;       // per thread: rows up to 1024 * 4 * 8 = 32768 wide
constexpr int kMaxThreads = 1024;

__device__ __forceinline__ float block_sum(float v, float* scratch /* [32] */) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.f;
  return warp_sum(v);
}

// C % 8 == 0, rows 16-byte aligned.
__global__ void rmsnorm_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ rstd,
                               const __nv_bfloat16* __restrict__ in, const __nv_bfloat16* __restrict__ w, int C,
                               float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const Bf16x8* r = reinterpret_cast<const Bf16x8*>(in + row * C);
  const int chunks = C / 8;
  Bf16x8 held[kMaxChunks];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < chunks) {
      held[i] = r[c];
      float v[8];
      unpack8(held[i], v);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
    }
  }
  ss = block_sum(ss, scratch);
  const float rs = rsqrtf(ss / C + eps);
  if (rstd && threadIdx.x == 0) rstd[row] = rs;
  const Bf16x8* wr = reinterpret_cast<const Bf16x8*>(w);
  Bf16x8* o = reinterpret_cast<Bf16x8*>(out + row * C);
#pragma unroll
  for (int i = 0; i < kMaxChunks; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < chunks) {
      float v[8], g[8];
      unpack8(held[i], v);
      unpack8(wr[c], g);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = v[e] * rs * g[e];
      o[c] = pack8(v);
    }
  }
}

}  // namespace

void rmsnorm_forward(const Ctx& ctx, const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& w,
                     float eps) {
  constexpr const char* op = "rmsnorm_forward";
  backend_of(ctx);
  int C = static_cast<int>(w.numel());
  int64_t rows = static_cast<int64_t>(in.numel() / (C ? C : 1));
  DF_CHECK(out.dtype == DType::BF16 && in.dtype == DType::BF16 && w.dtype == DType::BF16, Internal,
           op << ": tensors must be BF16 on the CUDA backend");
  DF_CHECK(C > 0 && C % 8 == 0 && C <= kMaxThreads * kMaxChunks * 8 && in.size(-1) == C && out.numel() == in.numel(),
           Internal, op << ": shapes out " << out.shape_str() << " in " << in.shape_str() << " w " << w.shape_str()
                        << " (C must be a multiple of 8, at most 32768)");
  DF_CHECK(rstd.empty() || (rstd.dtype == DType::F32 && static_cast<int64_t>(rstd.numel()) == rows), Internal,
           op << ": rstd must be F32 [" << rows << "], got " << rstd.shape_str());
  DF_CHECK(aligned16(out.data) && aligned16(in.data) && aligned16(w.data), Internal,
           op << ": tensors must be 16-byte aligned");
  if (rows == 0) return;
  DF_CHECK(rows < (int64_t(1) << 31), Internal, op << ": too many rows (" << rows << ")");
  // The fewest threads (whole warps) that cover the row with kMaxChunks chunks each, at least 4 warps
  // per row where the row is that wide: 4096 -> 128 threads x 4 chunks.
  const int chunks = C / 8;
  int threads = (chunks + kMaxChunks - 1) / kMaxChunks;
  threads = std::max(32, std::min(kMaxThreads, (threads + 31) / 32 * 32));
  rmsnorm_kernel<<<static_cast<unsigned>(rows), threads, 0, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(out.data), rstd.empty() ? nullptr : static_cast<float*>(rstd.data),
      static_cast<const __nv_bfloat16*>(in.data), static_cast<const __nv_bfloat16*>(w.data), C, eps);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
