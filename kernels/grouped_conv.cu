// DFlash2's grouped dynamic causal convolution on CUDA; see grouped_conv.cuh and docs/dflash2.md 2.2.
// Shapes: R rows (N blocks of B), H channels, k taps, G = H / gs groups; dyn [R, 2kG] (column
// side*k*G + j*G + g). Taps never cross a block: tap j of row t exists when j <= t % B.
//
// Two paths:
//   - vector (H % 8 == 0, gs a power of two in [8, 256], 16-byte aligned tensors): 8 channels a thread, all
//     of one group; the d_dyn group sum is a shuffle over the gs / 8 lanes that hold the group.
//   - scalar (any other shape): one channel a thread; d_dyn one thread per (row, tap, group), dbase one
//     thread per (tap, channel) looping over the rows. Correct, not fast: for odd test shapes.
#include "grouped_conv.cuh"

#include <algorithm>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

struct ConvArgs {
  int64_t R, H;
  int B, k, gs, G;
  int64_t dyn_ld;   // 2kG
  int64_t dyn_off;  // side*k*G
};

__device__ __forceinline__ void load_f32x8(const float* p, float (&f)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

// ---- vector path -----------------------------------------------------------------------------------------

// out[t, c] = sum_{j < k, j <= t%B} (base[j, c] + dyn[t, side, j, g]) in[t-j, c]. Grid-stride over R * H/8 units.
__global__ void conv_fwd_vec_kernel(ConvArgs a, uint4* __restrict__ out, const uint4* __restrict__ in,
                                    const __nv_bfloat16* __restrict__ dyn, const float* __restrict__ base) {
  const int64_t units_row = a.H / 8, n = a.R * units_row;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n; u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = u / units_row, cu = u - t * units_row, c0 = cu * 8;
    const int g = int(c0 / a.gs), o = int(t % a.B);
    const int taps = min(a.k, o + 1);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < taps; ++j) {
      float x[8], b[8];
      unpack8(__ldg(in + (t - j) * units_row + cu), x);
      load_f32x8(base + int64_t(j) * a.H + c0, b);
      const float d = __bfloat162float(dyn[t * a.dyn_ld + a.dyn_off + int64_t(j) * a.G + g]);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] += (b[e] + d) * x[e];
    }
    out[u] = pack8_u4(acc);
  }
}

// din[t, c] = sum_{j < k, t%B + j < B} (base[j, c] + dyn[t+j, side, j, g]) dout[t+j, c].
__global__ void conv_din_vec_kernel(ConvArgs a, uint4* __restrict__ din, const uint4* __restrict__ dout,
                                    const __nv_bfloat16* __restrict__ dyn, const float* __restrict__ base) {
  const int64_t units_row = a.H / 8, n = a.R * units_row;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n; u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = u / units_row, cu = u - t * units_row, c0 = cu * 8;
    const int g = int(c0 / a.gs), o = int(t % a.B);
    const int taps = min(a.k, a.B - o);  // R is a multiple of B: t + j < R
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < taps; ++j) {
      float dy[8], b[8];
      unpack8(__ldg(dout + (t + j) * units_row + cu), dy);
      load_f32x8(base + int64_t(j) * a.H + c0, b);
      const float d = __bfloat162float(dyn[(t + j) * a.dyn_ld + a.dyn_off + int64_t(j) * a.G + g]);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] += (b[e] + d) * dy[e];
    }
    din[u] = pack8_u4(acc);
  }
}

constexpr int kWx = 32, kWy = 8;  // d_dyn/dbase kernel: 32 channel chunks (256 channels) x 8 row lanes

// Per tap j (loop) and row t (grid-stride over y): p[t, c] = dout[t, c] in[t-j, c] (0 when j > t%B) for the
// thread's 8 channels; d_dyn[t, side, j, g] = the group's sum (a shuffle over gs/8 lanes), written by the
// group's first lane; dbase[j, c] += sum_t p: registers over the thread's rows, then the 8 row lanes summed
// in shared memory (8 KB) and one fp32 atomicAdd per channel and block.
__global__ void __launch_bounds__(kWx* kWy) conv_ddyn_dbase_vec_kernel(ConvArgs a, __nv_bfloat16* __restrict__ d_dyn,
                                                                      float* __restrict__ dbase,
                                                                      const uint4* __restrict__ dout,
                                                                      const uint4* __restrict__ in) {
  __shared__ float red[kWy][kWx * 8];
  const int64_t units_row = a.H / 8;
  const int64_t cu = int64_t(blockIdx.x) * kWx + threadIdx.x;
  const bool active = cu < units_row;  // inactive lanes still shuffle (zeros)
  const int64_t c0 = cu * 8;
  const int lanes_per_group = a.gs / 8;  // power of two <= 32: the group's lanes are aligned in the warp
  const bool group_head = (threadIdx.x & (lanes_per_group - 1)) == 0;
  const int g = int(c0 / a.gs);
  const int64_t row_step = int64_t(gridDim.y) * kWy;
  for (int j = 0; j < a.k; ++j) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t t = int64_t(blockIdx.y) * kWy + threadIdx.y; t < a.R; t += row_step) {  // uniform per warp
      const bool tap = j <= int(t % a.B);
      float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (active && tap) {
        float dy[8], x[8];
        unpack8(__ldg(dout + t * units_row + cu), dy);
        unpack8(__ldg(in + (t - j) * units_row + cu), x);
#pragma unroll
        for (int e = 0; e < 8; ++e) p[e] = dy[e] * x[e];
      }
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        acc[e] += p[e];
        s += p[e];
      }
      s = group_sum(s, lanes_per_group);
      if (active && group_head) d_dyn[t * a.dyn_ld + a.dyn_off + int64_t(j) * a.G + g] = __float2bfloat16_rn(s);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) red[threadIdx.y][threadIdx.x * 8 + e] = acc[e];
    __syncthreads();
    // 256 threads sum the 8 row lanes of the block's 256 channels.
    const int tid = threadIdx.y * kWx + threadIdx.x;
    const int64_t c = int64_t(blockIdx.x) * kWx * 8 + tid;
    if (c < a.H) {
      float s = 0.f;
#pragma unroll
      for (int y = 0; y < kWy; ++y) s += red[y][tid];
      atomicAdd(dbase + int64_t(j) * a.H + c, s);
    }
    __syncthreads();
  }
}

// ---- scalar path -----------------------------------------------------------------------------------------

__global__ void conv_fwd_scalar_kernel(ConvArgs a, __nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ in,
                                       const __nv_bfloat16* __restrict__ dyn, const float* __restrict__ base) {
  const int64_t n = a.R * a.H;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n; u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = u / a.H, c = u - t * a.H;
    const int g = int(c / a.gs), taps = min(a.k, int(t % a.B) + 1);
    float acc = 0.f;
    for (int j = 0; j < taps; ++j)
      acc += (base[int64_t(j) * a.H + c] + __bfloat162float(dyn[t * a.dyn_ld + a.dyn_off + int64_t(j) * a.G + g])) *
             __bfloat162float(in[(t - j) * a.H + c]);
    out[u] = __float2bfloat16_rn(acc);
  }
}

__global__ void conv_din_scalar_kernel(ConvArgs a, __nv_bfloat16* __restrict__ din, const __nv_bfloat16* __restrict__ dout,
                                       const __nv_bfloat16* __restrict__ dyn, const float* __restrict__ base) {
  const int64_t n = a.R * a.H;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n; u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = u / a.H, c = u - t * a.H;
    const int g = int(c / a.gs);
    const int taps = min(a.k, a.B - int(t % a.B));
    float acc = 0.f;
    for (int j = 0; j < taps; ++j)
      acc += (base[int64_t(j) * a.H + c] +
              __bfloat162float(dyn[(t + j) * a.dyn_ld + a.dyn_off + int64_t(j) * a.G + g])) *
             __bfloat162float(dout[(t + j) * a.H + c]);
    din[u] = __float2bfloat16_rn(acc);
  }
}

// One thread per (t, j, g): the group's sum of dout[t, c] in[t-j, c].
__global__ void conv_ddyn_scalar_kernel(ConvArgs a, __nv_bfloat16* __restrict__ d_dyn,
                                        const __nv_bfloat16* __restrict__ dout, const __nv_bfloat16* __restrict__ in) {
  const int64_t per_row = int64_t(a.k) * a.G, n = a.R * per_row;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n; u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = u / per_row;
    const int jg = int(u - t * per_row), j = jg / a.G, g = jg - j * a.G;
    float s = 0.f;
    if (j <= int(t % a.B))
      for (int64_t c = int64_t(g) * a.gs; c < int64_t(g + 1) * a.gs; ++c)
        s += __bfloat162float(dout[t * a.H + c]) * __bfloat162float(in[(t - j) * a.H + c]);
    d_dyn[t * a.dyn_ld + a.dyn_off + jg] = __float2bfloat16_rn(s);
  }
}

// One thread per (j, c), looping over every row.
__global__ void conv_dbase_scalar_kernel(ConvArgs a, float* __restrict__ dbase, const __nv_bfloat16* __restrict__ dout,
                                         const __nv_bfloat16* __restrict__ in) {
  const int64_t n = int64_t(a.k) * a.H;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n; u += int64_t(gridDim.x) * blockDim.x) {
    const int j = int(u / a.H);
    const int64_t c = u - int64_t(j) * a.H;
    float s = 0.f;
    for (int64_t t = 0; t < a.R; ++t)
      if (j <= int(t % a.B)) s += __bfloat162float(dout[t * a.H + c]) * __bfloat162float(in[(t - j) * a.H + c]);
    dbase[u] += s;
  }
}

// ---- launchers -------------------------------------------------------------------------------------------

ConvArgs check_args(const char* op, const Tensor& x, const Tensor& y, const Tensor& dyn, int side, const Tensor& base,
                    const ops::GroupedConvSpec& spec) {
  DF_CHECK(x.dtype == DType::BF16 && y.dtype == DType::BF16 && dyn.dtype == DType::BF16 && base.dtype == DType::F32,
           Internal, op << ": activations and dyn must be BF16, base F32");
  DF_CHECK(x.ndim == 2 && y.ndim == 2 && x.shape[0] == y.shape[0] && x.shape[1] == y.shape[1], Internal,
           op << ": " << x.shape_str() << " vs " << y.shape_str());
  DF_CHECK(spec.block_size >= 1 && spec.kernel_size >= 1 && spec.group_size >= 1, Internal,
           op << ": block " << spec.block_size << ", kernel " << spec.kernel_size << ", group " << spec.group_size);
  DF_CHECK(side == 0 || side == 1, Internal, op << ": side " << side);
  ConvArgs a{};
  a.R = x.shape[0];
  a.H = x.shape[1];
  a.B = spec.block_size;
  a.k = spec.kernel_size;
  a.gs = spec.group_size;
  DF_CHECK(a.H % a.gs == 0 && a.R % a.B == 0, Internal,
           op << ": H " << a.H << " % group " << a.gs << ", R " << a.R << " % B " << a.B);
  a.G = int(a.H / a.gs);
  a.dyn_ld = 2 * int64_t(a.k) * a.G;
  a.dyn_off = int64_t(side) * a.k * a.G;
  DF_CHECK(dyn.ndim == 2 && dyn.shape[0] == a.R && dyn.shape[1] == a.dyn_ld, Internal,
           op << ": dyn " << dyn.shape_str() << ", want [" << a.R << ", " << a.dyn_ld << "]");
  DF_CHECK(base.numel() == size_t(a.k * a.H), Internal, op << ": base " << base.shape_str());
  return a;
}

bool vec_path(const ConvArgs& a, std::initializer_list<const void*> ptrs) {
  bool ok = a.H % 8 == 0 && a.gs >= 8 && a.gs <= 256 && (a.gs & (a.gs - 1)) == 0;
  for (const void* p : ptrs) ok = ok && aligned16(p);
  return ok;
}

}  // namespace

void grouped_conv_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& dyn, int side,
                          const Tensor& base, const ops::GroupedConvSpec& spec) {
  backend_of(ctx);
  const ConvArgs a = check_args("grouped_conv_forward (CUDA)", out, in, dyn, side, base, spec);
  DF_CHECK(out.data != in.data, Internal, "grouped_conv_forward (CUDA): out must not alias in");
  if (a.R == 0 || a.H == 0) return;
  constexpr int kThreads = 256;
  const auto* dy = static_cast<const __nv_bfloat16*>(dyn.data);
  const auto* bp = static_cast<const float*>(base.data);
  if (vec_path(a, {out.data, in.data, base.data})) {
    const unsigned blocks = grid_stride_blocks(ctx, a.R * a.H / 8, kThreads, 8);
    conv_fwd_vec_kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(a, static_cast<uint4*>(out.data),
                                                                 static_cast<const uint4*>(in.data), dy, bp);
  } else {
    const unsigned blocks = grid_stride_blocks(ctx, a.R * a.H, kThreads, 8);
    conv_fwd_scalar_kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(a, static_cast<__nv_bfloat16*>(out.data),
                                                                    static_cast<const __nv_bfloat16*>(in.data), dy, bp);
  }
  DF_CUDA_LAUNCH();
}

void grouped_conv_backward(const Ctx& ctx, const Tensor& din, const Tensor& d_dyn, const Tensor& dbase,
                           const Tensor& dout, const Tensor& in, const Tensor& dyn, int side, const Tensor& base,
                           const ops::GroupedConvSpec& spec) {
  const char* op = "grouped_conv_backward (CUDA)";
  backend_of(ctx);
  const ConvArgs a = check_args(op, dout, in, dyn, side, base, spec);
  DF_CHECK(din.dtype == DType::BF16 && din.numel() == size_t(a.R * a.H), Internal, op << ": din " << din.shape_str());
  DF_CHECK(d_dyn.dtype == DType::BF16 && d_dyn.numel() == size_t(a.R * a.dyn_ld), Internal,
           op << ": d_dyn " << d_dyn.shape_str());
  DF_CHECK(dbase.dtype == DType::F32 && dbase.numel() == size_t(a.k * a.H), Internal, op << ": dbase " << dbase.shape_str());
  DF_CHECK(din.data != dout.data, Internal, op << ": din must not alias dout");
  if (a.R == 0 || a.H == 0) return;
  constexpr int kThreads = 256;
  cudaStream_t st = stream_of(ctx);
  const auto* dy = static_cast<const __nv_bfloat16*>(dyn.data);
  const auto* bp = static_cast<const float*>(base.data);
  auto* ddy = static_cast<__nv_bfloat16*>(d_dyn.data);
  auto* db = static_cast<float*>(dbase.data);
  if (vec_path(a, {din.data, dout.data, in.data, base.data})) {
    const unsigned blocks = grid_stride_blocks(ctx, a.R * a.H / 8, kThreads, 8);
    conv_din_vec_kernel<<<blocks, kThreads, 0, st>>>(a, static_cast<uint4*>(din.data),
                                                     static_cast<const uint4*>(dout.data), dy, bp);
    DF_CUDA_LAUNCH();
    // x: the channel chunks; y: enough row slices for ~4 blocks per SM (each loops over its rows).
    const int64_t gx = (a.H / 8 + kWx - 1) / kWx;
    const int64_t want_y = std::max<int64_t>(1, int64_t(backend_of(ctx).sm_count) * 4 / gx);
    const unsigned gy = unsigned(std::min<int64_t>({want_y, (a.R + kWy - 1) / kWy, 65535}));
    conv_ddyn_dbase_vec_kernel<<<dim3(unsigned(gx), gy), dim3(kWx, kWy), 0, st>>>(
        a, ddy, db, static_cast<const uint4*>(dout.data), static_cast<const uint4*>(in.data));
    DF_CUDA_LAUNCH();
  } else {
    const auto* dop = static_cast<const __nv_bfloat16*>(dout.data);
    const auto* ip = static_cast<const __nv_bfloat16*>(in.data);
    conv_din_scalar_kernel<<<grid_stride_blocks(ctx, a.R * a.H, kThreads, 8), kThreads, 0, st>>>(
        a, static_cast<__nv_bfloat16*>(din.data), dop, dy, bp);
    DF_CUDA_LAUNCH();
    conv_ddyn_scalar_kernel<<<grid_stride_blocks(ctx, a.R * a.k * a.G, kThreads, 8), kThreads, 0, st>>>(a, ddy, dop, ip);
    DF_CUDA_LAUNCH();
    conv_dbase_scalar_kernel<<<grid_stride_blocks(ctx, int64_t(a.k) * a.H, kThreads, 8), kThreads, 0, st>>>(a, db, dop,
                                                                                                            ip);
    DF_CUDA_LAUNCH();
  }
}

}  // namespace dflash::cuda
