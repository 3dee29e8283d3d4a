// AdamW + clipping on CUDA; see adamw.cuh. Memory-bound: one pass reads p, g, m, v and writes p, m, v
// (and the bf16 weight copy), 16-byte accesses where the buffers allow.
#include "adamw.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"
#include "dflash/stochastic_round.h"
#include "drafter_blas.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSumBlocks = 1024;  // partial sums of the first reduction stage

// Device-side optimizer scalars: [0] sum of squares of the last clip_adamw_step / grad_sumsq (double),
// then kSumBlocks partials.
double* norm_slot(const Ctx& ctx) {
  return static_cast<double*>(scratch(ctx, ScratchSlot::OptimNorm, sizeof(double) * (1 + kSumBlocks)));
}

__global__ void __launch_bounds__(kThreads) sumsq_partial_kernel(const float* __restrict__ g, int64_t n,
                                                                 double* __restrict__ partial) {
  __shared__ double red[kThreads / 32];
  double acc = 0.0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t n4 = n / 4;
  const float4* g4 = reinterpret_cast<const float4*>(g);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
    const float4 x = g4[i];
    acc += double(x.x * x.x + x.y * x.y) + double(x.z * x.z + x.w * x.w);
  }
  for (int64_t i = n4 * 4 + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc += double(g[i]) * g[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) s += red[w];
    partial[blockIdx.x] = s;
  }
}

__global__ void sumsq_final_kernel(const double* __restrict__ partial, int count, double* __restrict__ out) {
  __shared__ double red[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int w = 0; w < int(blockDim.x / 32); ++w) s += red[w];
    *out = s;
  }
}

// sumsq -> norm slot [0] (stream-ordered, no sync).
void sumsq_on_device(const Ctx& ctx, const Tensor& grads, double* slot) {
  const int64_t n = static_cast<int64_t>(grads.numel());
  DF_CHECK(grads.dtype == DType::F32 && aligned16(grads.data), Internal, "grad_sumsq (CUDA): F32, 16-byte aligned");
  sumsq_partial_kernel<<<kSumBlocks, kThreads, 0, stream_of(ctx)>>>(static_cast<const float*>(grads.data), n, slot + 1);
  DF_CUDA_LAUNCH();
  sumsq_final_kernel<<<1, 1024, 0, stream_of(ctx)>>>(slot + 1, kSumBlocks, slot);
  DF_CUDA_LAUNCH();
}

struct AdamArgs {
  float b1, b2, eps, decay, step_size, inv_bc2_sqrt, clip;
  const double* sumsq;  // device; null = no clipping
};

__device__ __forceinline__ void adam_one(float& p, float g, float& m, float& v, const AdamArgs& a, float coef) {
  g *= coef;
  m = a.b1 * m + (1.f - a.b1) * g;
  v = a.b2 * v + (1.f - a.b2) * g * g;
  const float denom = sqrtf(v) * a.inv_bc2_sqrt + a.eps;
  p = p * a.decay - a.step_size * m / denom;
}

// The clip coefficient of both AdamW kernels (1 without clipping or with a non-finite norm).
__device__ __forceinline__ float clip_coef(const AdamArgs& a) {
  float coef = 1.f;
  if (a.sumsq && a.clip > 0.f) {
    const double norm = sqrt(*a.sumsq);
    const double c = double(a.clip) / (norm + 1e-6);
    if (isfinite(norm) && c < 1.0) coef = float(c);
  }
  return coef;
}

__global__ void __launch_bounds__(kThreads) adamw_kernel(float* __restrict__ p, const float* __restrict__ g,
                                                         float* __restrict__ m, float* __restrict__ v,
                                                         __nv_bfloat16* __restrict__ pbf, int64_t n, AdamArgs a) {
  const float coef = clip_coef(a);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t n4 = n / 4;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 P = reinterpret_cast<float4*>(p)[i];
    const float4 G = reinterpret_cast<const float4*>(g)[i];
    float4 M = reinterpret_cast<float4*>(m)[i];
    float4 Vv = reinterpret_cast<float4*>(v)[i];
    adam_one(P.x, G.x, M.x, Vv.x, a, coef);
    adam_one(P.y, G.y, M.y, Vv.y, a, coef);
    adam_one(P.z, G.z, M.z, Vv.z, a, coef);
    adam_one(P.w, G.w, M.w, Vv.w, a, coef);
    reinterpret_cast<float4*>(p)[i] = P;
    reinterpret_cast<float4*>(m)[i] = M;
    reinterpret_cast<float4*>(v)[i] = Vv;
    if (pbf) {
      __nv_bfloat162 lo = __floats2bfloat162_rn(P.x, P.y), hi = __floats2bfloat162_rn(P.z, P.w);
      reinterpret_cast<__nv_bfloat162*>(pbf)[2 * i] = lo;
      reinterpret_cast<__nv_bfloat162*>(pbf)[2 * i + 1] = hi;
    }
  }
  for (int64_t i = n4 * 4 + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    adam_one(p[i], g[i], m[i], v[i], a, coef);
    if (pbf) pbf[i] = __float2bfloat16_rn(p[i]);
  }
}

// --optimizer-state bf16: p, m, v bf16 (the state itself), 8 elements per thread per iteration (16-byte
// loads of the bf16 tensors, two float4 of the gradient), the scalar tail after. The per-element math and
// the random bits are sr::adamw_bf16_update's, shared with the CPU op (dflash/stochastic_round.h).
__global__ void __launch_bounds__(kThreads) adamw_bf16state_kernel(uint16_t* __restrict__ p, const float* __restrict__ g,
                                                                   uint16_t* __restrict__ m, uint16_t* __restrict__ v,
                                                                   int64_t n, AdamArgs a, uint64_t key) {
  const float coef = clip_coef(a);
  const sr::AdamScalars s{a.b1, a.b2, a.eps, a.decay, a.step_size, a.inv_bc2_sqrt};
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t n8 = n / 8;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += stride) {
    uint4 P = reinterpret_cast<const uint4*>(p)[i], M = reinterpret_cast<const uint4*>(m)[i],
          Vv = reinterpret_cast<const uint4*>(v)[i];
    const float4 G0 = reinterpret_cast<const float4*>(g)[2 * i], G1 = reinterpret_cast<const float4*>(g)[2 * i + 1];
    const float gs[8] = {G0.x, G0.y, G0.z, G0.w, G1.x, G1.y, G1.z, G1.w};
    uint16_t* ph = reinterpret_cast<uint16_t*>(&P);
    uint16_t* mh = reinterpret_cast<uint16_t*>(&M);
    uint16_t* vh = reinterpret_cast<uint16_t*>(&Vv);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint64_t e = uint64_t(8 * i + k);
      const sr::Bf16State r = sr::adamw_bf16_update(sr::bf16_bits_f32(ph[k]), sr::bf16_bits_f32(mh[k]),
                                                    sr::bf16_bits_f32(vh[k]), sr::mul(gs[k], coef), s,
                                                    sr::element_bits(key, e));
      ph[k] = r.p;
      mh[k] = r.m;
      vh[k] = r.v;
    }
    reinterpret_cast<uint4*>(p)[i] = P;
    reinterpret_cast<uint4*>(m)[i] = M;
    reinterpret_cast<uint4*>(v)[i] = Vv;
  }
  for (int64_t i = n8 * 8 + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const sr::Bf16State r = sr::adamw_bf16_update(sr::bf16_bits_f32(p[i]), sr::bf16_bits_f32(m[i]),
                                                  sr::bf16_bits_f32(v[i]), sr::mul(g[i], coef), s,
                                                  sr::element_bits(key, uint64_t(i)));
    p[i] = r.p;
    m[i] = r.m;
    v[i] = r.v;
  }
}

__global__ void scale_kernel(float* __restrict__ g, int64_t n, float f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) g[i] *= f;
}

unsigned grid_for(const Ctx& ctx, int64_t n) { return grid_stride_blocks(ctx, n / 4, kThreads, 16); }

AdamArgs adam_args(const ops::AdamWHyper& hp, int64_t step, float clip, const double* sumsq) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(step));
  AdamArgs a{};
  a.b1 = hp.beta1;
  a.b2 = hp.beta2;
  a.eps = hp.eps;
  a.decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
  a.step_size = static_cast<float>(hp.lr / bc1);
  a.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  a.clip = clip;
  a.sumsq = sumsq;
  return a;
}

void launch_adamw(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const ops::AdamWHyper& hp, int64_t step, float clip, const double* sumsq, const Tensor& pbf) {
  const char* op = "adamw_step (CUDA)";
  for (const Tensor* t : {&params, &grads, &m, &v})
    DF_CHECK(t->dtype == DType::F32 && aligned16(t->data), Internal, op << ": F32 buffers, 16-byte aligned");
  const int64_t n = static_cast<int64_t>(params.numel());
  DF_CHECK(pbf.empty() || (pbf.dtype == DType::BF16 && static_cast<int64_t>(pbf.numel()) == n && aligned16(pbf.data)),
           Internal, op << ": the bf16 weight copy must be BF16 [" << n << "], 16-byte aligned");
  DF_CHECK(step >= 1, Internal, op << ": step " << step << " (1-based)");
  const AdamArgs a = adam_args(hp, step, clip, sumsq);
  adamw_kernel<<<grid_for(ctx, n), kThreads, 0, stream_of(ctx)>>>(
      static_cast<float*>(params.data), static_cast<const float*>(grads.data), static_cast<float*>(m.data),
      static_cast<float*>(v.data), pbf.empty() ? nullptr : static_cast<__nv_bfloat16*>(pbf.data), n, a);
  DF_CUDA_LAUNCH();
}

void launch_adamw_bf16state(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m,
                            const Tensor& v, const ops::AdamWHyper& hp, int64_t step, float clip, const double* sumsq,
                            uint64_t seed) {
  const char* op = "adamw_step_bf16state (CUDA)";
  DF_CHECK(grads.dtype == DType::F32 && aligned16(grads.data), Internal, op << ": F32 gradients, 16-byte aligned");
  for (const Tensor* t : {&params, &m, &v})
    DF_CHECK(t->dtype == DType::BF16 && aligned16(t->data), Internal, op << ": BF16 p, m, v, 16-byte aligned");
  const int64_t n = static_cast<int64_t>(params.numel());
  DF_CHECK(static_cast<int64_t>(grads.numel()) == n && static_cast<int64_t>(m.numel()) == n &&
               static_cast<int64_t>(v.numel()) == n,
           Internal, op << ": p, g, m, v of " << n << " elements each");
  DF_CHECK(step >= 1, Internal, op << ": step " << step << " (1-based)");
  const uint64_t key = sr::step_key(seed, static_cast<uint64_t>(step));
  adamw_bf16state_kernel<<<grid_stride_blocks(ctx, n / 8, kThreads, 16), kThreads, 0, stream_of(ctx)>>>(
      static_cast<uint16_t*>(params.data), static_cast<const float*>(grads.data), static_cast<uint16_t*>(m.data),
      static_cast<uint16_t*>(v.data), n, adam_args(hp, step, clip, sumsq), key);
  DF_CUDA_LAUNCH();
}

}  // namespace

void adamw_step_bf16state(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                          const ops::AdamWHyper& hyper, int64_t step, uint64_t seed) {
  launch_adamw_bf16state(ctx, params, grads, m, v, hyper, step, 0.f, nullptr, seed);
}

void clip_adamw_step_bf16state(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m,
                               const Tensor& v, const ops::AdamWHyper& hyper, int64_t step, float clip,
                               uint64_t seed) {
  double* slot = norm_slot(ctx);
  sumsq_on_device(ctx, grads, slot);
  launch_adamw_bf16state(ctx, params, grads, m, v, hyper, step, clip, slot, seed);
}

void adamw_step(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                const ops::AdamWHyper& hyper, int64_t step) {
  launch_adamw(ctx, params, grads, m, v, hyper, step, 0.f, nullptr, Tensor());
}

double grad_sumsq(const Ctx& ctx, const Tensor& grads) {
  double* slot = norm_slot(ctx);
  sumsq_on_device(ctx, grads, slot);
  double s = 0.0;
  copy_bytes(ctx, &s, slot, sizeof(double));
  return s;
}

void scale_inplace(const Ctx& ctx, const Tensor& grads, float factor) {
  DF_CHECK(grads.dtype == DType::F32, Internal, "scale_inplace (CUDA): F32");
  const int64_t n = static_cast<int64_t>(grads.numel());
  scale_kernel<<<grid_for(ctx, 4 * n), kThreads, 0, stream_of(ctx)>>>(static_cast<float*>(grads.data), n, factor);
  DF_CUDA_LAUNCH();
}

void clip_adamw_step(const Ctx& ctx, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                     const ops::AdamWHyper& hyper, int64_t step, float clip, const Tensor& params_bf16) {
  double* slot = norm_slot(ctx);
  sumsq_on_device(ctx, grads, slot);
  launch_adamw(ctx, params, grads, m, v, hyper, step, clip, slot, params_bf16);
}

double last_grad_norm(const Ctx& ctx) {
  double s = 0.0;
  copy_bytes(ctx, &s, norm_slot(ctx), sizeof(double));
  return std::sqrt(s);
}

}  // namespace dflash::cuda
