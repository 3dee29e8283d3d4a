// An FP8 linear's weight dequantized for an ordinary GEMM (dflash/ops.h, LinearMode::Fp8Dequant in
// docs/fp8.md): the CPU twin is the host arithmetic of dflash/fp8.h -- e4m3_to_f32(code) * scale, one fp32
// multiply -- over the kb-major scale layout fp8_linear_forward's w_scales use.
#include "core/cuda_entry.h"
#include "dflash/fp8.h"
#include "dflash/ops.h"
#include "ops/op_checks.h"

namespace dflash::ops {

void fp8_weight_dequantize(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales) {
  constexpr const char* op = "fp8_weight_dequantize";
  detail::check_tensor(op, "out", out, ctx, 2);
  detail::check_tensor(op, "codes", codes, ctx, 2);
  detail::check_tensor(op, "scales", scales, ctx, 2);
  const int64_t O = codes.shape[0], K = codes.shape[1];
  detail::check_shape(op, "out", out, {O, K});
  detail::check_shape(op, "scales", scales, {fp8::blocks(K, fp8::kBlock), O});
  DF_CHECK(codes.dtype == DType::F8E4M3 && scales.dtype == DType::F32, Internal,
           op << ": codes must be F8E4M3 and scales F32, got " << dtype_name(codes.dtype) << " and "
              << dtype_name(scales.dtype));
  if (ctx.device == Device::CUDA) return cuda::library_for(op).fp8_weight_dequantize(ctx, out, codes, scales);
  detail::check_cpu_dtype(op, "out", out, DType::F32);
  const uint8_t* q = static_cast<const uint8_t*>(codes.data);
  const float* s = static_cast<const float*>(scales.data);
  float* w = out.ptr<float>();
  for (int64_t o = 0; o < O; ++o)
    for (int64_t k = 0; k < K; ++k) w[o * K + k] = fp8::e4m3_to_f32(q[o * K + k]) * s[(k / fp8::kBlock) * O + o];
}

}  // namespace dflash::ops
