// SwiGLU activation: out = silu(gate) * up, silu(g) = g * sigmoid(g); swiglu_fused_forward reads gate and
// up as the two column halves of one fused gate|up GEMM's output.
#include <cmath>
#include <vector>

#include "dflash/fp8.h"
#include "dflash/ops.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

void swiglu_forward_cpu(float* out, const float* gate, const float* up, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

// gate_up [N, 2I] -> out [N, I], row by row with the same arithmetic as swiglu_forward_cpu.
void swiglu_fused_forward_cpu(float* out, const float* gate_up, int64_t N, int64_t I) {
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gate_up + static_cast<size_t>(n) * 2 * I;
    swiglu_forward_cpu(out + static_cast<size_t>(n) * I, g, g + I, static_cast<size_t>(I));
  }
}

// d/dg [g s(g)] = s (1 + g (1 - s))
void swiglu_backward_cpu(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                         size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i], s = sigmoid(g);
    dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = dout[i] * g * s;
  }
}

// Every tensor is [N, I] like `gate` (checked first, so its shape can be trusted).
void check_same_2d(const char* op, const Ctx& ctx, const Tensor& gate, std::initializer_list<const Tensor*> ts,
                   std::initializer_list<const char*> names) {
  detail::check_tensor(op, "gate", gate, ctx, 2);
  auto name = names.begin();
  for (const Tensor* t : ts) {
    detail::check_tensor(op, *name, *t, ctx, 2);
    detail::check_shape(op, *name, *t, {gate.shape[0], gate.shape[1]});
    if (ctx.device == Device::CPU) detail::check_cpu_dtype(op, *name, *t, DType::F32);
    ++name;
  }
}

}  // namespace

void swiglu_forward(const Ctx& ctx, const Tensor& out, const Tensor& gate, const Tensor& up) {
  constexpr const char* op = "swiglu_forward";
  check_same_2d(op, ctx, gate, {&out, &gate, &up}, {"out", "gate", "up"});
  if (ctx.device == Device::CUDA) return cuda::library_for("swiglu_forward").swiglu_forward(ctx, out, gate, up);
  swiglu_forward_cpu(out.ptr<float>(), gate.ptr<float>(), up.ptr<float>(), gate.numel());
}

void swiglu_fused_forward(const Ctx& ctx, const Tensor& out, const Tensor& gate_up) {
  constexpr const char* op = "swiglu_fused_forward";
  detail::check_tensor(op, "out", out, ctx, 2);
  const int64_t N = out.shape[0], I = out.shape[1];
  detail::check_tensor(op, "gate_up", gate_up, ctx, 2);
  detail::check_shape(op, "gate_up", gate_up, {N, 2 * I});
  // A row of out is written while later rows of gate_up are still to be read.
  DF_CHECK(!detail::overlaps(out, gate_up), Internal, op << ": out must not overlap gate_up");
  if (ctx.device == Device::CUDA)
    return cuda::library_for("swiglu_fused_forward").swiglu_fused_forward(ctx, out, gate_up);
  detail::check_cpu_dtype(op, "out", out, DType::F32);
  detail::check_cpu_dtype(op, "gate_up", gate_up, DType::F32);
  swiglu_fused_forward_cpu(out.ptr<float>(), gate_up.ptr<float>(), N, I);
}

void swiglu_fp8_forward(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales,
                        const Tensor& gate_up) {
  constexpr const char* op = "swiglu_fp8_forward";
  detail::check_tensor(op, "codes", codes, ctx, 2);
  const int64_t N = codes.shape[0], I = codes.shape[1];
  detail::check_tensor(op, "gate_up", gate_up, ctx, 2);
  detail::check_shape(op, "gate_up", gate_up, {N, 2 * I});
  detail::check_tensor(op, "scales", scales, ctx, 1);
  detail::check_shape(op, "scales", scales, {N});
  DF_CHECK(codes.dtype == DType::F8E4M3 && scales.dtype == DType::F32, Internal,
           op << ": codes must be F8E4M3 and scales F32");
  if (!out.empty()) {
    detail::check_tensor(op, "out", out, ctx, 2);
    detail::check_shape(op, "out", out, {N, I});
    DF_CHECK(!detail::overlaps(out, gate_up), Internal, op << ": out must not overlap gate_up");
  }
  if (ctx.device == Device::CUDA) return cuda::library_for(op).swiglu_fp8_forward(ctx, out, codes, scales, gate_up);
  detail::check_cpu_dtype(op, "gate_up", gate_up, DType::F32);
  if (!out.empty()) detail::check_cpu_dtype(op, "out", out, DType::F32);
  // The reference: the activation, then the row quantizer's host arithmetic over it.
  std::vector<float> own(out.empty() ? static_cast<size_t>(N * I) : 0);
  float* a = out.empty() ? own.data() : out.ptr<float>();
  swiglu_fused_forward_cpu(a, gate_up.ptr<float>(), N, I);
  fp8::quantize_activation_groups(a, N, I, I, static_cast<uint8_t*>(codes.data), scales.ptr<float>());
}

void swiglu_backward(const Ctx& ctx, const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  constexpr const char* op = "swiglu_backward";
  check_same_2d(op, ctx, gate, {&dgate, &dup, &dout, &gate, &up}, {"dgate", "dup", "dout", "gate", "up"});
  // No CUDA twin through the op layer: the CUDA drafter step calls cuda::swiglu_backward
  // (src/drafter/cuda/drafter_backward.cu) itself.
  if (ctx.device == Device::CUDA) detail::cuda_op_missing(op);
  swiglu_backward_cpu(dgate.ptr<float>(), dup.ptr<float>(), dout.ptr<float>(), gate.ptr<float>(), up.ptr<float>(),
                      gate.numel());
}

}  // namespace dflash::ops
