// The drafter against the golden reference (tests/data/golden/qwen3-tiny-a: official DFlashDraftModel,
// float64): losses and metrics to 1e-5, every gradient and the weights after two AdamW steps to 1e-4.
#include <gtest/gtest.h>

#include "drafter/drafter_golden.h"

namespace {

TEST(DrafterGolden, QwenTinyA_LossesMetricsGradsAdamW) {
  const auto rep = dflash::train::run_drafter_golden(std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a");
  // every tensor of the drafter is covered: 2 objectives x params + after2 x params + scalars
  EXPECT_GT(rep.checks.size(), 60u);
  for (const auto& c : rep.checks) EXPECT_LE(c.err, c.tol) << c.name;
}

}  // namespace
