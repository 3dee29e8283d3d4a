// One thread per (token, 8 channels): a warp reads 32 x 16 contiguous bytes of each input row it needs, so
// every access is coalesced over channels. A block is 8 tokens x 256 channels; the K - 1 rows of history a
// block shares with its neighbours come from L1/L2, so DRAM sees each input row about once. The taps are
// summed in fp32 in the CPU twin's order (j ascending).
#include "causal_conv1d.cuh"

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

constexpr int kMaxK = 8;
constexpr int kLanes = 32;      // threadIdx.x: channel groups (8 channels each on the vector path)
constexpr int kTokens = 8;      // threadIdx.y: tokens

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

// Start of the sequence holding token t: cu[s] for the largest s with cu[s] <= t. Empty sequences repeat a
// boundary; every equal entry gives the same start. Every lane of a warp has the same t, so the loads
// broadcast. Clamped at 0 so a malformed cu_seqlens cannot send a tap before the tensor.
__device__ __forceinline__ int seq_start(const int32_t* __restrict__ cu, int nseq, int t) {
  int lo = 0, hi = nseq;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return max(cu[lo], 0);
}

// C % 8 == 0, every pointer 16-byte aligned. The thread's 8 rows of w are 8 * kK contiguous bf16, read as
// kK 16-byte vectors: wf[e * kK + j] = w[c0 + e, j].
template <int kK>
__global__ void conv_silu_vec8_kernel(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ in,
                                      const __nv_bfloat16* __restrict__ w, const int32_t* __restrict__ cu,
                                      int nseq, int T, int chunks) {
  const int t = blockIdx.x * kTokens + threadIdx.y;
  const int chunk = blockIdx.y * kLanes + threadIdx.x;
  if (t >= T || chunk >= chunks) return;
  const int s0 = seq_start(cu, nseq, t);
  float wf[8 * kK];
  const Bf16x8* wv = reinterpret_cast<const Bf16x8*>(w) + static_cast<size_t>(chunk) * kK;
#pragma unroll
  for (int i = 0; i < kK; ++i) {
    float f[8];
    unpack8(wv[i], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) wf[i * 8 + e] = f[e];
  }
  const Bf16x8* x = reinterpret_cast<const Bf16x8*>(in) + chunk;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    const int u = t - (kK - 1) + j;
    if (u < s0) continue;  // zero history at the sequence start
    float f[8];
    unpack8(x[static_cast<size_t>(u) * chunks], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += wf[e * kK + j] * f[e];
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = silu(acc[e]);
  reinterpret_cast<Bf16x8*>(out)[static_cast<size_t>(t) * chunks + chunk] = pack8(acc);
}

// Any C and alignment: one channel per thread.
template <int kK>
__global__ void conv_silu_scalar_kernel(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ in,
                                        const __nv_bfloat16* __restrict__ w, const int32_t* __restrict__ cu,
                                        int nseq, int T, int C) {
  const int t = blockIdx.x * kTokens + threadIdx.y;
  const int c = blockIdx.y * kLanes + threadIdx.x;
  if (t >= T || c >= C) return;
  const int s0 = seq_start(cu, nseq, t);
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    const int u = t - (kK - 1) + j;
    if (u < s0) continue;
    acc += __bfloat162float(w[static_cast<size_t>(c) * kK + j]) * __bfloat162float(in[static_cast<size_t>(u) * C + c]);
  }
  out[static_cast<size_t>(t) * C + c] = __float2bfloat16_rn(silu(acc));
}

template <int kK>
void launch(const Ctx& ctx, __nv_bfloat16* out, const __nv_bfloat16* in, const __nv_bfloat16* w,
            const int32_t* cu, int nseq, int T, int64_t C, bool vec) {
  const dim3 block(kLanes, kTokens);
  const unsigned token_tiles = static_cast<unsigned>((T + kTokens - 1) / kTokens);
  const int64_t lanes = vec ? C / 8 : C;
  const int64_t channel_tiles = (lanes + kLanes - 1) / kLanes;
  DF_CHECK(channel_tiles < 65536, Internal, "causal_conv1d_silu_forward: C=" << C << " too wide");
  const dim3 grid(token_tiles, static_cast<unsigned>(channel_tiles));
  if (vec)
    conv_silu_vec8_kernel<kK><<<grid, block, 0, stream_of(ctx)>>>(out, in, w, cu, nseq, T, static_cast<int>(lanes));
  else
    conv_silu_scalar_kernel<kK><<<grid, block, 0, stream_of(ctx)>>>(out, in, w, cu, nseq, T, static_cast<int>(C));
  DF_CUDA_LAUNCH();
}

}  // namespace

void causal_conv1d_silu_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& w,
                                const Tensor& cu_seqlens) {
  constexpr const char* op = "causal_conv1d_silu_forward";
  backend_of(ctx);
  DF_CHECK(out.dtype == DType::BF16 && in.dtype == DType::BF16 && w.dtype == DType::BF16, Internal,
           op << ": out/in/w must be BF16 on the CUDA backend");
  DF_CHECK(in.ndim == 2 && w.ndim == 2 && out.numel() == in.numel() && w.size(0) == in.size(1), Internal,
           op << ": out " << out.shape_str() << ", in " << in.shape_str() << ", w " << w.shape_str());
  DF_CHECK(cu_seqlens.dtype == DType::I32 && cu_seqlens.device == Device::CUDA && cu_seqlens.ndim == 1 &&
               cu_seqlens.numel() >= 1,
           Internal, op << ": cu_seqlens must be a non-empty I32 vector in device memory, got " << cu_seqlens.shape_str());
  DF_CHECK(out.data != in.data, Internal, op << ": out must not alias in");
  const int64_t T = in.size(0), C = in.size(1), K = w.size(1);
  DF_CHECK(K >= 1 && K <= kMaxK, Internal, op << ": conv kernel size " << K << " outside 1.." << kMaxK);
  DF_CHECK(T < (int64_t(1) << 31) - kTokens && C < (int64_t(1) << 31), Internal, op << ": shape " << in.shape_str());
  const int nseq = static_cast<int>(cu_seqlens.numel()) - 1;
  if (T == 0 || C == 0) return;
  const bool vec = C % 8 == 0 && aligned16(out.data) && aligned16(in.data) && aligned16(w.data);
  auto* o = static_cast<__nv_bfloat16*>(out.data);
  const auto* x = static_cast<const __nv_bfloat16*>(in.data);
  const auto* wp = static_cast<const __nv_bfloat16*>(w.data);
  const auto* cu = static_cast<const int32_t*>(cu_seqlens.data);
  const int t = static_cast<int>(T);
  switch (K) {
    case 1: return launch<1>(ctx, o, x, wp, cu, nseq, t, C, vec);
    case 2: return launch<2>(ctx, o, x, wp, cu, nseq, t, C, vec);
    case 3: return launch<3>(ctx, o, x, wp, cu, nseq, t, C, vec);
    case 4: return launch<4>(ctx, o, x, wp, cu, nseq, t, C, vec);
    case 5: return launch<5>(ctx, o, x, wp, cu, nseq, t, C, vec);
    case 6: return launch<6>(ctx, o, x, wp, cu, nseq, t, C, vec);
    case 7: return launch<7>(ctx, o, x, wp, cu, nseq, t, C, vec);
    default: return launch<8>(ctx, o, x, wp, cu, nseq, t, C, vec);
  }
}

}  // namespace dflash::cuda
