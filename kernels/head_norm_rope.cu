// One block per token: the token's rotary angles (one per frequency, shared by all its heads) go to
// shared memory first, then each warp normalizes and rotates whole heads. For hd = rotary_dim = 128 (every
// Qwen3) a lane holds 4 consecutive values and its rotation partner (d +- 64) sits in lane ^ 16; other
// shapes stage the normalized head in shared memory.
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
  head_norm_rope_kernel<<<static_cast<unsigned>(N), kWarps * 32, 0, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(out.data), rstd.empty() ? nullptr : static_cast<float*>(rstd.data),
      static_cast<const __nv_bfloat16*>(in.data), static_cast<const __nv_bfloat16*>(w.data),
      static_cast<const int32_t*>(pos.data), nh, hd, rotary_dim, rope.theta, eps);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
