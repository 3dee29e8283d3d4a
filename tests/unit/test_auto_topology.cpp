// The what-if model (auto_topology.h): the arithmetic of the report's scenarios (tests/report/), the
// allreduce scaling, tie-breaking, power budgets. The Python twin is checked against the same numbers by
// tests/e2e/test_report_scenarios.sh, which also compares both models row by row.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dflash/auto_topology.h"

namespace dflash {
namespace {

const SplitPrediction& row(const std::vector<SplitPrediction>& preds, const std::string& split) {
  for (const SplitPrediction& p : preds)
    if (p.split() == split) return p;
  ADD_FAILURE() << "no row " << split;
  return preds.front();
}

// Scenario 2: 7-1 target-bound at 34.7 Ktok/s; targets 600 W, drafter 520 W, idle 85 W.
RoleMeasurements scenario2() {
  RoleMeasurements m;
  m.gpus_per_node = 8;
  m.tokens_per_batch = 32768;
  m.target_s_per_batch = 7.0 / (34.7e3 / 32768.0);  // 7 targets together make 34.7 Ktok/s
  m.drafter_s_per_batch = 0.8 / (34.7e3 / 32768.0); // the drafter could take 25% more
  m.power_target_w = 600;
  m.power_drafter_w = 520;
  m.power_idle_w = 85;
  m.remaining_tokens = 34.7e3 * 3600;  // one hour at 7-1
  return m;
}

TEST(AutoTopology, RingAllreduceFactor) {
  EXPECT_DOUBLE_EQ(ring_allreduce_factor(1), 0.0);
  EXPECT_DOUBLE_EQ(ring_allreduce_factor(2), 1.0);
  EXPECT_DOUBLE_EQ(ring_allreduce_factor(4), 1.5);
  EXPECT_DOUBLE_EQ(ring_allreduce_factor(8), 1.75);
}

TEST(AutoTopology, Scenario2IdlingTargetsSavesPower) {
  const RoleMeasurements m = scenario2();
  const auto preds = predict_all_splits(m);
  EXPECT_EQ(preds.size(), 28u);  // T + D <= 8, both >= 1
  const SplitPrediction &p71 = row(preds, "7-1"), &p61 = row(preds, "6-1"), &p51 = row(preds, "5-1");
  EXPECT_NEAR(p71.ktok_per_s, 34.7, 1e-9);
  EXPECT_EQ(p71.limit, SplitLimit::Target);
  EXPECT_NEAR(p61.ktok_per_s, 6 * 34.7 / 7, 1e-9);  // 29.74
  EXPECT_NEAR(p51.ktok_per_s, 5 * 34.7 / 7, 1e-9);  // 24.79
  EXPECT_NEAR(*p71.power_w, 7 * 600 + 520, 1e-9);
  EXPECT_NEAR(*p71.power_w - *p61.power_w, 515, 1e-9);
  EXPECT_NEAR(*p71.power_w - *p51.power_w, 1030, 1e-9);
  EXPECT_NEAR(*p61.ktok_per_kw, p61.ktok_per_s / 4.205, 1e-9);
  EXPECT_NEAR(*p71.eta_s, 3600, 1e-6);
  EXPECT_EQ(best_split(preds)->split(), "7-1");
  EXPECT_EQ(best_split(preds, 4500.0)->split(), "6-1");
  EXPECT_EQ(best_split(preds, 4000.0)->split(), "5-1");
  EXPECT_FALSE(best_split(preds, 500.0).has_value());
}

TEST(AutoTopology, Scenario1SixTargetsCannotFeedTwoDrafters) {
  RoleMeasurements m;
  m.gpus_per_node = 8;
  m.tokens_per_batch = 32768;
  m.target_s_per_batch = 7 / 0.92;   // targets busy all the time at 0.92 b/s together
  m.drafter_s_per_batch = 1 / 0.86;  // the drafter, busy all the time, trains 0.86 b/s
  const auto preds = predict_all_splits(m);
  EXPECT_NEAR(row(preds, "7-1").batches_per_s, 0.86, 1e-9);
  EXPECT_EQ(row(preds, "7-1").limit, SplitLimit::Drafter);
  EXPECT_NEAR(row(preds, "6-2").batches_per_s, 6 * 0.92 / 7, 1e-9);  // 0.789
  EXPECT_EQ(row(preds, "6-2").limit, SplitLimit::Target);
  EXPECT_EQ(best_split(preds)->split(), "7-1");
  EXPECT_FALSE(row(preds, "7-1").power_w.has_value());  // no power measured: none predicted
  EXPECT_FALSE(best_split(preds, 1e9).has_value());      // so no split is known to fit a budget
}

TEST(AutoTopology, AllreduceScalesWithRingFactorAcrossNodes) {
  RoleMeasurements m;
  m.gpus_per_node = 8;
  m.nodes = 2;
  m.tokens_per_batch = 1000;
  m.target_s_per_batch = 6.0;
  m.drafter_s_per_batch = 1.5;
  m.allreduce_coeff_s = 0.1;
  const SplitPrediction p71 = predict_split(m, 7, 1), p53 = predict_split(m, 5, 3);
  EXPECT_NEAR(p71.allreduce_s_per_batch, 0.1, 1e-12);  // 2 drafters in all: factor 1
  EXPECT_NEAR(p71.drafter_cap_bps, 2 / 1.6, 1e-12);
  EXPECT_NEAR(p53.allreduce_s_per_batch, 0.1 * 2 * 5 / 6.0, 1e-12);
  EXPECT_NEAR(p53.target_cap_bps, 2 * 5 / 6.0, 1e-12);
  RoleMeasurements one = m;
  one.nodes = 1;
  EXPECT_DOUBLE_EQ(predict_split(one, 7, 1).allreduce_s_per_batch, 0.0);  // a lone drafter reduces nothing
}

TEST(AutoTopology, TiesGoToLessPowerThenFewerGpus) {
  RoleMeasurements m = scenario2();
  m.drafter_s_per_batch = 0.01;  // drafters never limit: T-1 .. T-k all predict the same
  auto preds = predict_all_splits(m);
  EXPECT_EQ(best_split(preds)->split(), "7-1");
  m.power_target_w.reset();
  m.power_drafter_w.reset();
  preds = predict_all_splits(m);
  EXPECT_EQ(best_split(preds)->split(), "7-1");  // without power: fewer GPUs
}

TEST(AutoTopology, TableAndJson) {
  const RoleMeasurements m = scenario2();
  const auto preds = predict_all_splits(m);
  const std::string table = format_whatif_table(preds, "7-1");
  EXPECT_NE(table.find(" *7-1"), std::string::npos) << table;
  EXPECT_NE(table.find("  6-1"), std::string::npos) << table;
  const auto j = nlohmann::json::parse(whatif_json(m, preds, best_split(preds)));
  EXPECT_EQ(j["best"], "7-1");
  EXPECT_EQ(j["whatif"].size(), preds.size());
  EXPECT_NEAR(j["measurements"]["power_idle_w"].get<double>(), 85, 1e-12);
}

// --rebalance auto: move only to a split predicted at least the bar faster, within the power budget.
TEST(AutoTopology, RebalanceNeedsTheGainAndTheBudget) {
  RoleMeasurements m = scenario2();
  // Scenario 1's shape: the drafter side is the bottleneck at 7-1; 6-2 is predicted faster.
  m.drafter_s_per_batch = 1.6 / (34.7e3 / 32768.0);
  const RebalanceChoice c = choose_rebalance(m, 7, 1, 0.05);
  ASSERT_TRUE(c.best.has_value());
  ASSERT_TRUE(c.to.has_value());
  EXPECT_EQ(c.to->split(), c.best->split());
  EXPECT_NE(c.to->split(), "7-1");
  EXPECT_NEAR(c.gain, c.best->batches_per_s / c.now.batches_per_s - 1, 1e-12);
  EXPECT_GT(c.gain, 0.05);
  EXPECT_NE(c.why.find("7-1 predicted"), std::string::npos) << c.why;
  // The bar above the gain: keep.
  const RebalanceChoice high = choose_rebalance(m, 7, 1, c.gain + 0.01);
  EXPECT_FALSE(high.to.has_value());
  EXPECT_NE(high.why.find("keep it"), std::string::npos) << high.why;
  // Already the best: keep, whatever the bar.
  const RebalanceChoice best = choose_rebalance(m, c.to->targets, c.to->drafters, 0.0);
  EXPECT_FALSE(best.to.has_value());
  EXPECT_NE(best.why.find("the best of every split"), std::string::npos) << best.why;
  // A budget nothing fits, or no power readings with a budget: keep.
  EXPECT_FALSE(choose_rebalance(m, 7, 1, 0.05, 100.0).to.has_value());
  m.power_target_w.reset();
  EXPECT_FALSE(choose_rebalance(m, 7, 1, 0.05, 1e6).to.has_value());
  EXPECT_TRUE(choose_rebalance(m, 7, 1, 0.05).to.has_value());
}

TEST(AutoTopologyDeath, SplitMustFitTheNode) {
  RoleMeasurements m = scenario2();
  EXPECT_EXIT(predict_split(m, 8, 1), testing::ExitedWithCode(9), "predict_split 8-1 on 8 GPUs");
  EXPECT_EXIT(predict_split(m, 0, 1), testing::ExitedWithCode(9), "predict_split");
}

}  // namespace
}  // namespace dflash
