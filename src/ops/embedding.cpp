// Token embedding lookup on the CPU backend.
#include <cstring>

#include "dflash/ops.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

void embedding_forward_cpu(float* out, const int32_t* tokens, const float* table, int64_t T, int64_t V, int64_t H) {
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = tokens[t];
    DF_CHECK(id >= 0 && id < V, BadInput,
             "token id " << id << " at position " << t << " is outside the vocabulary [0, " << V << ")");
    std::memcpy(out + static_cast<size_t>(t) * H, table + static_cast<size_t>(id) * H, sizeof(float) * H);
  }
}

}  // namespace

void embedding_forward(const Ctx& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table) {
  constexpr const char* op = "embedding_forward";
  detail::check_tensor(op, "out", out, ctx, 2);
  detail::check_tensor(op, "tokens", tokens, ctx, 1);
  detail::check_tensor(op, "table", table, ctx, 2);
  const int64_t T = tokens.shape[0], V = table.shape[0], H = table.shape[1];
  detail::check_shape(op, "out", out, {T, H});
  DF_CHECK(tokens.dtype == DType::I32, Internal, op << ": tokens must be I32, got " << dtype_name(tokens.dtype));
  if (ctx.device == Device::CUDA)
    return cuda::library_for("embedding_forward").embedding_forward(ctx, out, tokens, table);
  detail::check_cpu_dtype(op, "out", out, DType::F32);
  detail::check_cpu_dtype(op, "table", table, DType::F32);
  embedding_forward_cpu(out.ptr<float>(), tokens.ptr<int32_t>(), table.ptr<float>(), T, V, H);
}

}  // namespace dflash::ops
