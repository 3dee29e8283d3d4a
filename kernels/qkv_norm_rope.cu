// Two kernels: the warp kernel for the register shapes, the block kernel for the rest.
//
// Warp kernel (hd = rotary_dim = 64, 128 or 256 and every tensor 16-byte aligned: every Qwen3 target): one
// warp per job = (token, run of up to kSlots slots). A slot is one 16-byte chunk per lane, 32 / group heads
// of group = hd / 8 lanes each, so a job's loads (kSlots x 512 bytes) are all issued first; while they fly
// the warp computes its token's hd / 2 angles into its own row of shared memory (no block barrier). Its
// arithmetic is the block kernel's bit for bit (the GPU test compares the two exactly), see the comment
// above it. Why: the block kernel moves 8 bytes a lane per head, one head after another, after a block
// barrier behind the angles: 48 warps a SM (40 registers) with one 256-byte head each, ~12 KB of loads in
// flight per SM, 2.04 TB/s at the Qwen3-8B shape on an H100 (bench/results/h100-speed-dflash2-fp8acc-20261206e/
// t8b-fp8tok-fastacc.txt: 7.11 ms over 36 layers, against ~3.0 TB/s for a copy). The warp kernel at 12 slots
// (113 registers, 16 warps a SM) keeps 96 KB in flight. bench/qkv_norm_rope_bench.cpp times the variants
// (cuda::QkvNormRopeKernel, DFLASH_QKV_NORM_ROPE) side by side.
//
// Block kernel: one block per token, as kernels/head_norm_rope.cu's: the token's rotary angles go to shared
// memory first (once for its q and k heads), then each warp takes whole heads of the token's fused row: a
// query or key head is normalized and rotated into q or k, a value head copied into v. When hd = rotary_dim
// = 32 V (V = 2, 4, 8: head dims 64, 128, 256) a lane holds V consecutive values in registers and its
// rotation partner (d +- hd/2) sits in lane ^ 16 (the warp kernel's shapes when a tensor is 2V- but not
// 16-byte aligned, and the variant the bench and the test compare against); other shapes stage the
// normalized head in shared memory.
#include "qkv_norm_rope.cuh"

#include <atomic>

#include <cstdlib>
#include <string>

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

// The warp kernel (see the top of the file), bit for bit the block kernel at V = hd / 32. That kernel's lane
// l holds values [l V, l V + V), sums their squares left to right, then adds lanes by xor 16, 8, 4, 2, 1.
// Here a lane holds 8 values: kRuns = 8 / V such runs, those of block lanes sub * kRuns + run (sub: the
// lane's place in its head's group). Each run is summed as there; the xor steps over the block lane's bits
// above the run bits are xor steps of sub (group / 2, ..., 1), taken on every run; the steps over the run
// bits come last, inside the lane. Every step adds the same two values as the block kernel's step (float
// addition commutes, and each step leaves every lane the same sum). The rest is written with _rn
// intrinsics in the order the block kernel compiles to for sm_90 (its SASS: the squares as FMUL then FFMA
// chains, (x rs) g, fma(y, cos, +-(partner sin))); its divide by hd is a multiply by 1 / hd here, exact for
// a power of two, so the same bits.
constexpr int kJobWarps = 4;

template <int HD, int kSlots>
__global__ void __launch_bounds__(kJobWarps * 32) qkv_norm_rope_warp_kernel(
    uint4* __restrict__ q, uint4* __restrict__ k, uint4* __restrict__ v, const uint4* __restrict__ qkv,
    const uint4* __restrict__ q_norm, const uint4* __restrict__ k_norm, const int32_t* __restrict__ pos,
    int64_t jobs, int nh, int nkv, int jobs_per_token, int per_job, float theta, float eps) {
  static_assert(HD == 64 || HD == 128 || HD == 256, "16-byte chunks, a head within one warp, hd a power of two");
  constexpr int kGroup = HD / 8, kLg = HD == 64 ? 3 : HD == 128 ? 4 : 5, kHps = 32 / kGroup;
  constexpr int kV = HD / 32, kRuns = 8 / kV, kHalf = HD / 2;
  __shared__ alignas(16) float cs[kJobWarps][2][kHalf];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5, sub = lane & (kGroup - 1);
  const int64_t job = static_cast<int64_t>(blockIdx.x) * kJobWarps + wib;
  if (job >= jobs) return;  // a whole warp: no barrier below but __syncwarp
  const int64_t token = job / jobs_per_token;
  const int heads = nh + 2 * nkv, chunks = heads * kGroup;  // 16-byte chunks of the token's row
  const int s0 = static_cast<int>(job - token * jobs_per_token) * per_job;
  // Every load of the job first: slot s is chunks [32 s, 32 s + 32) of the row; past its end, zeros.
  const uint4* row = qkv + token * chunks;
  uint4 x[kSlots];
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int c = (s0 + i) * 32 + lane;
    x[i] = i < per_job && c < chunks ? __ldg(row + c) : uint4{0, 0, 0, 0};
  }
  const uint4 wq = __ldg(q_norm + sub), wk = __ldg(k_norm + sub);
  const float p = static_cast<float>(__ldg(pos + token));
#pragma unroll
  for (int j = lane; j < kHalf; j += 32) {
    // inv_freq_j = 1 / theta^(2j / rotary_dim) and the angle in fp32, as the block kernel computes them
    const float inv_freq = 1.f / powf(theta, static_cast<float>(2 * j) / HD);
    sincosf(p * inv_freq, &cs[wib][1][j], &cs[wib][0][j]);
  }
  __syncwarp();
  // This lane's angles: frequencies j0 .. j0 + 7 (d mod hd / 2); its partner (d +- hd / 2) is group / 2 lanes away.
  const bool lo = sub < kGroup / 2;
  float c[8], sn[8];
  {
    const int j0 = (sub & (kGroup / 2 - 1)) * 8;
    const float4* cp = reinterpret_cast<const float4*>(&cs[wib][0][j0]);
    const float4* sp = reinterpret_cast<const float4*>(&cs[wib][1][j0]);
    const float4 c0 = cp[0], c1 = cp[1], s0v = sp[0], s1v = sp[1];
    c[0] = c0.x, c[1] = c0.y, c[2] = c0.z, c[3] = c0.w, c[4] = c1.x, c[5] = c1.y, c[6] = c1.z, c[7] = c1.w;
    sn[0] = s0v.x, sn[1] = s0v.y, sn[2] = s0v.z, sn[3] = s0v.w, sn[4] = s1v.x, sn[5] = s1v.y, sn[6] = s1v.z, sn[7] = s1v.w;
  }
  const int64_t qh = token * nh, kh = token * nkv;  // the token's first head in q, and in k and v
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    if (i >= per_job) break;
    const int s = s0 + i, h = s * kHps + (lane >> kLg);
    const bool on = h < heads;  // false past the row's last head
    if (s * kHps >= nh + nkv) {  // value heads only (the whole warp): copied
      if (on) v[(kh + h - nh - nkv) * kGroup + sub] = x[i];
      continue;
    }
    float f[8], g[8];
    unpack8(x[i], f);
    unpack8(h < nh ? wq : wk, g);
    float r[kRuns];
#pragma unroll
    for (int b = 0; b < kRuns; ++b) {
      r[b] = __fmul_rn(f[b * kV], f[b * kV]);
#pragma unroll
      for (int e = 1; e < kV; ++e) r[b] = __fmaf_rn(f[b * kV + e], f[b * kV + e], r[b]);
    }
#pragma unroll
    for (int o = kGroup / 2; o > 0; o >>= 1)
#pragma unroll
      for (int b = 0; b < kRuns; ++b) r[b] = __fadd_rn(r[b], __shfl_xor_sync(0xffffffffu, r[b], o));
#pragma unroll
    for (int o = kRuns / 2; o > 0; o >>= 1)
#pragma unroll
      for (int b = 0; b < o; ++b) r[b] = __fadd_rn(r[b], r[b + o]);
    const float rs = rsqrtf(__fadd_rn(__fmul_rn(r[0], 1.f / HD), eps));
    float out[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float y = __fmul_rn(__fmul_rn(f[e], rs), g[e]);
      const float ps = __fmul_rn(__shfl_xor_sync(0xffffffffu, y, kGroup / 2), sn[e]);
      out[e] = __fmaf_rn(y, c[e], lo ? -ps : ps);
    }
    if (!on) continue;
    if (h < nh) q[(qh + h) * kGroup + sub] = pack8_u4(out);
    else if (h < nh + nkv) k[(kh + h - nh) * kGroup + sub] = pack8_u4(out);
    else v[(kh + h - nh - nkv) * kGroup + sub] = x[i];  // a value head in a slot with a key head
  }
}

// The kernel the register shapes take: DFLASH_QKV_NORM_ROPE (block, warp, warp6, warp12, warp24; unset: the
// warp kernel at 12 slots, timed on an H100 at 2.80 TB/s against the block kernel's 2.33 and a copy's 2.89:
// bench/README.md "qkv_norm_rope: a warp kernel") at the first call, unless set_qkv_norm_rope_kernel chose
// first. -1: not chosen yet (atomic: a colocated job's two threads both run target forwards).
std::atomic<int> g_kernel{-1};
QkvNormRopeKernel kernel_choice() {
  if (g_kernel.load() < 0) {
    const char* e = std::getenv("DFLASH_QKV_NORM_ROPE");
    const std::string s = e ? e : "";
    QkvNormRopeKernel k = QkvNormRopeKernel::Default;
    if (s == "block") k = QkvNormRopeKernel::Block;
    else if (s == "warp6") k = QkvNormRopeKernel::Warp6;
    else if (s == "warp12") k = QkvNormRopeKernel::Warp12;
    else if (s == "warp24") k = QkvNormRopeKernel::Warp24;
    else DF_CHECK_HINT(s.empty() || s == "warp", BadOptions, "DFLASH_QKV_NORM_ROPE=" << s << " is not a kernel",
                       "unset it, or set block|warp|warp6|warp12|warp24");
    g_kernel = static_cast<int>(k);
  }
  return static_cast<QkvNormRopeKernel>(g_kernel.load());
}

// Jobs of at most kSlots slots, the token's slots split evenly (28 slots at kSlots 12: 10, 10, 8).
template <int HD, int kSlots>
void launch_warp(cudaStream_t stream, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qkv,
                 const Tensor& q_norm, const Tensor& k_norm, const Tensor& pos, int64_t T, int nh, int nkv,
                 float theta, float eps) {
  const int slots = (nh + 2 * nkv + 256 / HD - 1) / (256 / HD);  // 32 / (HD / 8) heads a slot
  const int jobs_per_token = (slots + kSlots - 1) / kSlots, per_job = (slots + jobs_per_token - 1) / jobs_per_token;
  const int64_t jobs = T * jobs_per_token, blocks = (jobs + kJobWarps - 1) / kJobWarps;
  DF_CHECK(blocks < (int64_t(1) << 31), Internal, "qkv_norm_rope_forward: T=" << T << " too large (" << jobs << " jobs)");
  qkv_norm_rope_warp_kernel<HD, kSlots><<<static_cast<unsigned>(blocks), kJobWarps * 32, 0, stream>>>(
      static_cast<uint4*>(q.data), static_cast<uint4*>(k.data), static_cast<uint4*>(v.data),
      static_cast<const uint4*>(qkv.data), static_cast<const uint4*>(q_norm.data),
      static_cast<const uint4*>(k_norm.data), static_cast<const int32_t*>(pos.data), jobs, nh, nkv, jobs_per_token,
      per_job, theta, eps);
}

bool aligned(const void* p, int bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

}  // namespace

void set_qkv_norm_rope_kernel(QkvNormRopeKernel kernel) { g_kernel.store(static_cast<int>(kernel)); }

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
  // The same shapes with every tensor 16-byte aligned take the warp kernel, unless the block one is chosen.
  const QkvNormRopeKernel choice = kernel_choice();
  bool warp = V > 0 && choice != QkvNormRopeKernel::Block;
  for (const Tensor* t : {&q, &k, &v, &qkv, &q_norm, &k_norm}) warp = warp && aligned(t->data, 16);
  if (warp) {
    const cudaStream_t s = stream_of(ctx);
    if (hd == 64) {
      launch_warp<64, 8>(s, q, k, v, qkv, q_norm, k_norm, pos, T, nh, nkv, rope.theta, eps);
    } else if (hd == 256) {
      launch_warp<256, 8>(s, q, k, v, qkv, q_norm, k_norm, pos, T, nh, nkv, rope.theta, eps);
    } else if (choice == QkvNormRopeKernel::Warp6) {
      launch_warp<128, 6>(s, q, k, v, qkv, q_norm, k_norm, pos, T, nh, nkv, rope.theta, eps);
    } else if (choice == QkvNormRopeKernel::Warp24) {
      launch_warp<128, 24>(s, q, k, v, qkv, q_norm, k_norm, pos, T, nh, nkv, rope.theta, eps);
    } else {
      launch_warp<128, 12>(s, q, k, v, qkv, q_norm, k_norm, pos, T, nh, nkv, rope.theta, eps);
    }
    DF_CUDA_LAUNCH();
    return;
  }
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
