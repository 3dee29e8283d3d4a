// The FP8 hidden-state wire's row quantizer (dflash/ops.h): the CPU twins run the host arithmetic of
// dflash/fp8.h (one activation group per row; the per-row dequantization is the per-channel weight one).
#include "core/cuda_entry.h"
#include "dflash/fp8.h"
#include "dflash/ops.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

void check_rows(const char* op, const Ctx& ctx, const Tensor& values, const Tensor& codes, const Tensor& scales) {
  detail::check_tensor(op, "values", values, ctx, 2);
  detail::check_tensor(op, "codes", codes, ctx, 2);
  detail::check_tensor(op, "scales", scales, ctx, 1);
  detail::check_shape(op, "codes", codes, {values.shape[0], values.shape[1]});
  detail::check_shape(op, "scales", scales, {values.shape[0]});
  DF_CHECK(codes.dtype == DType::F8E4M3 && scales.dtype == DType::F32, Internal,
           op << ": codes must be F8E4M3 and scales F32, got " << dtype_name(codes.dtype) << " and "
              << dtype_name(scales.dtype));
}

}  // namespace

void fp8_rows_quantize(const Ctx& ctx, const Tensor& codes, const Tensor& scales, const Tensor& in) {
  constexpr const char* op = "fp8_rows_quantize";
  check_rows(op, ctx, in, codes, scales);
  if (ctx.device == Device::CUDA) return cuda::library_for(op).fp8_rows_quantize(ctx, codes, scales, in);
  detail::check_cpu_dtype(op, "in", in, DType::F32);
  const int64_t N = in.shape[0], H = in.shape[1];
  fp8::quantize_activation_groups(in.ptr<float>(), N, H, H, static_cast<uint8_t*>(codes.data),
                                  static_cast<float*>(scales.data));
}

void fp8_rows_dequantize(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales) {
  constexpr const char* op = "fp8_rows_dequantize";
  check_rows(op, ctx, out, codes, scales);
  if (ctx.device == Device::CUDA) return cuda::library_for(op).fp8_rows_dequantize(ctx, out, codes, scales);
  detail::check_cpu_dtype(op, "out", out, DType::F32);
  fp8::dequantize_weight_channels(static_cast<const uint8_t*>(codes.data), static_cast<const float*>(scales.data),
                                  out.shape[0], out.shape[1], out.ptr<float>());
}

}  // namespace dflash::ops
