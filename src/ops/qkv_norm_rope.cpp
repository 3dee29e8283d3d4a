// The target's attention input from one fused q|k|v GEMM: per token, the nh query heads and the nkv key
// heads get the Qwen3 QK-norm + neox RoPE (the per-head arithmetic of head_norm_rope_forward, shared
// through ops/norm_rope_cpu.h, so the two ops agree bit for bit) and the nkv value heads are copied, each
// into its own contiguous [T, heads, hd] tensor for the attention; the rotary tables are computed once
// per token for both q and k.
#include <cstring>

#include "dflash/ops.h"
#include "ops/norm_rope_cpu.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

void qkv_norm_rope_forward_cpu(float* q, float* k, float* v, const float* qkv, const float* q_norm,
                               const float* k_norm, const int32_t* pos, int64_t T, int64_t nh, int64_t nkv,
                               int64_t hd, RopeSpec rope, float eps) {
  const int rot = rope.rotary_dim, half = rot / 2;
  const size_t row = static_cast<size_t>(nh + 2 * nkv) * hd, q_row = static_cast<size_t>(nh) * hd,
               kv_row = static_cast<size_t>(nkv) * hd;
  detail::RopeTables tab;
  for (int64_t n = 0; n < T; ++n) {
    detail::rope_tables(tab, pos[n], half, rot, rope.theta);
    const float* src = qkv + static_cast<size_t>(n) * row;
    float* qn = q + static_cast<size_t>(n) * q_row;
    float* kn = k + static_cast<size_t>(n) * kv_row;
    for (int64_t h = 0; h < nh; ++h) detail::norm_rope_head(qn + h * hd, src + h * hd, q_norm, tab, hd, rot, eps);
    for (int64_t h = 0; h < nkv; ++h)
      detail::norm_rope_head(kn + h * hd, src + q_row + h * hd, k_norm, tab, hd, rot, eps);
    std::memcpy(v + static_cast<size_t>(n) * kv_row, src + q_row + kv_row, kv_row * sizeof(float));
  }
}

}  // namespace

void qkv_norm_rope_forward(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qkv,
                           const Tensor& q_norm, const Tensor& k_norm, const Tensor& pos, RopeSpec rope, float eps) {
  constexpr const char* op = "qkv_norm_rope_forward";
  detail::check_tensor(op, "q", q, ctx, 3);
  const int64_t T = q.shape[0], nh = q.shape[1], hd = q.shape[2];
  detail::check_tensor(op, "k", k, ctx, 3);
  const int64_t nkv = k.shape[1];
  detail::check_shape(op, "k", k, {T, nkv, hd});
  detail::check_tensor(op, "v", v, ctx, 3);
  detail::check_shape(op, "v", v, {T, nkv, hd});
  detail::check_tensor(op, "qkv", qkv, ctx, 2);
  detail::check_shape(op, "qkv", qkv, {T, (nh + 2 * nkv) * hd});
  detail::check_tensor(op, "q_norm", q_norm, ctx, 1);
  detail::check_shape(op, "q_norm", q_norm, {hd});
  detail::check_tensor(op, "k_norm", k_norm, ctx, 1);
  detail::check_shape(op, "k_norm", k_norm, {hd});
  detail::check_tensor(op, "pos", pos, ctx, 1);
  detail::check_shape(op, "pos", pos, {T});
  DF_CHECK(pos.dtype == DType::I32, Internal, op << ": pos must be I32, got " << dtype_name(pos.dtype));
  rope.rotary_dim = rope.rotary_dim == 0 ? static_cast<int>(hd) : rope.rotary_dim;
  DF_CHECK(rope.rotary_dim > 0 && rope.rotary_dim <= hd && rope.rotary_dim % 2 == 0, Internal,
           op << ": rotary_dim " << rope.rotary_dim << " must be even and in (0, head_dim=" << hd << "]");
  DF_CHECK(hd <= detail::kCpuMaxHeadDim, Internal,
           op << ": head_dim " << hd << " above the supported " << detail::kCpuMaxHeadDim);
  // Every output is written while other heads of the same token are still to be read.
  DF_CHECK(!detail::overlaps(q, qkv) && !detail::overlaps(k, qkv) && !detail::overlaps(v, qkv), Internal,
           op << ": q, k, v must not overlap qkv");
  if (ctx.device == Device::CUDA)
    return cuda::library_for("qkv_norm_rope_forward")
        .qkv_norm_rope_forward(ctx, q, k, v, qkv, q_norm, k_norm, pos, rope, eps);
  detail::check_cpu_dtype(op, "q", q, DType::F32);
  detail::check_cpu_dtype(op, "k", k, DType::F32);
  detail::check_cpu_dtype(op, "v", v, DType::F32);
  detail::check_cpu_dtype(op, "qkv", qkv, DType::F32);
  detail::check_cpu_dtype(op, "q_norm", q_norm, DType::F32);
  detail::check_cpu_dtype(op, "k_norm", k_norm, DType::F32);
  qkv_norm_rope_forward_cpu(q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), qkv.ptr<float>(), q_norm.ptr<float>(),
                            k_norm.ptr<float>(), pos.ptr<int32_t>(), T, nh, nkv, hd, rope, eps);
}

}  // namespace dflash::ops
