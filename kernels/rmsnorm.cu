// RMSNorm over rows: a streaming op (read [N, C] once, write it once), so the design is about bytes in flight.
//
// Rows of at most 8192 (C % 8 == 0, 16-byte aligned): `group` lanes of one warp per row, the power of two that
// covers its C / 8 16-byte chunks (at most 32: a whole warp from C = 256 up). Each lane holds kPerLane chunks
// in registers (chunk c = sub + i * group), all loaded before any use; the group sums squares in fp32 with
// xor shuffles (no barrier, no shared memory), then each lane scales what it holds and stores it as one
// 16-byte access. When the row is exactly 32 * kPerLane chunks (C = 4096, 5120, 8192: kFull) nothing is
// predicated per chunk, so the addresses are immediate offsets and the compiler issues the weight loads of
// the second half ahead of the stores. 4 warps per block, <= 128 registers at kPerLane <= 24 (4 blocks, 16
// warps per SM: 160 KB in flight at C = 5120). Measured on the H200 at [32768, 5120] (GpuRmsNormTiming,
// median of 20): 0.168-0.170 ms (3.9-4.0 TB/s) against 0.199 ms (3.37 TB/s) for one block of 160 threads
// per row (the kernel below, kept for C > 8192). Variants tried in the same call, none faster: streaming
// hints (ld.global.nc.L1::no_allocate, st.global.cs) 0.170; two rows per warp (255 registers) 0.172; 168
// registers (12 warps/SM) 0.170; the per-chunk predicated form at C = 5120 0.181.
//
// Wider rows: one block per row; each thread holds its (at most kMaxChunks) 16-byte chunks of the row in
// registers, so the row is read once and written once: the block sums squares in fp32, then scales what it
// holds.
#include "rmsnorm.cuh"

#include <algorithm>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"
#include "fp8_quant.cuh"
#include "fp8_rows.cuh"

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


constexpr int kMaxWarpChunks = 32 * 32;  // warp path: C <= 8192
static_assert(kMaxWarpChunks * 8 == ops::kRmsNormFp8CodesOnlyWidth, "rmsnorm_fp8_forward's codes-only rows");
constexpr int kWarpThreads = 128;

// kFull: group = 32 and C / 8 = 32 * kPerLane. lg = log2(group) (ignored when kFull). kQuant: the row's
// per-token e4m3 codes and scale too (rmsnorm_fp8_forward; out may be null), from the bf16 values it rounds
// (kernels/fp8_quant.cuh), so they equal fp8_rows_quantize's of out bit for bit.
template <int kPerLane, bool kFull, bool kQuant, int kMinBlocks = (kPerLane > 24 ? 2 : 4)>
__global__ void __launch_bounds__(kWarpThreads, kMinBlocks)
    rmsnorm_warp_kernel(uint4* __restrict__ out, float* __restrict__ rstd, uint2* __restrict__ codes,
                        float* __restrict__ scales, const uint4* __restrict__ in, const uint4* __restrict__ w,
                        int64_t rows, int C, int lg, float eps) {
  if (kFull) lg = 5;
  const int group = 1 << lg, lane = threadIdx.x & 31, sub = lane & (group - 1);
  const int chunks = kFull ? 32 * kPerLane : C / 8;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kWarpThreads + threadIdx.x) >> 5;
  const int64_t row = warp * (32 >> lg) + (lane >> lg);
  const bool on = row < rows;  // rows past the end still join the shuffles, holding zeros
  const uint4* x = in + static_cast<size_t>(on ? row : 0) * chunks;
  uint4 held[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = sub + i * group;
    held[i] = on && (kFull || c < chunks) ? x[c] : uint4{0, 0, 0, 0};
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    float v[8];
    unpack8(held[i], v);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
  }
  ss = group_sum(ss, group);
  if (!kQuant && !on) return;  // kQuant: rows past the end join the max's shuffles too (their values are 0)
  const float rs = rsqrtf(ss / C + eps);
  if (on && rstd && sub == 0) rstd[row] = rs;
  uint4* o = out ? out + static_cast<size_t>(on ? row : 0) * chunks : nullptr;
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = sub + i * group;
    // predicated rather than branched, so the weight loads can be issued ahead of their use
    const uint4 wv = kFull || c < chunks ? __ldg(w + c) : uint4{0, 0, 0, 0};
    float v[8], g[8];
    unpack8(held[i], v);
    unpack8(wv, g);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = v[e] * rs * g[e];
    if (kQuant) {
      held[i] = pack8_u4(v);  // a chunk past the row's end: zeros (its weights are)
      amax = amax8(held[i], amax);
      if (o && on && (kFull || c < chunks)) o[c] = held[i];
    } else if (kFull || c < chunks) {
      o[c] = pack8_u4(v);
    }
  }
  if (!kQuant) return;
  const float s = fp8_row_scale(group_max(amax, group));
  if (!on) return;
  if (sub == 0) scales[row] = s;
  uint2* q = codes + static_cast<size_t>(row) * chunks;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = sub + i * group;
    if (kFull || c < chunks) q[c] = fp8_codes8(held[i], s);
  }
}

// kPerLane: the fewest of the instantiated counts that cover the row. kQuant: codes and scales too.
template <bool kQuant>
void launch_warp(cudaStream_t st, __nv_bfloat16* out, float* rstd, void* codes, float* scales,
                 const __nv_bfloat16* in, const __nv_bfloat16* w, int64_t rows, int C, float eps) {
  const int chunks = C / 8;
  int lg = 0;
  while ((1 << lg) < chunks && lg < 5) ++lg;
  const int per = (chunks + 31) / 32;
  const bool full = lg == 5 && chunks % 32 == 0;
  const int64_t rows_per_block = static_cast<int64_t>(kWarpThreads / 32) * (32 >> lg);
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  DF_CHECK(blocks < (int64_t(1) << 31), Internal, "rmsnorm_forward: too many rows (" << rows << ")");
  auto go = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(blocks), kWarpThreads, 0, st>>>(
        reinterpret_cast<uint4*>(out), rstd, static_cast<uint2*>(codes), scales, reinterpret_cast<const uint4*>(in),
        reinterpret_cast<const uint4*>(w), rows, C, lg, eps);
  };
#define DF_RMS_WARP(K)                                                              \
  if (per <= K) {                                                                   \
    if (full && chunks == 32 * K) return go(rmsnorm_warp_kernel<K, true, kQuant>);  \
    return go(rmsnorm_warp_kernel<K, false, kQuant>);                               \
  }
  DF_RMS_WARP(1)
  DF_RMS_WARP(2)
  DF_RMS_WARP(4)
  DF_RMS_WARP(8)
  DF_RMS_WARP(12)
  DF_RMS_WARP(16)
  DF_RMS_WARP(20)
  DF_RMS_WARP(24)
  DF_RMS_WARP(32)
#undef DF_RMS_WARP
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
  float* r = rstd.empty() ? nullptr : static_cast<float*>(rstd.data);
  if (C / 8 <= kMaxWarpChunks) {
    launch_warp<false>(stream_of(ctx), static_cast<__nv_bfloat16*>(out.data), r, nullptr, nullptr,
                       static_cast<const __nv_bfloat16*>(in.data), static_cast<const __nv_bfloat16*>(w.data), rows, C,
                       eps);
    DF_CUDA_LAUNCH();
    return;
  }
  // Wider rows: the fewest threads (whole warps) that cover the row with kMaxChunks chunks each, at least 4 warps
  // per row where the row is that wide: 4096 -> 128 threads x 4 chunks.
  const int chunks = C / 8;
  int threads = (chunks + kMaxChunks - 1) / kMaxChunks;
  threads = std::max(32, std::min(kMaxThreads, (threads + 31) / 32 * 32));
  rmsnorm_kernel<<<static_cast<unsigned>(rows), threads, 0, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(out.data), r, static_cast<const __nv_bfloat16*>(in.data),
      static_cast<const __nv_bfloat16*>(w.data), C, eps);
  DF_CUDA_LAUNCH();
}

// Rows the warp kernel takes (C <= 8192): one pass, the codes from the registers that hold the normed row.
// Wider rows: the norm, then the row quantizer over its output (out required there).
void rmsnorm_fp8_forward(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales,
                         const Tensor& in, const Tensor& w, float eps) {
  constexpr const char* op = "rmsnorm_fp8_forward";
  backend_of(ctx);
  const int C = static_cast<int>(in.size(1));
  const int64_t rows = in.size(0);
  DF_CHECK(in.dtype == DType::BF16 && w.dtype == DType::BF16 && (out.empty() || out.dtype == DType::BF16), Internal,
           op << ": in, w and out must be BF16 on the CUDA backend");
  DF_CHECK(C > 0 && C % 8 == 0 && C <= kMaxThreads * kMaxChunks * 8, Internal,
           op << ": C must be a multiple of 8, at most 32768, got " << C);
  DF_CHECK((out.empty() || aligned16(out.data)) && aligned16(in.data) && aligned16(w.data) &&
               (reinterpret_cast<uintptr_t>(codes.data) & 7) == 0,
           Internal, op << ": in, w and out must be 16-byte aligned, codes 8-byte aligned");
  if (rows == 0) return;
  if (C / 8 > kMaxWarpChunks) {
    DF_ASSERT(!out.empty());  // the op's contract: ops::kRmsNormFp8CodesOnlyWidth
    rmsnorm_forward(ctx, out, Tensor(), in, w, eps);
    return launch_rows_quantize(ctx, codes.data, static_cast<float*>(scales.data), out.data, rows, C);
  }
  launch_warp<true>(stream_of(ctx), out.empty() ? nullptr : static_cast<__nv_bfloat16*>(out.data), nullptr,
                    codes.data, static_cast<float*>(scales.data), static_cast<const __nv_bfloat16*>(in.data),
                    static_cast<const __nv_bfloat16*>(w.data), rows, C, eps);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
