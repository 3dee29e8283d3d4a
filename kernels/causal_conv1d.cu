// One thread per (8 channels, kTile consecutive tokens): a block's threads cover a contiguous run of
// kThreads * 8 channels, so a warp reads 512 contiguous bytes of a row, and the grid is flattened with the
// channel tile varying fastest, so the blocks resident together stream whole rows of the [T, C] tensor
// instead of 512-byte pieces at a C-element stride. The thread holds its weights and a sliding window of the
// K - 1 previous inputs in registers: every input row is loaded once per tile (plus K - 1 rows of history
// that the previous token tile just pulled into L2), not K times. It loads the whole tile before computing
// so kTile loads are in flight per thread. The taps are summed in fp32 in the CPU twin's order (j ascending).
#include "causal_conv1d.cuh"

#include <climits>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

constexpr int kMaxK = 8;
constexpr int kThreads = 128;  // channel groups per block (8 channels each on the vector path)
constexpr int kTile = 16;      // consecutive tokens per thread

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

// Index s of the sequence holding token t: the largest s with cu[s] <= t. Empty sequences repeat a
// boundary; every equal entry gives the same start. Every thread of a block has the same t, so the loads
// broadcast.
__device__ __forceinline__ int seq_index(const int32_t* __restrict__ cu, int nseq, int t) {
  int lo = 0, hi = nseq;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (__ldg(cu + mid) <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// kV channels per thread: 8 (C % 8 == 0, 16-byte aligned: one Bf16x8 per row) or 1 (any C and alignment).
template <int kV>
struct Lanes;
template <>
struct Lanes<8> {
  using Vec = Bf16x8;
  static __device__ __forceinline__ void unpack(const Vec& v, float (&f)[8]) { unpack8(v, f); }
  static __device__ __forceinline__ Vec pack(const float (&f)[8]) { return pack8(f); }
  static __device__ __forceinline__ Vec zero() { return Vec{}; }
};
template <>
struct Lanes<1> {
  using Vec = __nv_bfloat16;
  static __device__ __forceinline__ void unpack(const Vec& v, float (&f)[1]) { f[0] = __bfloat162float(v); }
  static __device__ __forceinline__ Vec pack(const float (&f)[1]) { return __float2bfloat16_rn(f[0]); }
  static __device__ __forceinline__ Vec zero() { return __float2bfloat16_rn(0.f); }
};

// in/out as [T, lanes] of Lanes<kV>::Vec; w as [lanes * kV, kK] bf16. Block b: channel tile b % ctiles, token
// tile b / ctiles. Min 3 blocks/SM caps registers at 170 (K=4 wanted 203): measured 410 vs 491 us on H200.
template <int kK, int kV>
__global__ void __launch_bounds__(kThreads, 3) conv_silu_kernel(typename Lanes<kV>::Vec* __restrict__ out,
                                                             const typename Lanes<kV>::Vec* __restrict__ in,
                                                             const __nv_bfloat16* __restrict__ w,
                                                             const int32_t* __restrict__ cu, int nseq, int T,
                                                             int lanes, unsigned ctiles) {
  using L = Lanes<kV>;
  const unsigned ctile = blockIdx.x % ctiles;
  const int t0 = static_cast<int>(blockIdx.x / ctiles) * kTile;
  const int lane = static_cast<int>(ctile) * kThreads + static_cast<int>(threadIdx.x);
  if (lane >= lanes) return;

  // wf[e][j] = w[lane * kV + e, j]; the thread's kV * kK weights are contiguous.
  float wf[kV][kK];
  const __nv_bfloat16* wr = w + static_cast<size_t>(lane) * kV * kK;
  if constexpr (kV == 8) {  // 8 * kK bf16 = kK aligned 16-byte vectors
#pragma unroll
    for (int i = 0; i < kK; ++i) {
      float f[8];
      unpack8(reinterpret_cast<const Bf16x8*>(wr)[i], f);
#pragma unroll
      for (int k = 0; k < 8; ++k) wf[(i * 8 + k) / kK][(i * 8 + k) % kK] = f[k];
    }
  } else {
#pragma unroll
    for (int j = 0; j < kK; ++j) wf[0][j] = __bfloat162float(wr[j]);
  }

  // The tile's rows (all loads issued before any use) and the K - 1 rows of history before t0.
  typename L::Vec rows[kTile];
#pragma unroll
  for (int i = 0; i < kTile; ++i)
    rows[i] = t0 + i < T ? in[static_cast<size_t>(t0 + i) * lanes + lane] : L::zero();

  // Sequence walk: s is the sequence of the current token, next its end (INT_MAX past the last boundary,
  // which also covers tokens a short cu_seqlens leaves after cu[nseq]).
  int s = seq_index(cu, nseq, t0);
  const int s0 = max(__ldg(cu + s), 0);
  int next = s < nseq ? __ldg(cu + s + 1) : INT_MAX;

  float hist[kK > 1 ? kK - 1 : 1][kV];  // hist[j] = in[t - (K-1) + j] for the current token t
#pragma unroll
  for (int j = 0; j < kK - 1; ++j) {
    const int u = t0 - (kK - 1) + j;
    if (u >= s0) {
      L::unpack(in[static_cast<size_t>(u) * lanes + lane], hist[j]);
    } else {
#pragma unroll
      for (int e = 0; e < kV; ++e) hist[j][e] = 0.f;  // zero history at the sequence start
    }
  }

#pragma unroll
  for (int i = 0; i < kTile; ++i) {
    const int t = t0 + i;
    if (t >= T) break;
    if (t >= next) {  // a new sequence (or several, when empty ones share the boundary) starts at t
      while (t >= next) {
        ++s;
        next = s < nseq ? __ldg(cu + s + 1) : INT_MAX;
      }
#pragma unroll
      for (int j = 0; j < kK - 1; ++j)
#pragma unroll
        for (int e = 0; e < kV; ++e) hist[j][e] = 0.f;
    }
    float x[kV];
    L::unpack(rows[i], x);
    float acc[kV];
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      acc[e] = 0.f;
#pragma unroll
      for (int j = 0; j < kK - 1; ++j) acc[e] += wf[e][j] * hist[j][e];
      acc[e] += wf[e][kK - 1] * x[e];
    }
#pragma unroll
    for (int e = 0; e < kV; ++e) acc[e] = silu(acc[e]);
    out[static_cast<size_t>(t) * lanes + lane] = L::pack(acc);
    // Slide the window by one token.
#pragma unroll
    for (int j = 0; j + 1 < kK - 1; ++j)
#pragma unroll
      for (int e = 0; e < kV; ++e) hist[j][e] = hist[j + 1][e];
    if constexpr (kK > 1) {
#pragma unroll
      for (int e = 0; e < kV; ++e) hist[kK - 2][e] = x[e];
    }
  }
}

template <int kK>
void launch(const Ctx& ctx, __nv_bfloat16* out, const __nv_bfloat16* in, const __nv_bfloat16* w,
            const int32_t* cu, int nseq, int T, int64_t C, bool vec) {
  const int64_t lanes = vec ? C / 8 : C;
  const int64_t ctiles = (lanes + kThreads - 1) / kThreads;
  const int64_t ttiles = (T + kTile - 1) / kTile;
  DF_CHECK(ctiles * ttiles < (int64_t(1) << 31), Internal,
           "causal_conv1d_silu_forward: T=" << T << " x C=" << C << " too large for one grid");
  const dim3 grid(static_cast<unsigned>(ctiles * ttiles));
  if (vec)
    conv_silu_kernel<kK, 8><<<grid, kThreads, 0, stream_of(ctx)>>>(
        reinterpret_cast<Bf16x8*>(out), reinterpret_cast<const Bf16x8*>(in), w, cu, nseq, T,
        static_cast<int>(lanes), static_cast<unsigned>(ctiles));
  else
    conv_silu_kernel<kK, 1><<<grid, kThreads, 0, stream_of(ctx)>>>(out, in, w, cu, nseq, T, static_cast<int>(lanes),
                                                                     static_cast<unsigned>(ctiles));
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
  DF_CHECK(T < (int64_t(1) << 31) - kTile && C < (int64_t(1) << 31), Internal, op << ": shape " << in.shape_str());
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
