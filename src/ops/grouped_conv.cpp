// DFlash2's grouped dynamic causal convolution, CPU float32 reference (docs/dflash2.md 2.2; contract in
// include/dflash/drafter_ops.h). Rows are N blocks of B; tap j of the row at block offset o reads the row j
// back when j <= o and zero otherwise, so no block ever sees another. Channel c belongs to group
// c / group_size; the dynamic kernel of row t, side s, tap j, group g is dyn[t, s*k*G + j*G + g].
#include <algorithm>
#include <cstring>

#include "dflash/drafter_ops.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

struct ConvDims {
  int64_t R, H, B, k, gs, G, D;  // rows, channels, block, taps, group size, groups, dyn columns (2kG)
};

ConvDims check_conv(const char* op, const Ctx& ctx, const Tensor& in, const Tensor& dyn, int side, const Tensor& base,
                    const GroupedConvSpec& spec) {
  using namespace detail;
  check_tensor(op, "in", in, ctx, 2);
  check_tensor(op, "dyn", dyn, ctx, 2);
  check_tensor(op, "base", base, ctx, 2);
  ConvDims d{};
  d.R = in.shape[0];
  d.H = in.shape[1];
  d.B = spec.block_size;
  d.k = spec.kernel_size;
  d.gs = spec.group_size;
  DF_CHECK(d.B >= 1 && d.k >= 1 && d.k <= d.B && d.gs >= 1 && d.H % d.gs == 0 && d.R % d.B == 0, Internal,
           op << ": block " << d.B << ", taps " << d.k << ", group " << d.gs << " for [" << d.R << ", " << d.H << "]");
  DF_CHECK(side == 0 || side == 1, Internal, op << ": side " << side);
  d.G = d.H / d.gs;
  d.D = 2 * d.k * d.G;
  check_shape(op, "dyn", dyn, {d.R, d.D});
  check_shape(op, "base", base, {d.k, d.H});
  if (ctx.device == Device::CPU)
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"in", &in}, {"dyn", &dyn}, {"base", &base}})
      check_cpu_dtype(op, name, *t, DType::F32);
  return d;
}

// out [R, H] = sum_j (base[j] + dyn[t, side, j, g]) * in[t - j]   (block-local taps)
void conv_forward_cpu(float* out, const float* in, const float* dyn, int side, const float* base, const ConvDims& d) {
  for (int64_t t = 0; t < d.R; ++t) {
    const int64_t taps = std::min<int64_t>(d.k, t % d.B + 1);
    const float* kd = dyn + t * d.D + side * d.k * d.G;
    float* o = out + t * d.H;
    for (int64_t c = 0; c < d.H; ++c) {
      const int64_t g = c / d.gs;
      float acc = 0.f;
      for (int64_t j = 0; j < taps; ++j) acc += (base[j * d.H + c] + kd[j * d.G + g]) * in[(t - j) * d.H + c];
      o[c] = acc;
    }
  }
}

void conv_backward_cpu(float* din, float* d_dyn, float* dbase, const float* dout, const float* in, const float* dyn,
                       int side, const float* base, const ConvDims& d) {
  const int64_t off = side * d.k * d.G;
  for (int64_t t = 0; t < d.R; ++t) {
    const int64_t o = t % d.B;
    // din[t] = sum_j (base[j] + dyn[t+j, side, j]) dout[t+j] over rows t+j of t's block
    float* di = din + t * d.H;
    for (int64_t c = 0; c < d.H; ++c) di[c] = 0.f;
    for (int64_t j = 0; j < d.k && o + j < d.B; ++j) {
      const float* kd = dyn + (t + j) * d.D + off + j * d.G;
      const float* go = dout + (t + j) * d.H;
      for (int64_t c = 0; c < d.H; ++c) di[c] += (base[j * d.H + c] + kd[c / d.gs]) * go[c];
    }
    // d_dyn[t, side, j, g] = sum_{c in g} dout[t, c] in[t-j, c];  dbase[j, c] += dout[t, c] in[t-j, c]
    float* dd = d_dyn + t * d.D + off;
    const float* go = dout + t * d.H;
    for (int64_t j = 0; j < d.k; ++j) {
      float* ddj = dd + j * d.G;
      for (int64_t g = 0; g < d.G; ++g) ddj[g] = 0.f;
      if (j > o) continue;
      const float* x = in + (t - j) * d.H;
      for (int64_t c = 0; c < d.H; ++c) {
        const float p = go[c] * x[c];
        ddj[c / d.gs] += p;
        dbase[j * d.H + c] += p;
      }
    }
  }
}

}  // namespace

void grouped_conv_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& dyn, int side,
                          const Tensor& base, const GroupedConvSpec& spec) {
  constexpr const char* op = "grouped_conv_forward";
  const ConvDims d = check_conv(op, ctx, in, dyn, side, base, spec);
  detail::check_tensor(op, "out", out, ctx, 2);
  detail::check_shape(op, "out", out, {d.R, d.H});
  DF_CHECK(!detail::overlaps(out, in), Internal, op << ": out must not alias in");
  if (ctx.device == Device::CUDA)
    return cuda::library_for("grouped_conv_forward").grouped_conv_forward(ctx, out, in, dyn, side, base, spec);
  detail::check_cpu_dtype(op, "out", out, DType::F32);
  conv_forward_cpu(out.ptr<float>(), in.ptr<float>(), dyn.ptr<float>(), side, base.ptr<float>(), d);
}

void grouped_conv_backward(const Ctx& ctx, const Tensor& din, const Tensor& d_dyn, const Tensor& dbase,
                           const Tensor& dout, const Tensor& in, const Tensor& dyn, int side, const Tensor& base,
                           const GroupedConvSpec& spec) {
  constexpr const char* op = "grouped_conv_backward";
  const ConvDims d = check_conv(op, ctx, in, dyn, side, base, spec);
  using namespace detail;
  check_tensor(op, "din", din, ctx, 2);
  check_tensor(op, "d_dyn", d_dyn, ctx, 2);
  check_tensor(op, "dbase", dbase, ctx, 2);
  check_tensor(op, "dout", dout, ctx, 2);
  check_shape(op, "din", din, {d.R, d.H});
  check_shape(op, "dout", dout, {d.R, d.H});
  check_shape(op, "d_dyn", d_dyn, {d.R, d.D});
  check_shape(op, "dbase", dbase, {d.k, d.H});
  DF_CHECK(!overlaps(din, dout) && !overlaps(din, in), Internal, op << ": din must not alias dout or in");
  if (ctx.device == Device::CUDA)
    return cuda::library_for("grouped_conv_backward")
        .grouped_conv_backward(ctx, din, d_dyn, dbase, dout, in, dyn, side, base, spec);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"din", &din}, {"d_dyn", &d_dyn}, {"dbase", &dbase}, {"dout", &dout}})
    check_cpu_dtype(op, name, *t, DType::F32);
  conv_backward_cpu(din.ptr<float>(), d_dyn.ptr<float>(), dbase.ptr<float>(), dout.ptr<float>(), in.ptr<float>(),
                    dyn.ptr<float>(), side, base.ptr<float>(), d);
}

}  // namespace dflash::ops
