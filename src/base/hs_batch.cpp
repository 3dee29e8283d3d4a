// HsBatch: include/dflash/hs_batch.h.
#include "dflash/hs_batch.h"

#include <algorithm>

#include "dflash/error.h"

namespace dflash {

HsBatch::HsBatch(const SlotShape& s) : shape(s) {
  DF_CHECK(s.max_tokens > 0 && s.num_layers > 0 && s.hidden > 0, Internal,
           "hidden-state batch of " << s.max_tokens << " tokens x " << s.num_layers << " layers x " << s.hidden);
  features = Buffer(s.device, s.dtype, {s.num_layers, s.max_tokens, s.hidden});
  if (s.final_norm) final_norm = Buffer(s.device, s.dtype, {s.max_tokens, s.hidden});
  batch.tokens.reserve(static_cast<size_t>(s.max_tokens));
  batch.cu_seqlens.reserve(static_cast<size_t>(s.max_tokens) + 1);
  batch.loss_mask.reserve(static_cast<size_t>(s.max_tokens));
  clear();
}

void HsBatch::clear() {
  batch.tokens.resize(static_cast<size_t>(shape.max_tokens));
  batch.cu_seqlens.resize(static_cast<size_t>(shape.max_tokens) + 1);
  batch.loss_mask.resize(static_cast<size_t>(shape.max_tokens));
}

void HsBatch::fill_from(const PackedBatch& b) {
  const int64_t T = b.num_tokens();
  DF_CHECK(T > 0 && T <= shape.max_tokens, Internal, "a batch of " << T << " tokens for buffers of " << shape.max_tokens);
  batch.tokens.assign(b.tokens.begin(), b.tokens.end());  // within the reserved capacity: no allocation
  batch.cu_seqlens.assign(b.cu_seqlens.begin(), b.cu_seqlens.end());
  batch.loss_mask.assign(b.loss_mask.begin(), b.loss_mask.end());
  header.num_tokens = T;
  header.num_seqs = b.num_seqs();
  header.num_layers = shape.num_layers;
  header.hidden = shape.hidden;
  header.has_final_norm = shape.final_norm ? 1 : 0;
}

void HsBatch::set_filled() {
  const BatchHeader& h = header;
  DF_CHECK(h.num_tokens > 0 && h.num_tokens <= shape.max_tokens && h.num_seqs >= 1 && h.num_seqs <= h.num_tokens &&
               h.num_layers == shape.num_layers && h.hidden == shape.hidden && h.has_final_norm == (shape.final_norm ? 1 : 0),
           Internal, "batch header (" << h.num_tokens << " tokens, " << h.num_seqs << " sequences, " << h.num_layers
                                      << " layers x " << h.hidden << ") does not fit this slot");
  batch.tokens.resize(static_cast<size_t>(h.num_tokens));
  batch.cu_seqlens.resize(static_cast<size_t>(h.num_seqs) + 1);
  batch.loss_mask.resize(static_cast<size_t>(h.num_tokens));
}

Tensor HsBatch::features_view() const {
  Tensor t = features.t();
  return Tensor(t.data, t.dtype, t.device, {shape.num_layers, header.num_tokens, shape.hidden});
}

Tensor HsBatch::final_norm_view() const {
  if (!shape.final_norm) return Tensor();
  Tensor t = final_norm.t();
  return Tensor(t.data, t.dtype, t.device, {header.num_tokens, shape.hidden});
}

}  // namespace dflash
