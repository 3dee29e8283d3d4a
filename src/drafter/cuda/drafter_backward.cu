// RMSNorm / QK-norm+RoPE / SwiGLU backward on CUDA; see drafter_backward.cuh.
//
// Weight gradients are sums over many rows: each CTA sums its rows in registers and adds its partial to
// dw with one atomic per column, so atomics scale with CTAs, not rows. In deterministic mode
// (set_deterministic) each CTA stores its partial in the backend's scratch instead, and one more kernel
// adds the partials to dw in CTA order: the same sum every run.
#include "drafter_backward.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

// ---- RMSNorm ------------------------------------------------------------------------------------
constexpr int kNormThreads = 256;
constexpr int kNormChunks = 4;     // 16-byte chunks per thread: C <= 256 * 4 * 8 = 8192
constexpr int kNormRowsPerCta = 16;

__device__ __forceinline__ float cta_sum(float v, float* red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.f;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) r += red[w];
  __syncthreads();
  return r;
}

// y = x r w: dx = r (g w) - x r^3 / C sum(g w x); dw += g x r.
__global__ void __launch_bounds__(kNormThreads) rmsnorm_backward_kernel(
    __nv_bfloat16* __restrict__ din, float* __restrict__ dw, const __nv_bfloat16* __restrict__ dout,
    const __nv_bfloat16* __restrict__ in, const __nv_bfloat16* __restrict__ w, const float* __restrict__ rstd,
    int64_t N, int C, int rows_per_cta, float* __restrict__ dw_partial) {
  __shared__ float red[kNormThreads / 32];
  const int chunks = C / 8;
  float wv[kNormChunks][8], dwacc[kNormChunks][8];
#pragma unroll
  for (int k = 0; k < kNormChunks; ++k) {
    const int c = threadIdx.x + k * kNormThreads;
#pragma unroll
    for (int e = 0; e < 8; ++e) dwacc[k][e] = 0.f;
    if (c < chunks) unpack8(reinterpret_cast<const Bf16x8*>(w)[c], wv[k]);
  }
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_cta;
  for (int64_t row = r0; row < min(N, r0 + rows_per_cta); ++row) {
    const float r = rstd[row];
    float x[kNormChunks][8], g[kNormChunks][8];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kNormChunks; ++k) {
      const int c = threadIdx.x + k * kNormThreads;
      if (c < chunks) {
        unpack8(reinterpret_cast<const Bf16x8*>(in + row * C)[c], x[k]);
        unpack8(reinterpret_cast<const Bf16x8*>(dout + row * C)[c], g[k]);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          dot += g[k][e] * wv[k][e] * x[k][e];
          dwacc[k][e] += g[k][e] * x[k][e] * r;
        }
      }
    }
    dot = cta_sum(dot, red);
    const float kf = dot * r * r * r / C;
#pragma unroll
    for (int k = 0; k < kNormChunks; ++k) {
      const int c = threadIdx.x + k * kNormThreads;
      if (c < chunks) {
        float o[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = r * (g[k][e] * wv[k][e]) - x[k][e] * kf;
        reinterpret_cast<Bf16x8*>(din + row * C)[c] = pack8(o);
      }
    }
  }
  if (dw) {
#pragma unroll
    for (int k = 0; k < kNormChunks; ++k) {
      const int c = threadIdx.x + k * kNormThreads;
      if (c < chunks)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (dw_partial) dw_partial[int64_t(blockIdx.x) * C + c * 8 + e] = dwacc[k][e];
          else atomicAdd(dw + c * 8 + e, dwacc[k][e]);
        }
    }
  }
}

// ---- QK-norm + RoPE -------------------------------------------------------------------------------
constexpr int kRopeThreads = 256;  // 8 warps, one (token, head) item per warp at a time
constexpr int kMaxHd = 256;

__global__ void __launch_bounds__(kRopeThreads) head_norm_rope_backward_kernel(
    __nv_bfloat16* din, float* __restrict__ dw, const __nv_bfloat16* dout, const __nv_bfloat16* __restrict__ in,
    const __nv_bfloat16* __restrict__ w, const float* __restrict__ rstd, const int32_t* __restrict__ pos,
    int64_t N, int nh, int hd, int rot, float theta, float* __restrict__ dw_partial) {
  __shared__ float gs[kRopeThreads / 32][kMaxHd];
  __shared__ float dws[kRopeThreads / 32][kMaxHd];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, half = rot / 2;
  for (int c = lane; c < hd; c += 32) dws[warp][c] = 0.f;
  const int64_t items = N * nh;
  for (int64_t it = int64_t(blockIdx.x) * (kRopeThreads / 32) + warp; it < items;
       it += int64_t(gridDim.x) * (kRopeThreads / 32)) {
    const int64_t n = it / nh;
    const int64_t off = it * hd;
    for (int c = lane; c < hd; c += 32) gs[warp][c] = __bfloat162float(dout[off + c]);
    __syncwarp();
    const float p = static_cast<float>(pos[n]);
    const float r = rstd[it];
    float dy[kMaxHd / 32], x[kMaxHd / 32];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxHd / 32; ++k) {
      const int c = lane + 32 * k;
      dy[k] = 0.f;
      x[k] = 0.f;
      if (c < hd) {
        float d;
        if (c < rot) {
          const int i = c < half ? c : c - half;
          const float inv = 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(rot));
          float sn, cs;
          sincosf(p * inv, &sn, &cs);
          d = c < half ? gs[warp][c] * cs + gs[warp][c + half] * sn : gs[warp][c] * cs - gs[warp][c - half] * sn;
        } else {
          d = gs[warp][c];
        }
        dy[k] = d;
        x[k] = __bfloat162float(in[off + c]);
        dot += d * __bfloat162float(w[c]) * x[k];
        dws[warp][c] += d * x[k] * r;
      }
    }
    dot = warp_sum(dot);
    const float kf = dot * r * r * r / hd;
    __syncwarp();  // every lane has read gs before din (which may alias dout) is written
#pragma unroll
    for (int k = 0; k < kMaxHd / 32; ++k) {
      const int c = lane + 32 * k;
      if (c < hd) din[off + c] = __float2bfloat16_rn(r * (dy[k] * __bfloat162float(w[c])) - x[k] * kf);
    }
    __syncwarp();
  }
  __syncthreads();
  if (dw)
    for (int c = threadIdx.x; c < hd; c += kRopeThreads) {
      float s = 0.f;
      for (int k = 0; k < kRopeThreads / 32; ++k) s += dws[k][c];
      if (dw_partial) dw_partial[int64_t(blockIdx.x) * hd + c] = s;
      else atomicAdd(dw + c, s);
    }
}

// dw[c] += sum over b = 0, 1, ... of partial[b][c], in that order (deterministic mode).
__global__ void add_partials_kernel(float* __restrict__ dw, const float* __restrict__ partial, int blocks, int C) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int b = 0; b < blocks; ++b) s += partial[int64_t(b) * C + c];
    dw[c] += s;
  }
}

// The deterministic-mode scratch for `blocks` partials of C floats (the backend allocated it).
float* partial_scratch(const Ctx& ctx, int64_t blocks, int C, const char* op) {
  const Backend& b = backend_of(ctx);
  DF_CHECK(b.det_scratch && size_t(blocks) * size_t(C) <= b.det_scratch_floats, Internal,
           op << ": deterministic mode without its scratch (" << blocks << " x " << C << " floats, have "
              << b.det_scratch_floats << "): set_deterministic(true) before the first CUDA context");
  return b.det_scratch;
}

void add_partials(const Ctx& ctx, float* dw, const float* partial, int blocks, int C) {
  add_partials_kernel<<<unsigned((C + 255) / 256), 256, 0, stream_of(ctx)>>>(dw, partial, blocks, C);
  DF_CUDA_LAUNCH();
}

// ---- SwiGLU -------------------------------------------------------------------------------------
__global__ void swiglu_backward_kernel(__nv_bfloat16* __restrict__ dgate, __nv_bfloat16* __restrict__ dup,
                                       const __nv_bfloat16* __restrict__ dout, const __nv_bfloat16* __restrict__ gate,
                                       const __nv_bfloat16* __restrict__ up, int64_t n8) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += stride) {
    float d[8], g[8], u[8], dg[8], du[8];
    unpack8(reinterpret_cast<const Bf16x8*>(dout)[i], d);
    unpack8(reinterpret_cast<const Bf16x8*>(gate)[i], g);
    unpack8(reinterpret_cast<const Bf16x8*>(up)[i], u);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float s = 1.f / (1.f + __expf(-g[e]));
      dg[e] = d[e] * u[e] * s * (1.f + g[e] * (1.f - s));
      du[e] = d[e] * g[e] * s;
    }
    reinterpret_cast<Bf16x8*>(dgate)[i] = pack8(dg);
    reinterpret_cast<Bf16x8*>(dup)[i] = pack8(du);
  }
}

__global__ void swiglu_backward_tail_kernel(__nv_bfloat16* dgate, __nv_bfloat16* dup, const __nv_bfloat16* dout,
                                            const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t begin,
                                            int64_t n) {
  const int64_t i = begin + threadIdx.x;
  if (i >= n) return;
  const float d = __bfloat162float(dout[i]), g = __bfloat162float(gate[i]), u = __bfloat162float(up[i]);
  const float s = 1.f / (1.f + __expf(-g));
  dgate[i] = __float2bfloat16_rn(d * u * s * (1.f + g * (1.f - s)));
  dup[i] = __float2bfloat16_rn(d * g * s);
}

void check_bf16(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    DF_CHECK(t->dtype == DType::BF16 && aligned16(t->data), Internal,
             op << ": tensors must be BF16 and 16-byte aligned on CUDA, got " << dtype_name(t->dtype));
}

}  // namespace

void rmsnorm_backward(const Ctx& ctx, const Tensor& din, const Tensor& dw, const Tensor& dout, const Tensor& in,
                      const Tensor& w, const Tensor& rstd) {
  const char* op = "rmsnorm_backward (CUDA)";
  check_bf16(op, {&din, &dout, &in, &w});
  DF_CHECK(rstd.dtype == DType::F32 && (dw.empty() || dw.dtype == DType::F32), Internal, op << ": rstd and dw are F32");
  const int C = static_cast<int>(w.numel());
  const int64_t N = static_cast<int64_t>(in.numel()) / C;
  DF_CHECK(C % 8 == 0 && C <= kNormThreads * kNormChunks * 8, Internal, op << ": C = " << C);
  if (N == 0) return;
  // Deterministic: at most kDetScratchBlocksPerSm CTAs per SM, each with its partial in the scratch.
  const bool det = deterministic() && !dw.empty();
  int rows = kNormRowsPerCta;
  if (det) {
    const int64_t max_ctas = int64_t(kDetScratchBlocksPerSm) * backend_of(ctx).sm_count;
    rows = static_cast<int>(std::max<int64_t>(kNormRowsPerCta, (N + max_ctas - 1) / max_ctas));
  }
  const int64_t ctas = (N + rows - 1) / rows;
  float* partial = det ? partial_scratch(ctx, ctas, C, op) : nullptr;
  rmsnorm_backward_kernel<<<unsigned(ctas), kNormThreads, 0, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(din.data), dw.empty() ? nullptr : static_cast<float*>(dw.data),
      static_cast<const __nv_bfloat16*>(dout.data), static_cast<const __nv_bfloat16*>(in.data),
      static_cast<const __nv_bfloat16*>(w.data), static_cast<const float*>(rstd.data), N, C, rows, partial);
  DF_CUDA_LAUNCH();
  if (det) add_partials(ctx, static_cast<float*>(dw.data), partial, static_cast<int>(ctas), C);
}

void head_norm_rope_backward(const Ctx& ctx, const Tensor& din, const Tensor& dw, const Tensor& dout,
                             const Tensor& in, const Tensor& w, const Tensor& rstd, const Tensor& pos,
                             ops::RopeSpec rope, float eps) {
  const char* op = "head_norm_rope_backward (CUDA)";
  check_bf16(op, {&din, &dout, &in, &w});
  DF_CHECK(!rstd.empty() && rstd.dtype == DType::F32 && pos.dtype == DType::I32 && (dw.empty() || dw.dtype == DType::F32),
           Internal, op << ": rstd (F32, required), pos (I32), dw (F32)");
  const int64_t N = in.shape[0];
  const int nh = static_cast<int>(in.shape[1]), hd = static_cast<int>(in.shape[2]);
  const int rot = rope.rotary_dim == 0 ? hd : rope.rotary_dim;
  DF_CHECK(hd <= kMaxHd && rot % 2 == 0 && rot <= hd, Internal, op << ": hd " << hd << " rotary_dim " << rot);
  const int64_t items = N * nh;
  if (items == 0) return;
  const unsigned blocks = grid_stride_blocks(ctx, items, 8, 8);
  const bool det = deterministic() && !dw.empty();
  float* partial = det ? partial_scratch(ctx, blocks, hd, op) : nullptr;
  head_norm_rope_backward_kernel<<<blocks, kRopeThreads, 0, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(din.data), dw.empty() ? nullptr : static_cast<float*>(dw.data),
      static_cast<const __nv_bfloat16*>(dout.data), static_cast<const __nv_bfloat16*>(in.data),
      static_cast<const __nv_bfloat16*>(w.data), static_cast<const float*>(rstd.data),
      static_cast<const int32_t*>(pos.data), N, nh, hd, rot, rope.theta, partial);
  DF_CUDA_LAUNCH();
  if (det) add_partials(ctx, static_cast<float*>(dw.data), partial, static_cast<int>(blocks), hd);
}

void swiglu_backward(const Ctx& ctx, const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  const char* op = "swiglu_backward (CUDA)";
  check_bf16(op, {&dgate, &dup, &dout, &gate, &up});
  const int64_t n = static_cast<int64_t>(gate.numel()), n8 = n / 8;
  auto* dg = static_cast<__nv_bfloat16*>(dgate.data);
  auto* du = static_cast<__nv_bfloat16*>(dup.data);
  const auto* d = static_cast<const __nv_bfloat16*>(dout.data);
  const auto* g = static_cast<const __nv_bfloat16*>(gate.data);
  const auto* u = static_cast<const __nv_bfloat16*>(up.data);
  if (n8 > 0) {
    const unsigned blocks = grid_stride_blocks(ctx, n8, 256, 16);
    swiglu_backward_kernel<<<blocks, 256, 0, stream_of(ctx)>>>(dg, du, d, g, u, n8);
    DF_CUDA_LAUNCH();
  }
  if (n8 * 8 < n) {
    swiglu_backward_tail_kernel<<<1, 8, 0, stream_of(ctx)>>>(dg, du, d, g, u, n8 * 8, n);
    DF_CUDA_LAUNCH();
  }
}

}  // namespace dflash::cuda
