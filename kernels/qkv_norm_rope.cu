// One block per token, as kernels/head_norm_rope.cu: the token's rotary angles go to shared memory first
// (once for its q and k heads), then each warp takes whole heads of the token's fused row: a query or key
// head is normalized and rotated into q or k, a value head copied into v. When hd = rotary_dim = 32 V
// (V = 2, 4, 8: head dims 64, 128, 256) a lane holds V consecutive values in registers and its rotation
// partner (d +- hd/2) sits in lane ^ 16; other shapes stage the normalized head in shared memory.
#include "qkv_norm_rope.cuh"

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxHeadDim = 256;

// V bf16 values moved as one access of 2V bytes.
template <int V> struct Raw;
template <> struct Raw<2> { using T = uint32_t; };
template <> struct Raw<4> { using T = uint2; };
template <> struct Raw<8> { using T = uint4; };

template <int V> __device__ __forceinline__ void load_f32(const __nv_bfloat16* p, float (&f)[V]) {
  const typename Raw<V>::T raw = *reinterpret_cast<const typename Raw<V>::T*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < V / 2; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
template <int V> __device__ __forceinline__ void store_bf16(__nv_bfloat16* p, const float (&f)[V]) {
  typename Raw<V>::T raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < V / 2; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  *reinterpret_cast<typename Raw<V>::T*>(p) = raw;
}

// V = 0: any hd <= 256 and partial RoPE, through shared memory.
template <int V>
__global__ void qkv_norm_rope_kernel(__nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k,
                                     __nv_bfloat16* __restrict__ v, const __nv_bfloat16* __restrict__ qkv,
                                     const __nv_bfloat16* __restrict__ q_norm,
                                     const __nv_bfloat16* __restrict__ k_norm, const int32_t* __restrict__ pos,
                                     int nh, int nkv, int hd, int rotary_dim, float theta, float eps) {
  __shared__ float cos_s[kMaxHeadDim / 2], sin_s[kMaxHeadDim / 2];
  const int64_t token = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = rotary_dim / 2;
  const int heads = nh + 2 * nkv;
  const float p = static_cast<float>(pos[token]);
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    // inv_freq_j = 1 / theta^(2j / rotary_dim) and the angle in fp32, as the HF reference computes them
    const float inv_freq = 1.f / powf(theta, static_cast<float>(2 * j) / rotary_dim);
    sincosf(p * inv_freq, &sin_s[j], &cos_s[j]);
  }
  __syncthreads();
  const __nv_bfloat16* row = qkv + token * heads * hd;
  for (int h = warp; h < heads; h += kWarps) {
    const __nv_bfloat16* x = row + static_cast<int64_t>(h) * hd;
    if (h >= nh + nkv) {  // a value head: copied
      __nv_bfloat16* o = v + (token * nkv + (h - nh - nkv)) * hd;
      if constexpr (V > 0) {
        *reinterpret_cast<typename Raw<V>::T*>(o + lane * V) = *reinterpret_cast<const typename Raw<V>::T*>(x + lane * V);
      } else {
        for (int d = lane; d < hd; d += 32) o[d] = x[d];
      }
      continue;
    }
    const bool is_q = h < nh;
    __nv_bfloat16* o = is_q ? q + (token * nh + h) * hd : k + (token * nkv + (h - nh)) * hd;
    const __nv_bfloat16* w = is_q ? q_norm : k_norm;
    if constexpr (V > 0) {
      const int d0 = lane * V;
      float val[V], g[V];
      load_f32<V>(x + d0, val);
      load_f32<V>(w + d0, g);
      // Summed as head_norm_rope.cu writes it (v0^2 + v1^2 + ...), so at hd 128 the two ops compile to the
      // same arithmetic and the fused target computes exactly what the unfused one did.
      float ss = val[0] * val[0];
#pragma unroll
      for (int i = 1; i < V; ++i) ss += val[i] * val[i];
      ss = warp_sum(ss);
      const float rs = rsqrtf(ss / hd + eps);
      float r[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float yi = val[i] * rs * g[i];
        const float partner = __shfl_xor_sync(0xffffffffu, yi, 16);
        const int j = (d0 + i) & (16 * V - 1);  // the frequency: d mod hd/2
        r[i] = lane < 16 ? yi * cos_s[j] - partner * sin_s[j] : yi * cos_s[j] + partner * sin_s[j];
      }
      store_bf16<V>(o + d0, r);
    } else {
      __shared__ float y[kWarps][kMaxHeadDim];
      float ss = 0.f;
      for (int d = lane; d < hd; d += 32) {
        const float val = __bfloat162float(x[d]);
        y[warp][d] = val;
        ss += val * val;
      }
      ss = warp_sum(ss);
      const float rs = rsqrtf(ss / hd + eps);
      for (int d = lane; d < hd; d += 32) y[warp][d] *= rs * __bfloat162float(w[d]);
      __syncwarp();
      for (int d = lane; d < hd; d += 32) {
        float val = y[warp][d];
        if (d < rotary_dim) {
          const int j = d < half ? d : d - half;
          val = d < half ? val * cos_s[j] - y[warp][d + half] * sin_s[j] : val * cos_s[j] + y[warp][d - half] * sin_s[j];
        }
        o[d] = __float2bfloat16_rn(val);
      }
      __syncwarp();  // y[warp] is reused by the warp's next head
    }
  }
}

bool aligned(const void* p, int bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

}  // namespace

void qkv_norm_rope_forward(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qkv,
                           const Tensor& q_norm, const Tensor& k_norm, const Tensor& pos, ops::RopeSpec rope,
                           float eps) {
  backend_of(ctx);
  DF_CHECK(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && qkv.ndim == 2, Internal,
           "qkv_norm_rope_forward: q " << q.shape_str() << ", k " << k.shape_str() << ", v " << v.shape_str()
                                       << " must be [T, heads, hd], qkv " << qkv.shape_str() << " [T, cols]");
  const int64_t T = q.size(0);
  const int nh = static_cast<int>(q.size(1)), nkv = static_cast<int>(k.size(1)), hd = static_cast<int>(q.size(2));
  DF_CHECK(k.size(0) == T && k.size(2) == hd && v.size(0) == T && v.size(1) == nkv && v.size(2) == hd &&
               qkv.size(0) == T && qkv.size(1) == int64_t(nh + 2 * nkv) * hd,
           Internal, "qkv_norm_rope_forward: q " << q.shape_str() << ", k " << k.shape_str() << ", v "
                                                 << v.shape_str() << ", qkv " << qkv.shape_str());
  DF_CHECK(q.dtype == DType::BF16 && k.dtype == DType::BF16 && v.dtype == DType::BF16 && qkv.dtype == DType::BF16 &&
               q_norm.dtype == DType::BF16 && k_norm.dtype == DType::BF16 && pos.dtype == DType::I32,
           Internal, "qkv_norm_rope_forward: q/k/v/qkv/q_norm/k_norm must be BF16 and pos I32");
  const int rotary_dim = rope.rotary_dim == 0 ? hd : rope.rotary_dim;
  DF_CHECK(hd > 0 && hd <= kMaxHeadDim && static_cast<int64_t>(q_norm.numel()) == hd &&
               static_cast<int64_t>(k_norm.numel()) == hd && static_cast<int64_t>(pos.numel()) == T &&
               rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= hd,
           Internal, "qkv_norm_rope_forward: hd=" << hd << " (<= " << kMaxHeadDim << "), q_norm " << q_norm.shape_str()
                                                  << ", k_norm " << k_norm.shape_str() << ", pos " << pos.shape_str()
                                                  << ", rotary_dim=" << rotary_dim);
  DF_CHECK(T < (int64_t(1) << 31), Internal, "qkv_norm_rope_forward: T=" << T << " must be below 2^31 (one block per token)");
  if (T == 0) return;
  // Registers per lane when the whole head rotates and its width is 32 lanes x V; every pointer then
  // aligned to a V-value access (row strides are multiples of hd, so the bases decide).
  const int V = hd == rotary_dim && (hd == 64 || hd == 128 || hd == 256) ? hd / 32 : 0;
  bool vec = V > 0;
  for (const Tensor* t : {&q, &k, &v, &qkv, &q_norm, &k_norm}) vec = vec && aligned(t->data, 2 * V);
  auto* qo = static_cast<__nv_bfloat16*>(q.data);
  auto* ko = static_cast<__nv_bfloat16*>(k.data);
  auto* vo = static_cast<__nv_bfloat16*>(v.data);
  const auto* in = static_cast<const __nv_bfloat16*>(qkv.data);
  const auto* qw = static_cast<const __nv_bfloat16*>(q_norm.data);
  const auto* kw = static_cast<const __nv_bfloat16*>(k_norm.data);
  const auto* p = static_cast<const int32_t*>(pos.data);
  const unsigned grid = static_cast<unsigned>(T);
  cudaStream_t s = stream_of(ctx);
  if (vec && V == 2) {
    qkv_norm_rope_kernel<2><<<grid, kWarps * 32, 0, s>>>(qo, ko, vo, in, qw, kw, p, nh, nkv, hd, rotary_dim, rope.theta, eps);
  } else if (vec && V == 4) {
    qkv_norm_rope_kernel<4><<<grid, kWarps * 32, 0, s>>>(qo, ko, vo, in, qw, kw, p, nh, nkv, hd, rotary_dim, rope.theta, eps);
  } else if (vec && V == 8) {
    qkv_norm_rope_kernel<8><<<grid, kWarps * 32, 0, s>>>(qo, ko, vo, in, qw, kw, p, nh, nkv, hd, rotary_dim, rope.theta, eps);
  } else {
    qkv_norm_rope_kernel<0><<<grid, kWarps * 32, 0, s>>>(qo, ko, vo, in, qw, kw, p, nh, nkv, hd, rotary_dim, rope.theta, eps);
  }
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
