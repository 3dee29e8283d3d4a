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
  const std::string table = format_whatif_table(m, preds, "7-1");
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
  const RebalanceChoice c = choose_rebalance(m, TopologySpec{7, 1}, 0.05);
  ASSERT_TRUE(c.best.has_value());
  ASSERT_TRUE(c.to.has_value());
  EXPECT_EQ(c.to->split(), c.best->split());
  EXPECT_NE(c.to->split(), "7-1");
  EXPECT_NEAR(c.gain, c.best->batches_per_s / c.now.batches_per_s - 1, 1e-12);
  EXPECT_GT(c.gain, 0.05);
  EXPECT_NE(c.why.find("7-1 predicted"), std::string::npos) << c.why;
  // The bar above the gain: keep.
  const RebalanceChoice high = choose_rebalance(m, TopologySpec{7, 1}, c.gain + 0.01);
  EXPECT_FALSE(high.to.has_value());
  EXPECT_NE(high.why.find("keep it"), std::string::npos) << high.why;
  // Already the best: keep, whatever the bar.
  const RebalanceChoice best = choose_rebalance(m, c.to->spec(), 0.0);
  EXPECT_FALSE(best.to.has_value());
  EXPECT_NE(best.why.find("the best of every layout"), std::string::npos) << best.why;
  // A budget nothing fits, or no power readings with a budget: keep.
  EXPECT_FALSE(choose_rebalance(m, TopologySpec{7, 1}, 0.05, 100.0).to.has_value());
  m.power_target_w.reset();
  EXPECT_FALSE(choose_rebalance(m, TopologySpec{7, 1}, 0.05, 1e6).to.has_value());
  EXPECT_TRUE(choose_rebalance(m, TopologySpec{7, 1}, 0.05).to.has_value());
}

// The colocated row (auto_topology.h): N G / (s_t + s_d + a(N G) - o min(s_t, s_d)); power weighted by each
// role's share of the batch's time. Scenario 1's roles: the drafter-bound 7-1 on 8 GPUs.
RoleMeasurements two_roles() {
  RoleMeasurements m;
  m.gpus_per_node = 8;
  m.nodes = 2;
  m.tokens_per_batch = 32768;
  m.target_s_per_batch = 7 / 0.92;
  m.drafter_s_per_batch = 1 / 0.86;
  m.allreduce_coeff_s = 0.05;
  return m;
}

TEST(AutoTopology, ColocatedRate) {
  RoleMeasurements m = two_roles();
  const double t = m.target_s_per_batch, d = m.drafter_s_per_batch;
  const double a = 0.05 * ring_allreduce_factor(16);  // every GPU of both nodes is a drafter
  m.colocated_overlap = 0.4;
  const SplitPrediction p = predict_colocated(m);
  EXPECT_EQ(p.split(), "colocated");
  EXPECT_TRUE(p.spec().colocated());
  EXPECT_EQ(p.gpus(), 8);
  EXPECT_EQ(p.idle, 0);
  EXPECT_NEAR(p.allreduce_s_per_batch, a, 1e-12);
  EXPECT_NEAR(p.batches_per_s, 16 / (t + d + a - 0.4 * d), 1e-12);
  EXPECT_NEAR(p.target_cap_bps, 16 / t, 1e-12);      // the target alone on every GPU
  EXPECT_NEAR(p.drafter_cap_bps, 16 / (d + a), 1e-12);
  EXPECT_EQ(p.limit, SplitLimit::Target);
  EXPECT_NEAR(p.ktok_per_s, p.batches_per_s * 32.768, 1e-9);
  EXPECT_FALSE(p.power_w.has_value());
  // Full overlap: the longer role alone (plus the allreduce); more than 1 is clamped to it.
  m.colocated_overlap = 1.7;
  EXPECT_NEAR(predict_colocated(m).batches_per_s, 16 / (t + a), 1e-12);
  EXPECT_NEAR(*predict_colocated(m).overlap, 1.0, 1e-12);
  // Measured contention (below 0) is taken as measured: the pair took longer than one after the other.
  m.colocated_overlap = -0.5;
  EXPECT_NEAR(predict_colocated(m).batches_per_s, 16 / (t + d + a + 0.5 * d), 1e-12);
  // Not measured: taken as 0 (the roles take turns), and said so (no overlap in the row).
  m.colocated_overlap.reset();
  EXPECT_NEAR(predict_colocated(m).batches_per_s, 16 / (t + d + a), 1e-12);
  EXPECT_FALSE(predict_colocated(m).overlap.has_value());
  // Power: each role's draw for its share of the batch's time, on every GPU.
  m.power_target_w = 600;
  m.power_drafter_w = 400;
  EXPECT_NEAR(*predict_colocated(m).power_w, 16 * (600 * t + 400 * d) / (t + d), 1e-9);
}

TEST(AutoTopology, ColocatedOverlapFromTimings) {
  EXPECT_NEAR(colocated_overlap(1.0, 0.5, 1.0), 1.0, 1e-12);   // the step hid under the forward
  EXPECT_NEAR(colocated_overlap(1.0, 0.5, 1.5), 0.0, 1e-12);   // one after the other
  EXPECT_NEAR(colocated_overlap(1.0, 0.5, 1.25), 0.5, 1e-12);
  EXPECT_NEAR(colocated_overlap(1.0, 0.5, 2.0), -1.0, 1e-12);  // slower together: contention
  EXPECT_NEAR(colocated_overlap(1.0, 0.5, 0.2), 1.0, 1e-12);   // never faster than the longer role
  EXPECT_EQ(colocated_overlap(0.0, 0.5, 0.5), 0.0);             // a missing time: nothing to say
}

// The colocated row is the last of predict_all_layouts; it is the best only with a measured overlap and a
// fit not known to fail (and, with a budget, known power within it).
TEST(AutoTopology, ColocatedIsChosenOnlyMeasuredAndFitting) {
  RoleMeasurements m = two_roles();
  m.nodes = 1;
  m.allreduce_coeff_s.reset();
  auto preds = predict_all_layouts(m);
  ASSERT_EQ(preds.size(), 29u);
  EXPECT_EQ(preds.back().split(), "colocated");
  EXPECT_EQ(best_split(preds)->split(), "7-1");  // colocated predicts more, but its overlap is a guess
  EXPECT_GT(preds.back().batches_per_s, row(preds, "7-1").batches_per_s);
  m.colocated_overlap = 0.0;
  EXPECT_EQ(best_split(predict_all_layouts(m))->split(), "colocated");
  m.colocated_fit = ColocatedFit::Fits;
  EXPECT_EQ(best_split(predict_all_layouts(m))->split(), "colocated");
  m.colocated_fit = ColocatedFit::DoesNotFit;
  EXPECT_EQ(best_split(predict_all_layouts(m))->split(), "7-1");
  EXPECT_NE(format_whatif_table(m, predict_all_layouts(m), "7-1").find("(does not fit)"), std::string::npos);
  // Contention measured: colocated slower than 7-1.
  m.colocated_fit = ColocatedFit::Unknown;
  m.colocated_overlap = -1.0;
  EXPECT_EQ(best_split(predict_all_layouts(m))->split(), "7-1");
  // Power: a budget below colocated's draw picks a split within it.
  m.colocated_overlap = 0.5;
  m.power_target_w = 600;
  m.power_drafter_w = 500;
  m.power_idle_w = 80;
  preds = predict_all_layouts(m);
  EXPECT_EQ(best_split(preds)->split(), "colocated");
  const double budget = *preds.back().power_w - 1;
  const std::optional<SplitPrediction> within = best_split(preds, budget);
  ASSERT_TRUE(within.has_value());
  EXPECT_EQ(within->layout, Layout::Split);
  EXPECT_LE(*within->power_w, budget);
}

TEST(AutoTopology, RebalanceToAndFromColocated) {
  RoleMeasurements m = two_roles();
  m.nodes = 1;
  m.colocated_overlap = 0.8;
  const RebalanceChoice to = choose_rebalance(m, TopologySpec{7, 1}, 0.05);
  ASSERT_TRUE(to.to.has_value());
  EXPECT_EQ(to.to->split(), "colocated");
  EXPECT_NE(to.why.find("the best, colocated"), std::string::npos) << to.why;
  EXPECT_FALSE(choose_rebalance(m, colocated_spec(), 0.0).to.has_value());  // already the best
  // Not measured: never the choice, and the line says why.
  RoleMeasurements guess = m;
  guess.colocated_overlap.reset();
  const RebalanceChoice kept = choose_rebalance(guess, TopologySpec{7, 1}, 0.05);
  EXPECT_FALSE(kept.to.has_value());
  EXPECT_NE(kept.why.find("but its overlap is not measured"), std::string::npos) << kept.why;
  // A colocated run whose roles contend: a split is predicted faster, and it moves there.
  m.colocated_overlap = -1.0;
  const RebalanceChoice from = choose_rebalance(m, colocated_spec(), 0.05);
  ASSERT_TRUE(from.to.has_value());
  EXPECT_EQ(from.to->layout, Layout::Split);
  EXPECT_EQ(from.now.split(), "colocated");
  // The table names the row and says where the overlap comes from.
  const std::string table = format_whatif_table(m, predict_all_layouts(m), "colocated");
  EXPECT_NE(table.find(" *colocated"), std::string::npos) << table;
  EXPECT_NE(table.find("colocated: overlap -1.00 of the shorter role (measured), memory unknown"), std::string::npos) << table;
  const auto j = nlohmann::json::parse(whatif_json(m, predict_all_layouts(m), to.best));
  EXPECT_EQ(j["whatif"].back()["split"], "colocated");
  EXPECT_EQ(j["whatif"].back()["layout"], "colocated");
  EXPECT_EQ(j["measurements"]["colocated_fit"], "unknown");
  EXPECT_NEAR(j["measurements"]["colocated_overlap"].get<double>(), -1.0, 1e-12);
}

TEST(AutoTopologyDeath, SplitMustFitTheNode) {
  RoleMeasurements m = scenario2();
  EXPECT_EXIT(predict_split(m, 8, 1), testing::ExitedWithCode(9), "predict_split 8-1 on 8 GPUs");
  EXPECT_EXIT(predict_split(m, 0, 1), testing::ExitedWithCode(9), "predict_split");
}

}  // namespace
}  // namespace dflash
