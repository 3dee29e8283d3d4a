// HsCodec: include/dflash/hs_wire.h.
#include "dflash/error.h"
#include "dflash/hs_wire.h"
#include "dflash/ops.h"

namespace dflash {

HsCodec::HsCodec(const SlotShape& shape) : shape_(shape) {
  if (shape.wire != HsDType::Fp8) return;
  features_ = Buffer(shape.device, shape.dtype, {shape.num_layers, shape.max_tokens, shape.hidden});
  if (shape.final_norm) final_norm_ = Buffer(shape.device, shape.dtype, {shape.max_tokens, shape.hidden});
}

size_t HsCodec::staging_bytes(const SlotShape& shape) {
  if (shape.wire != HsDType::Fp8) return 0;
  return shape.value_bytes(shape.max_tokens);
}

HsValues HsCodec::staging_view(int64_t tokens) const {
  const int64_t k = shape_.num_layers, H = shape_.hidden;
  HsValues v;
  v.features = Tensor(features_.t().data, shape_.dtype, shape_.device, {k, tokens, H});
  if (shape_.final_norm) v.final_norm = Tensor(final_norm_.t().data, shape_.dtype, shape_.device, {tokens, H});
  return v;
}

HsValues HsCodec::forward_into(HsBatch& b) {
  if (shape_.wire == HsDType::Backend) return {b.features_view(), b.final_norm_view()};
  return staging_view(b.num_tokens());
}

void HsCodec::encode(const Ctx& ctx, HsBatch& b) {
  if (shape_.wire == HsDType::Backend) return;
  const HsValues v = staging_view(b.num_tokens());
  const int64_t H = shape_.hidden;
  const Fp8Rows f = b.feature_rows();
  ops::fp8_rows_quantize(ctx, f.codes, f.scales, v.features.reshape({f.codes.shape[0], H}));
  if (!shape_.final_norm) return;
  const Fp8Rows n = b.final_norm_rows();
  ops::fp8_rows_quantize(ctx, n.codes, n.scales, v.final_norm);
}

HsValues HsCodec::decode(const Ctx& ctx, const HsBatch& b) {
  if (shape_.wire == HsDType::Backend) return {b.features_view(), b.final_norm_view()};
  const HsValues v = staging_view(b.num_tokens());
  const int64_t H = shape_.hidden;
  const Fp8Rows f = b.feature_rows();
  ops::fp8_rows_dequantize(ctx, v.features.reshape({f.codes.shape[0], H}), f.codes, f.scales);
  if (shape_.final_norm) {
    const Fp8Rows n = b.final_norm_rows();
    ops::fp8_rows_dequantize(ctx, v.final_norm, n.codes, n.scales);
  }
  return v;
}

}  // namespace dflash
