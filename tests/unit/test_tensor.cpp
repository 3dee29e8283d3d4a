#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "dflash/error.h"
#include "dflash/tensor.h"

using namespace dflash;

TEST(Tensor, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly half way between two bf16 values: round to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(Tensor, F16RoundTrip) {
  for (float v : {0.0f, 1.0f, -3.25f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
}

TEST(Tensor, ViewsAndSlices) {
  Buffer b(Device::CPU, DType::F32, {4, 3});
  EXPECT_EQ(b.numel(), 12u);
  for (int i = 0; i < 12; ++i) b.ptr<float>()[i] = static_cast<float>(i);
  Tensor rows = b.t().slice_rows(1, 3);
  EXPECT_EQ(rows.size(0), 2);
  EXPECT_EQ(rows.ptr<float>()[0], 3.0f);
  EXPECT_EQ(rows.reshape({6}).size(0), 6);
}

TEST(Tensor, WrongDtypeIsAFatalInternalError) {
  Buffer b(Device::CPU, DType::F32, {2});
  EXPECT_EXIT(b.t().ptr<int32_t>(), testing::ExitedWithCode(static_cast<int>(ExitCode::Internal)),
              "read as I32");
}

TEST(Error, FatalPrintsHintAndExitCode) {
  EXPECT_EXIT(fatal(ExitCode::BadInput, "broken thing", "fix it like so"),
              testing::ExitedWithCode(3), "HINT: fix it like so");
}
