// The FP8 hidden-state wire (--hs-dtype fp8, docs/fp8.md "The FP8 wire"): the row quantizer ops
// (ops::fp8_rows_quantize / fp8_rows_dequantize) against fp8.h's cast, their round trip, an all-zero row, and
// the batch layout (HsBatch's fp8 parts, HsCodec's encode -> decode, the smaller slot).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "dflash/fp8.h"
#include "dflash/hs_batch.h"
#include "dflash/hs_wire.h"
#include "dflash/ops.h"

using namespace dflash;

namespace {

std::vector<float> random_rows(int64_t N, int64_t H, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(N * H));
  for (int64_t r = 0; r < N; ++r) {
    const float row_scale = std::exp2(static_cast<float>(r % 9) - 4.f);  // rows of very different magnitudes
    for (int64_t c = 0; c < H; ++c) x[r * H + c] = d(rng) * row_scale;
  }
  return x;
}

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales, back;
};

Quantized quantize(const std::vector<float>& x, int64_t N, int64_t H) {
  Quantized q;
  q.codes.assign(x.size(), 0xAA);
  q.scales.assign(static_cast<size_t>(N), -1.f);
  q.back.assign(x.size(), NAN);
  const Ctx ctx = cpu_ctx();
  const Tensor codes(q.codes.data(), DType::F8E4M3, Device::CPU, {N, H});
  const Tensor scales(q.scales.data(), DType::F32, Device::CPU, {N});
  ops::fp8_rows_quantize(ctx, codes, scales, cpu_view(const_cast<float*>(x.data()), {N, H}));
  ops::fp8_rows_dequantize(ctx, cpu_view(q.back.data(), {N, H}), codes, scales);
  return q;
}

}  // namespace

TEST(Fp8Rows, CodesAreFp8CastOfEachRowOverItsScale) {
  const int64_t N = 37, H = 200;
  const std::vector<float> x = random_rows(N, H, 3);
  const Quantized q = quantize(x, N, H);
  for (int64_t r = 0; r < N; ++r) {
    float amax = 0.f;
    for (int64_t c = 0; c < H; ++c) amax = std::max(amax, std::fabs(x[r * H + c]));
    ASSERT_EQ(q.scales[r], amax / fp8::kE4M3Max) << "row " << r;  // one scale per row: amax / 448
    for (int64_t c = 0; c < H; ++c) {
      ASSERT_EQ(q.codes[r * H + c], fp8::e4m3_from_f32_sat(x[r * H + c] / q.scales[r])) << r << "," << c;
      ASSERT_EQ(q.back[r * H + c], fp8::e4m3_to_f32(q.codes[r * H + c]) * q.scales[r]) << r << "," << c;
    }
  }
  // The row's largest magnitude maps onto 448 exactly.
  const auto big = std::max_element(x.begin(), x.begin() + H, [](float a, float b) { return std::fabs(a) < std::fabs(b); });
  EXPECT_EQ(std::fabs(fp8::e4m3_to_f32(q.codes[static_cast<size_t>(big - x.begin())])), 448.f);
}

TEST(Fp8Rows, RoundTripWithinHalfAnE4m3Step) {
  const int64_t N = 64, H = 256;
  const std::vector<float> x = random_rows(N, H, 11);
  const Quantized q = quantize(x, N, H);
  double err2 = 0, ref2 = 0;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < H; ++c) {
      const float v = x[r * H + c], s = q.scales[r], e = std::fabs(q.back[r * H + c] - v);
      // e4m3 keeps 3 mantissa bits: a normal value is off by at most 2^-4 of itself; below e4m3's smallest
      // normal (2^-6 s) the grid step is 2^-9 s.
      ASSERT_LE(e, std::max(std::fabs(v) * 0.0625f, std::ldexp(s, -10)) * 1.0001f) << r << "," << c;
      err2 += e * e;
      ref2 += static_cast<double>(v) * v;
    }
  const double rel = std::sqrt(err2 / ref2);
  EXPECT_GT(rel, 0.0);   // quantized: not the identity
  EXPECT_LT(rel, 0.04);  // about 2.5 % for normal data
}

TEST(Fp8Rows, AllZeroRowHasScaleZeroAndZeroCodes) {
  const int64_t N = 3, H = 40;
  std::vector<float> x = random_rows(N, H, 5);
  std::fill(x.begin() + H, x.begin() + 2 * H, 0.f);  // row 1
  x[H + 7] = -0.f;
  const Quantized q = quantize(x, N, H);
  EXPECT_EQ(q.scales[1], 0.f);
  for (int64_t c = 0; c < H; ++c) {
    EXPECT_EQ(q.codes[H + c], 0) << c;
    EXPECT_EQ(q.back[H + c], 0.f) << c;
  }
  EXPECT_GT(q.scales[0], 0.f);
  EXPECT_GT(q.scales[2], 0.f);
}

TEST(Fp8Rows, BatchPartsAreSmallerAndCodecRoundTripsThroughThem) {
  SlotShape sh;
  sh.max_tokens = 20;
  sh.num_layers = 3;
  sh.hidden = 36;  // codes of a part not a multiple of 16 bytes: the scales after them are padded into place
  sh.final_norm = true;
  SlotShape f8 = sh;
  f8.wire = HsDType::Fp8;
  EXPECT_EQ(sh.slot_bytes(), static_cast<size_t>(4 * 20 * 36 * 4));
  // fp8: one byte per value + 4 bytes per row, each part's codes padded to 16 bytes.
  EXPECT_EQ(f8.slot_bytes(), static_cast<size_t>((3 * 20 * 36 + 15) / 16 * 16 + 3 * 20 * 4 + (20 * 36 + 15) / 16 * 16 + 20 * 4));
  EXPECT_EQ(f8.wire_bytes_per_token(), 4.0 * (36 + 4));
  EXPECT_EQ(HsCodec::staging_bytes(sh), 0u);
  EXPECT_EQ(HsCodec::staging_bytes(f8), sh.slot_bytes());

  HsBatch send(f8), recv(f8);
  PackedBatch pb;
  const int64_t T = 13;
  pb.tokens.assign(T, 1);
  pb.loss_mask.assign(T, 1);
  pb.cu_seqlens = {0, 5, static_cast<int32_t>(T)};
  send.fill_from(pb);
  EXPECT_EQ(send.feature_part().count, static_cast<size_t>((3 * T * 36 + 15) / 16 * 16 + 3 * T * 4));
  EXPECT_EQ(send.feature_part().dtype, DType::U8);

  const Ctx ctx = cpu_ctx();
  HsCodec target(f8), drafter(f8);
  const HsValues into = target.forward_into(send);
  ASSERT_EQ(into.features.shape[1], T);
  const std::vector<float> x = random_rows(3 * T, 36, 7), n = random_rows(T, 36, 8);
  std::copy(x.begin(), x.end(), into.features.ptr<float>());
  std::copy(n.begin(), n.end(), into.final_norm.ptr<float>());
  target.encode(ctx, send);
  // What a plane does: the parts' bytes, then the header.
  std::copy_n(static_cast<const char*>(send.features.t().data), send.feature_bytes(), static_cast<char*>(recv.features.t().data));
  std::copy_n(static_cast<const char*>(send.final_norm.t().data), send.final_norm_bytes(), static_cast<char*>(recv.final_norm.t().data));
  recv.header = send.header;
  recv.batch = send.batch;
  const HsValues got = drafter.decode(ctx, recv);
  const Quantized qx = quantize(x, 3 * T, 36), qn = quantize(n, T, 36);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got.features.ptr<float>()[i], qx.back[i]) << i;
  for (size_t i = 0; i < n.size(); ++i) ASSERT_EQ(got.final_norm.ptr<float>()[i], qn.back[i]) << i;
  const Fp8Rows rows = recv.final_norm_rows();
  for (int64_t r = 0; r < T; ++r) ASSERT_EQ(rows.scales.ptr<float>()[r], qn.scales[r]) << r;
}
