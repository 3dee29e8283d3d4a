// One warp per row: the row's 16-byte chunks are spread over the lanes, summed in fp32, then the row is
// read again (from L1/L2, the warp just touched it) to write the normalized output.
#include "rmsnorm.cuh"

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// x may be null (plain RMSNorm); otherwise resid += x is written back first. C % 8 == 0, 16-byte aligned.
__global__ void residual_rmsnorm_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ rstd,
                                        __nv_bfloat16* __restrict__ resid, const __nv_bfloat16* __restrict__ x,
                                        const __nv_bfloat16* __restrict__ w, int64_t rows, int C, float eps) {
  int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  Bf16x8* r = reinterpret_cast<Bf16x8*>(resid + row * C);
  const Bf16x8* xr = x ? reinterpret_cast<const Bf16x8*>(x + row * C) : nullptr;
  int chunks = C / 8;
  float ss = 0.f;
  for (int c = lane; c < chunks; c += 32) {
    float v[8];
    unpack8(r[c], v);
    if (xr) {
      float a[8];
      unpack8(xr[c], a);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] += a[i];
      Bf16x8 s = pack8(v);
      r[c] = s;
      unpack8(s, v);  // the norm sees the rounded residual, as the next layer will
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
  }
  ss = warp_sum(ss);
  float rs = rsqrtf(ss / C + eps);
  if (rstd && lane == 0) rstd[row] = rs;
  const Bf16x8* wr = reinterpret_cast<const Bf16x8*>(w);
  Bf16x8* o = reinterpret_cast<Bf16x8*>(out + row * C);
  for (int c = lane; c < chunks; c += 32) {
    float v[8], g[8];
    unpack8(r[c], v);
    unpack8(wr[c], g);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = v[i] * rs * g[i];
    o[c] = pack8(v);
  }
}

void launch(const Ctx& ctx, const char* op, const Tensor& out, const Tensor& rstd, const Tensor& resid,
            const Tensor& x, const Tensor& w, float eps) {
  backend_of(ctx);
  int C = static_cast<int>(w.numel());
  int64_t rows = static_cast<int64_t>(resid.numel() / (C ? C : 1));
  DF_CHECK(out.dtype == DType::BF16 && resid.dtype == DType::BF16 && w.dtype == DType::BF16 &&
               (x.empty() || x.dtype == DType::BF16),
           Internal, op << ": tensors must be BF16 on the CUDA backend");
  DF_CHECK(C > 0 && C % 8 == 0 && resid.size(-1) == C && out.numel() == resid.numel() &&
               (x.empty() || x.numel() == resid.numel()),
           Internal, op << ": shapes out " << out.shape_str() << " in " << resid.shape_str() << " w " << w.shape_str()
                        << " (C must be a multiple of 8)");
  DF_CHECK(rstd.empty() || (rstd.dtype == DType::F32 && static_cast<int64_t>(rstd.numel()) == rows), Internal,
           op << ": rstd must be F32 [" << rows << "], got " << rstd.shape_str());
  DF_CHECK(aligned16(out.data) && aligned16(resid.data) && aligned16(w.data) && (x.empty() || aligned16(x.data)),
           Internal, op << ": tensors must be 16-byte aligned");
  if (rows == 0) return;
  int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  residual_rmsnorm_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(out.data), rstd.empty() ? nullptr : static_cast<float*>(rstd.data),
      static_cast<__nv_bfloat16*>(resid.data), x.empty() ? nullptr : static_cast<const __nv_bfloat16*>(x.data),
      static_cast<const __nv_bfloat16*>(w.data), rows, C, eps);
  DF_CUDA_LAUNCH();
}

}  // namespace

void rmsnorm_forward(const Ctx& ctx, const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& w,
                     float eps) {
  // With x empty the kernel only reads `in` (passed in the resid slot).
  launch(ctx, "rmsnorm_forward", out, rstd, in, Tensor(), w, eps);
}

void residual_rmsnorm_forward(const Ctx& ctx, const Tensor& resid, const Tensor& out, const Tensor& rstd,
                              const Tensor& x, const Tensor& w, float eps) {
  DF_CHECK(!x.empty(), Internal, "residual_rmsnorm_forward: x is empty");
  launch(ctx, "residual_rmsnorm_forward", out, rstd, resid, x, w, eps);
}

}  // namespace dflash::cuda
