// One warp per (token, head): the head's hd values are normalized in fp32, staged in shared memory so
// each lane can read its rotation partner (i <-> i ± rotary_dim/2), then rotated and written.
#include "head_norm_rope.cuh"

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxHeadDim = 256;

__global__ void head_norm_rope_kernel(__nv_bfloat16* out, float* __restrict__ rstd, const __nv_bfloat16* in,
                                      const __nv_bfloat16* __restrict__ w, const int32_t* __restrict__ pos,
                                      int64_t heads_total, int nh, int hd, int rotary_dim, float theta,
                                      float eps) {
  __shared__ float y[kWarpsPerBlock][kMaxHeadDim];
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t head = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (head >= heads_total) return;
  const __nv_bfloat16* x = in + head * hd;
  float ss = 0.f;
  for (int d = lane; d < hd; d += 32) {
    float v = __bfloat162float(x[d]);
    y[warp][d] = v;
    ss += v * v;
  }
  ss = warp_sum(ss);
  float rs = rsqrtf(ss / hd + eps);
  if (rstd && lane == 0) rstd[head] = rs;
  for (int d = lane; d < hd; d += 32) y[warp][d] *= rs * __bfloat162float(w[d]);
  __syncwarp();
  float p = static_cast<float>(pos[head / nh]);
  int half = rotary_dim / 2;
  __nv_bfloat16* o = out + head * hd;
  for (int d = lane; d < hd; d += 32) {
    float v = y[warp][d];
    if (d < rotary_dim) {
      int j = d < half ? d : d - half;
      // inv_freq_j = 1 / theta^(2j / rotary_dim) and the angle in fp32, as the HF reference computes them
      float inv_freq = 1.f / powf(theta, static_cast<float>(2 * j) / rotary_dim);
      float s, c;
      sincosf(p * inv_freq, &s, &c);
      v = d < half ? v * c - y[warp][d + half] * s : v * c + y[warp][d - half] * s;
    }
    o[d] = __float2bfloat16_rn(v);
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
  int64_t heads_total = N * nh;
  if (heads_total == 0) return;
  int64_t blocks = (heads_total + kWarpsPerBlock - 1) / kWarpsPerBlock;
  head_norm_rope_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(out.data), rstd.empty() ? nullptr : static_cast<float*>(rstd.data),
      static_cast<const __nv_bfloat16*>(in.data), static_cast<const __nv_bfloat16*>(w.data),
      static_cast<const int32_t*>(pos.data), heads_total, nh, hd, rotary_dim, rope.theta, eps);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
