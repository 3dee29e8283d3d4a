// Qwen3 QK-norm + neox RoPE per head, in fp32 (out may alias in).
//
// Vector path (hd % 8 == 0, rotary_dim % 16 == 0, 16-byte aligned: every Qwen3 and the Qwen3.5/3.6 heads of
// 256 with rotary 64): head_norm_rope_vec_kernel below, one warp per (token, run of heads), a head's 16-byte
// chunks one per lane, 4 heads' loads in flight per lane. Measured on the H200 in place at the 27B shapes
// (GpuHeadNormRopeTiming, median of 20): q [32768, 24, 256] 0.291-0.292 ms (2.75 TB/s) and k [32768, 4, 256]
// 0.057-0.059 ms, against 0.377 and 0.123 ms for the block-per-token kernel; 8 heads per warp measured 0.304
// and 0.087 ms, 2 heads 0.334 and 0.066 ms. Still short of the streaming rate (see bench/README.md).
//
// Other shapes: one block per token: the token's rotary angles (one per frequency, shared by all its heads)
// go to shared memory first, then each warp normalizes and rotates whole heads. For hd = rotary_dim = 128 a
// lane holds 4 consecutive values and its rotation partner (d +- 64) sits in lane ^ 16; other shapes stage
// the normalized head in shared memory.
#include "head_norm_rope.cuh"

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxHeadDim = 256;

__global__ void head_norm_rope_kernel(__nv_bfloat16* out, float* __restrict__ rstd, const __nv_bfloat16* in,
                                      const __nv_bfloat16* __restrict__ w, const int32_t* __restrict__ pos, int nh,
                                      int hd, int rotary_dim, float theta, float eps) {
  __shared__ float cos_s[kMaxHeadDim / 2], sin_s[kMaxHeadDim / 2];
  __shared__ float y[kWarps][kMaxHeadDim];
  const int64_t token = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = rotary_dim / 2;
  const float p = static_cast<float>(pos[token]);
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    // inv_freq_j = 1 / theta^(2j / rotary_dim) and the angle in fp32, as the HF reference computes them
    const float inv_freq = 1.f / powf(theta, static_cast<float>(2 * j) / rotary_dim);
    sincosf(p * inv_freq, &sin_s[j], &cos_s[j]);
  }
  __syncthreads();
  const bool fast = hd == 128 && rotary_dim == 128;
  for (int h = warp; h < nh; h += kWarps) {
    const int64_t head = token * nh + h;
    const __nv_bfloat16* x = in + head * hd;
    __nv_bfloat16* o = out + head * hd;
    if (fast) {
      const int d0 = lane * 4;
      const uint2 raw = *reinterpret_cast<const uint2*>(x + d0);
      const uint2 wraw = *reinterpret_cast<const uint2*>(w + d0);
      const __nv_bfloat162* xv = reinterpret_cast<const __nv_bfloat162*>(&raw);
      const __nv_bfloat162* wv = reinterpret_cast<const __nv_bfloat162*>(&wraw);
      float v[4], g[4];
      float2 t0 = __bfloat1622float2(xv[0]), t1 = __bfloat1622float2(xv[1]);
      v[0] = t0.x; v[1] = t0.y; v[2] = t1.x; v[3] = t1.y;
      t0 = __bfloat1622float2(wv[0]); t1 = __bfloat1622float2(wv[1]);
      g[0] = t0.x; g[1] = t0.y; g[2] = t1.x; g[3] = t1.y;
      float ss = v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
      ss = warp_sum(ss);
      const float rs = rsqrtf(ss / hd + eps);
      if (rstd && lane == 0) rstd[head] = rs;
      float r[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float yi = v[i] * rs * g[i];
        const float partner = __shfl_xor_sync(0xffffffffu, yi, 16);
        const int j = (d0 + i) & 63;
        r[i] = lane < 16 ? yi * cos_s[j] - partner * sin_s[j] : yi * cos_s[j] + partner * sin_s[j];
      }
      uint2 packed;
      __nv_bfloat162* ov = reinterpret_cast<__nv_bfloat162*>(&packed);
      ov[0] = __floats2bfloat162_rn(r[0], r[1]);
      ov[1] = __floats2bfloat162_rn(r[2], r[3]);
      *reinterpret_cast<uint2*>(o + d0) = packed;
    } else {
      float ss = 0.f;
      for (int d = lane; d < hd; d += 32) {
        const float v = __bfloat162float(x[d]);
        y[warp][d] = v;
        ss += v * v;
      }
      ss = warp_sum(ss);
      const float rs = rsqrtf(ss / hd + eps);
      if (rstd && lane == 0) rstd[head] = rs;
      for (int d = lane; d < hd; d += 32) y[warp][d] *= rs * __bfloat162float(w[d]);
      __syncwarp();
      for (int d = lane; d < hd; d += 32) {
        float v = y[warp][d];
        if (d < rotary_dim) {
          const int j = d < half ? d : d - half;
          v = d < half ? v * cos_s[j] - y[warp][d + half] * sin_s[j] : v * cos_s[j] + y[warp][d - half] * sin_s[j];
        }
        o[d] = __float2bfloat16_rn(v);
      }
      __syncwarp();  // y[warp] is reused by the warp's next head
    }
  }
}

// Vector path (hd % 8 == 0, rotary_dim % 16 == 0, 16-byte aligned): one warp per job = (token, run of
// heads); `group` lanes per head (the power of two that covers its hd / 8 chunks), one 16-byte chunk per
// lane, 32 / group heads per slot and kSlots slots, so a job is kSlots * 32 / group heads of one token and
// all its loads are issued first. While they are in flight the warp computes the token's rotary_dim / 2
// angles (inv_freq and sincosf as the block-per-token kernel does, one lane per angle) into its own row of
// shared memory. A rotated chunk's partner (d +- rotary_dim / 2) sits rotary_dim / 16 lanes away: its raw
// bf16 arrive by 4 shuffles and are normalized here with the same rstd (the group's xor-shuffle sum is the
// same bits in every lane) and the partner's weights, as the partner computes them.
constexpr int kVecWarps = 8;
constexpr int kVecSlots = 4;  // slots (heads) per lane

template <int kSlots>
__global__ void __launch_bounds__(kVecWarps * 32) head_norm_rope_vec_kernel(
    uint4* out, float* __restrict__ rstd, const uint4* in, const uint4* __restrict__ w,
    const int32_t* __restrict__ pos, int64_t jobs, int nh, int hd, int rotary_dim, int lg, int jobs_per_token,
    float theta, float eps) {
  __shared__ alignas(16) float cs[kVecWarps][2][kMaxHeadDim / 2];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const int64_t job = static_cast<int64_t>(blockIdx.x) * kVecWarps + wib;
  if (job >= jobs) return;  // a whole warp: no barrier below but __syncwarp
  const int group = 1 << lg, sub = lane & (group - 1), per_slot = 32 >> lg, chunks = hd >> 3;
  const int64_t token = job / jobs_per_token;
  const int h0 = static_cast<int>(job - token * jobs_per_token) * kSlots * per_slot + (lane >> lg);
  const bool lane_on = sub < chunks;
  uint4 xv[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int h = h0 + s * per_slot;
    xv[s] = lane_on && h < nh ? in[(token * nh + h) * chunks + sub] : uint4{0, 0, 0, 0};
  }
  const int half = rotary_dim / 2;
  const float p = static_cast<float>(__ldg(pos + token));
  for (int j = lane; j < half; j += 32) {
    const float inv_freq = 1.f / powf(theta, static_cast<float>(2 * j) / rotary_dim);
    sincosf(p * inv_freq, &cs[wib][1][j], &cs[wib][0][j]);
  }
  // This lane's chunk: rotated (sub < rotary_dim / 8) with angles j0 .. j0 + 7, first half or second.
  const int hc = half / 8;
  const bool rot = lane_on && sub < 2 * hc, lo = sub < hc;
  const int psub = lo ? sub + hc : sub - hc;
  const int src = rot ? (lane & ~(group - 1)) | psub : lane;
  float g[8], gp[8], c[8], sn[8];
  unpack8(lane_on ? __ldg(w + sub) : uint4{0, 0, 0, 0}, g);
  unpack8(rot ? __ldg(w + psub) : uint4{0, 0, 0, 0}, gp);
  __syncwarp();
  if (rot) {
    const int j0 = (lo ? sub : psub) * 8;
    const float4* cp = reinterpret_cast<const float4*>(&cs[wib][0][j0]);
    const float4* sp = reinterpret_cast<const float4*>(&cs[wib][1][j0]);
    const float4 c0 = cp[0], c1 = cp[1], s0 = sp[0], s1 = sp[1];
    c[0] = c0.x, c[1] = c0.y, c[2] = c0.z, c[3] = c0.w, c[4] = c1.x, c[5] = c1.y, c[6] = c1.z, c[7] = c1.w;
    sn[0] = s0.x, sn[1] = s0.y, sn[2] = s0.z, sn[3] = s0.w, sn[4] = s1.x, sn[5] = s1.y, sn[6] = s1.z, sn[7] = s1.w;
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    float v[8];
    unpack8(xv[s], v);
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
    ss = group_sum(ss, group);
    uint4 pv;
    pv.x = __shfl_sync(0xffffffffu, xv[s].x, src);
    pv.y = __shfl_sync(0xffffffffu, xv[s].y, src);
    pv.z = __shfl_sync(0xffffffffu, xv[s].z, src);
    pv.w = __shfl_sync(0xffffffffu, xv[s].w, src);
    const int h = h0 + s * per_slot;
    if (!lane_on || h >= nh) continue;
    const float rs = rsqrtf(ss / hd + eps);
    const int64_t head = token * nh + h;
    if (rstd && sub == 0) rstd[head] = rs;
    float y[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = v[e] * rs * g[e];
    if (rot) {
      float q[8];
      unpack8(pv, q);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float partner = q[e] * rs * gp[e];
        y[e] = lo ? y[e] * c[e] - partner * sn[e] : y[e] * c[e] + partner * sn[e];
      }
    }
    out[head * chunks + sub] = pack8_u4(y);
  }
}

}  // namespace

void head_norm_rope_forward(const Ctx& ctx, const Tensor& out, const Tensor& rstd, const Tensor& in,
                            const Tensor& w, const Tensor& pos, ops::RopeSpec rope, float eps) {
  backend_of(ctx);
  DF_CHECK(in.ndim == 3 && out.numel() == in.numel(), Internal,
           "head_norm_rope_forward: out " << out.shape_str() << ", in " << in.shape_str() << " must be [N, nh, hd]");
  int64_t N = in.size(0);
  int nh = static_cast<int>(in.size(1)), hd = static_cast<int>(in.size(2));
  int rotary_dim = rope.rotary_dim == 0 ? hd : rope.rotary_dim;
  DF_CHECK(in.dtype == DType::BF16 && out.dtype == DType::BF16 && w.dtype == DType::BF16 && pos.dtype == DType::I32,
           Internal, "head_norm_rope_forward: in/out/w must be BF16 and pos I32");
  DF_CHECK(hd > 0 && hd <= kMaxHeadDim && static_cast<int64_t>(w.numel()) == hd &&
               static_cast<int64_t>(pos.numel()) == N && rotary_dim % 2 == 0 && rotary_dim <= hd,
           Internal, "head_norm_rope_forward: hd=" << hd << " (<= 256), w " << w.shape_str() << ", pos "
                                                   << pos.shape_str() << ", rotary_dim=" << rotary_dim);
  DF_CHECK(rstd.empty() || (rstd.dtype == DType::F32 && static_cast<int64_t>(rstd.numel()) == N * nh), Internal,
           "head_norm_rope_forward: rstd must be F32 [N, nh], got " << rstd.shape_str());
  if (N == 0 || nh == 0) return;
  DF_CHECK(N < (int64_t(1) << 31) && (reinterpret_cast<uintptr_t>(in.data) & 7) == 0 &&
               (reinterpret_cast<uintptr_t>(out.data) & 7) == 0 && (reinterpret_cast<uintptr_t>(w.data) & 7) == 0,
           Internal, "head_norm_rope_forward: tensors must be 8-byte aligned, N < 2^31");
  if (hd % 8 == 0 && rotary_dim % 16 == 0 && aligned16(in.data) && aligned16(out.data) &&
      aligned16(w.data)) {
    int lg = 0;
    while ((1 << lg) < hd / 8) ++lg;
    const int heads_per_job = kVecSlots * (32 >> lg);
    const int jobs_per_token = (nh + heads_per_job - 1) / heads_per_job;
    const int64_t jobs = N * jobs_per_token;
    const int64_t blocks = (jobs + kVecWarps - 1) / kVecWarps;
    DF_CHECK(blocks < (int64_t(1) << 31), Internal, "head_norm_rope_forward: too many heads");
    head_norm_rope_vec_kernel<kVecSlots><<<static_cast<unsigned>(blocks), kVecWarps * 32, 0, stream_of(ctx)>>>(
        static_cast<uint4*>(out.data), rstd.empty() ? nullptr : static_cast<float*>(rstd.data),
        static_cast<const uint4*>(in.data), static_cast<const uint4*>(w.data), static_cast<const int32_t*>(pos.data),
        jobs, nh, hd, rotary_dim, lg, jobs_per_token, rope.theta, eps);
    DF_CUDA_LAUNCH();
    return;
  }
  head_norm_rope_kernel<<<static_cast<unsigned>(N), kWarps * 32, 0, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(out.data), rstd.empty() ? nullptr : static_cast<float*>(rstd.data),
      static_cast<const __nv_bfloat16*>(in.data), static_cast<const __nv_bfloat16*>(w.data),
      static_cast<const int32_t*>(pos.data), nh, hd, rotary_dim, rope.theta, eps);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
