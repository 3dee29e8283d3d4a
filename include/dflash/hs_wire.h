// The two ends of the hidden-state wire (--hs-dtype, docs/fp8.md "The FP8 wire"): where a target's forward
// writes a batch's features and where a drafter's step reads them, whatever form they travel in.
//
// --hs-dtype bf16 (HsDType::Backend): the batch's own tensors; the forward writes straight into the send
// buffer and the drafter trains straight from the slot, as before the FP8 wire existed (no copy).
// --hs-dtype fp8: one batch of the backend's dtype this end owns (HsCodec's staging, allocated once for
// max_tokens): the forward writes there and encode() quantizes it into the send buffer (ops::fp8_rows_quantize,
// one scale per token row); decode() dequantizes a received slot there (ops::fp8_rows_dequantize). Both are
// enqueued on the caller's stream, so the forward before and the step after are ordered with them, and the
// next forward (or decode) into the staging follows the last one's encode (or step) on the same stream.
#pragma once
#include "dflash/hs_batch.h"
#include "dflash/tensor.h"

namespace dflash {

// A batch's features as the forward writes them and the drafter reads them: [k, T, H] and [T, H] (or empty)
// of the backend's dtype, on the batch's device.
struct HsValues {
  Tensor features;
  Tensor final_norm;
};

class HsCodec {
 public:
  explicit HsCodec(const SlotShape& shape);
  HsCodec(const HsCodec&) = delete;
  HsCodec& operator=(const HsCodec&) = delete;

  // Target: where the forward of send buffer b (filled: b.header.num_tokens set) writes.
  HsValues forward_into(HsBatch& b);
  // Target, after that forward: puts its values into b as they travel (fp8: quantizes; bf16: nothing to do).
  void encode(const Ctx& ctx, HsBatch& b);
  // Drafter: the values of received batch b (fp8: dequantized into the staging, valid until the next decode).
  HsValues decode(const Ctx& ctx, const HsBatch& b);
  // Device bytes this end holds beyond the slots (the fp8 staging; 0 on the bf16 wire): --dry-run counts it.
  static size_t staging_bytes(const SlotShape& shape);

 private:
  HsValues staging_view(int64_t tokens) const;
  SlotShape shape_;
  Buffer features_, final_norm_;  // the fp8 wire's staging
};

}  // namespace dflash
