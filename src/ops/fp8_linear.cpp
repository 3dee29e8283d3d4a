// The FP8 linear's op entry points (dflash/ops.h): the CPU twins run the host arithmetic of dflash/fp8.h.
#include <utility>
#include <vector>

#include "core/cuda_entry.h"
#include "dflash/backend.h"
#include "dflash/fp8.h"
#include "dflash/ops.h"
#include "ops/op_checks.h"

namespace dflash::ops {

void fp8_activation_qdq(const Ctx& ctx, const Tensor& out, const Tensor& in, int64_t group) {
  constexpr const char* op = "fp8_activation_qdq";
  detail::check_tensor(op, "in", in, ctx, 2);
  detail::check_tensor(op, "out", out, ctx, 2);
  detail::check_shape(op, "out", out, {in.shape[0], in.shape[1]});
  DF_CHECK(group > 0, Internal, op << ": group must be positive, got " << group);
  if (ctx.device == Device::CUDA) return cuda::library_for(op).fp8_activation_qdq(ctx, out, in, group);
  detail::check_cpu_dtype(op, "in", in, DType::F32);
  detail::check_cpu_dtype(op, "out", out, DType::F32);
  fp8::activation_quant_dequant(in.ptr<float>(), in.shape[0], in.shape[1], group, out.ptr<float>());
}

}  // namespace dflash::ops

namespace dflash::ops {

namespace {

// The GEMM's operands (fp8_gemm_forward's contract, fp8_linear_forward's after the quantization).
void check_gemm(const char* op, const Ctx& ctx, const Tensor& out, const Tensor& act_codes, const Tensor& act_scales,
                const Tensor& w_codes, const Tensor& w_scales, Accumulate acc, const Tensor& residual,
                Fp8Scaling scaling) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"out", &out}, {"w_codes", &w_codes},
                                {"w_scales", &w_scales}, {"act_codes", &act_codes}, {"act_scales", &act_scales}})
    detail::check_tensor(op, name, *t, ctx, 2);
  const int64_t N = act_codes.shape[0], K = act_codes.shape[1], O = w_codes.shape[0];
  // Scales per row along K: ceil(K/128) groups (Block128) or one (TokenChannel: a token's, a channel's).
  const int64_t KB = scaling == Fp8Scaling::TokenChannel ? 1 : fp8::blocks(K, fp8::kBlock);
  detail::check_shape(op, "w_codes", w_codes, {O, K});
  detail::check_shape(op, "w_scales", w_scales, {KB, O});
  detail::check_shape(op, "out", out, {N, O});
  detail::check_shape(op, "act_scales", act_scales, {KB, N});
  DF_CHECK(w_codes.dtype == DType::F8E4M3 && act_codes.dtype == DType::F8E4M3 && w_scales.dtype == DType::F32 &&
               act_scales.dtype == DType::F32,
           Internal, op << ": codes must be F8E4M3 and scales F32");
  if (!residual.empty()) {
    detail::check_tensor(op, "residual", residual, ctx, 2);
    detail::check_shape(op, "residual", residual, {N, O});
    DF_CHECK(acc == Accumulate::No, Internal, op << ": a residual replaces Accumulate::Yes, not both");
  }
  if (ctx.device == Device::CPU) detail::check_cpu_dtype(op, "out", out, DType::F32);
}

}  // namespace

void fp8_linear_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& w_codes,
                        const Tensor& w_scales, const Tensor& act_codes, const Tensor& act_scales, Accumulate acc,
                        const Tensor& residual, Fp8Scaling scaling) {
  constexpr const char* op = "fp8_linear_forward";
  detail::check_tensor(op, "in", in, ctx, 2);
  detail::check_tensor(op, "act_codes", act_codes, ctx, 2);
  detail::check_shape(op, "act_codes", act_codes, {in.shape[0], in.shape[1]});
  check_gemm(op, ctx, out, act_codes, act_scales, w_codes, w_scales, acc, residual, scaling);
  if (ctx.device == Device::CUDA)
    return cuda::library_for(op).fp8_linear_forward(ctx, out, in, w_codes, w_scales, act_codes, act_scales, acc,
                                                    residual, scaling);
  detail::check_cpu_dtype(op, "in", in, DType::F32);
  const int64_t N = in.shape[0], K = in.shape[1];
  const bool per_token = scaling == Fp8Scaling::TokenChannel;
  const int64_t KB = per_token ? 1 : fp8::blocks(K, fp8::kBlock), group = per_token ? K : fp8::kBlock;
  // The activations: codes and row-major [N, KB] scales, then transposed into the kb-major layout.
  std::vector<float> row_scales(static_cast<size_t>(N * KB));
  fp8::quantize_activation_groups(in.ptr<float>(), N, K, group, static_cast<uint8_t*>(act_codes.data),
                                  row_scales.data());
  float* as = static_cast<float*>(act_scales.data);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t kb = 0; kb < KB; ++kb) as[kb * N + n] = row_scales[n * KB + kb];
  fp8_gemm_forward(ctx, out, act_codes, act_scales, w_codes, w_scales, acc, residual, scaling);
}

void fp8_gemm_forward(const Ctx& ctx, const Tensor& out, const Tensor& act_codes, const Tensor& act_scales,
                      const Tensor& w_codes, const Tensor& w_scales, Accumulate acc, const Tensor& residual,
                      Fp8Scaling scaling) {
  constexpr const char* op = "fp8_gemm_forward";
  check_gemm(op, ctx, out, act_codes, act_scales, w_codes, w_scales, acc, residual, scaling);
  if (ctx.device == Device::CUDA)
    return cuda::library_for(op).fp8_gemm_forward(ctx, out, act_codes, act_scales, w_codes, w_scales, acc,
                                                  residual, scaling);
  const int64_t N = act_codes.shape[0], K = act_codes.shape[1], O = w_codes.shape[0];
  const bool per_token = scaling == Fp8Scaling::TokenChannel;
  const int64_t group = per_token ? K : fp8::kBlock;
  // Both operands dequantized to fp32, then the float32 GEMM: the reference the CUDA GEMM is held to.
  const uint8_t* codes = static_cast<const uint8_t*>(act_codes.data);
  const float* as = act_scales.ptr<float>();
  std::vector<float> x(static_cast<size_t>(N * K)), w(static_cast<size_t>(O * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) x[n * K + k] = fp8::e4m3_to_f32(codes[n * K + k]) * as[(k / group) * N + n];
  if (per_token)  // w_scales [1, O]: one scale per output channel
    fp8::dequantize_weight_channels(static_cast<const uint8_t*>(w_codes.data), w_scales.ptr<float>(), O, K, w.data());
  else
    fp8_weight_dequantize(ctx, cpu_view(w.data(), {O, K}), w_codes, w_scales);
  if (!residual.empty()) {
    if (residual.data != out.data) copy_tensor(ctx, out, residual);
    acc = Accumulate::Yes;
  }
  matmul_forward(ctx, out, cpu_view(x.data(), {N, K}), cpu_view(w.data(), {O, K}), acc);
}

bool fp8_block_gemm_available(const Ctx& ctx) {
  if (ctx.device != Device::CUDA) return false;
  return cuda::library_for("fp8_block_gemm_available").fp8_block_gemm_available(ctx);
}

bool fp8_token_gemm_available(const Ctx& ctx) {
  if (ctx.device != Device::CUDA) return false;
  return cuda::library_for("fp8_token_gemm_available").fp8_token_gemm_available(ctx);
}

}  // namespace dflash::ops
