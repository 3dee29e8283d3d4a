// HsBatch: include/dflash/hs_batch.h.
#include "dflash/hs_batch.h"

#include <algorithm>

#include "dflash/error.h"

namespace dflash {

namespace {

// An fp8 part of `rows` rows of H: the codes, padded so the float32 scales after them are aligned.
constexpr size_t kScaleAlign = 16;
size_t codes_bytes(int64_t rows, int64_t H) {
  const size_t n = static_cast<size_t>(rows * H);
  return (n + kScaleAlign - 1) / kScaleAlign * kScaleAlign;
}
size_t fp8_part_bytes(int64_t rows, int64_t H) { return codes_bytes(rows, H) + static_cast<size_t>(rows) * sizeof(float); }

Fp8Rows fp8_rows_of(const Buffer& b, int64_t rows, int64_t H) {
  if (b.t().empty()) return {};
  char* base = static_cast<char*>(b.t().data);
  return {Tensor(base, DType::F8E4M3, b.t().device, {rows, H}),
          Tensor(base + codes_bytes(rows, H), DType::F32, b.t().device, {rows})};
}

}  // namespace

const char* hs_dtype_name(HsDType d) { return d == HsDType::Fp8 ? "fp8" : "bf16"; }

size_t SlotShape::wire_bytes(int64_t tokens) const {
  if (wire == HsDType::Fp8)
    return fp8_part_bytes(num_layers * tokens, hidden) + (final_norm ? fp8_part_bytes(tokens, hidden) : 0);
  return value_bytes(tokens);
}

double SlotShape::wire_bytes_per_token() const {
  const double per_row = wire == HsDType::Fp8 ? static_cast<double>(hidden) + sizeof(float)
                                              : static_cast<double>(hidden) * static_cast<double>(dtype_size(dtype));
  return static_cast<double>(rows(1)) * per_row;
}

const char* SlotShape::wire_name() const {
  return wire == HsDType::Fp8 ? "fp8" : dtype == DType::BF16 ? "bf16" : "f32";
}

HsBatch::HsBatch(const SlotShape& s) : shape(s) {
  DF_CHECK(s.max_tokens > 0 && s.num_layers > 0 && s.hidden > 0, Internal,
           "hidden-state batch of " << s.max_tokens << " tokens x " << s.num_layers << " layers x " << s.hidden);
  if (s.wire == HsDType::Fp8) {
    features = Buffer(s.device, DType::U8, {static_cast<int64_t>(fp8_part_bytes(s.num_layers * s.max_tokens, s.hidden))});
    if (s.final_norm) final_norm = Buffer(s.device, DType::U8, {static_cast<int64_t>(fp8_part_bytes(s.max_tokens, s.hidden))});
  } else {
    features = Buffer(s.device, s.dtype, {s.num_layers, s.max_tokens, s.hidden});
    if (s.final_norm) final_norm = Buffer(s.device, s.dtype, {s.max_tokens, s.hidden});
  }
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
  DF_ASSERT(shape.wire == HsDType::Backend);
  Tensor t = features.t();
  return Tensor(t.data, t.dtype, t.device, {shape.num_layers, header.num_tokens, shape.hidden});
}

Tensor HsBatch::final_norm_view() const {
  if (!shape.final_norm) return Tensor();
  DF_ASSERT(shape.wire == HsDType::Backend);
  Tensor t = final_norm.t();
  return Tensor(t.data, t.dtype, t.device, {header.num_tokens, shape.hidden});
}

Fp8Rows HsBatch::feature_rows() const {
  DF_ASSERT(shape.wire == HsDType::Fp8);
  return fp8_rows_of(features, shape.num_layers * header.num_tokens, shape.hidden);
}

Fp8Rows HsBatch::final_norm_rows() const {
  DF_ASSERT(shape.wire == HsDType::Fp8);
  return shape.final_norm ? fp8_rows_of(final_norm, header.num_tokens, shape.hidden) : Fp8Rows{};
}

WirePart HsBatch::feature_part() const {
  if (shape.wire == HsDType::Fp8)
    return {features.t().data, DType::U8, fp8_part_bytes(shape.num_layers * header.num_tokens, shape.hidden)};
  return {features.t().data, shape.dtype, static_cast<size_t>(shape.num_layers * header.num_tokens * shape.hidden)};
}

WirePart HsBatch::final_norm_part() const {
  if (!shape.final_norm) return {final_norm.t().data, features.t().dtype, 0};
  if (shape.wire == HsDType::Fp8) return {final_norm.t().data, DType::U8, fp8_part_bytes(header.num_tokens, shape.hidden)};
  return {final_norm.t().data, shape.dtype, static_cast<size_t>(header.num_tokens * shape.hidden)};
}

WirePart HsBatch::feature_capacity() const { return {features.t().data, features.t().dtype, features.numel()}; }

WirePart HsBatch::final_norm_capacity() const {
  return {final_norm.t().data, features.t().dtype, shape.final_norm ? final_norm.numel() : 0};
}

}  // namespace dflash
