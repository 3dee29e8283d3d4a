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

namespace {

// DFlash2 (tests/data/golden/dflash2-tiny-a: official DFlash2DraftModel forward and a PyTorch selector
// objective, float64; -b is the held-out shape: 3 layers, block 6, 3 taps, groups of 8, no softcap): the
// four objectives' losses, terms and every gradient, the metrics, two AdamW steps on CE + alpha * selector.
dflash::train::DrafterGoldenReport expect_dflash2_case(const std::string& name) {
  auto rep = dflash::train::run_drafter_golden(std::string(DFLASH_TEST_DATA) + "/golden/" + name);
  EXPECT_GT(rep.checks.size(), 150u);
  for (const auto& c : rep.checks) EXPECT_LE(c.err, c.tol) << name << ": " << c.name << " max_abs " << c.max_abs;
  return rep;
}

TEST(DrafterGolden, DFlash2TinyA_ObjectivesGradsMetricsAdamW) { expect_dflash2_case("dflash2-tiny-a"); }
TEST(DrafterGolden, DFlash2TinyB_HeldOutShape) { expect_dflash2_case("dflash2-tiny-b"); }
// The strict objective and the selector schedule (issue 47; SpecForge's _selector_chunk_terms and
// _selector_alpha transcribed in tests/data/golden/gen_golden_dflash2.py; tests/data/golden/README.md).
TEST(DrafterGolden, DFlash2TinyStrict_StrictCandidatesAndSchedule) {
  const auto rep = expect_dflash2_case("dflash2-tiny-strict");
  int schedule = 0;
  for (const auto& c : rep.checks) schedule += c.name.rfind("schedule.", 0) == 0;
  EXPECT_GE(schedule, 8) << "the case's selector_schedule: an alpha and a loss per step";
}

}  // namespace
