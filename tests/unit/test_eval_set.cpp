// --eval-data's pure parts: the packing of the eval set, the share of each drafter, the routes through the
// targets (Topology::eval_routes), the counts one eval batch adds and their sum over drafters, the
// --eval-every default and the [eval] line.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dflash/eval_set.h"
#include "dflash/eval_stats.h"
#include "dflash/metrics.h"
#include "dflash/topology.h"
#include "test_support.h"
#include "drafter/objective.h"

using namespace dflash;

TEST(EvalSet, PacksWholeRecordsInFileOrderAsTheLoaderDoes) {
  // budget 10: [4, 5] | [3, 6] | [12 -> cut 10] | [2]
  const std::vector<int64_t> lengths = {4, 5, 3, 6, 12, 2};
  const auto cut = plan_eval_batches(lengths, 10, LongRecord::Cut);
  ASSERT_EQ(cut.size(), 4u);
  EXPECT_EQ(cut[0].size(), 2u);
  EXPECT_EQ(cut[0][1].record, 1);
  EXPECT_EQ(cut[1][0].record, 2);
  EXPECT_EQ(cut[1][1].take, 6);
  EXPECT_EQ(cut[2][0].record, 4);
  EXPECT_EQ(cut[2][0].take, 10);
  EXPECT_EQ(cut[3][0].record, 5);
  // skip: the long record is left out, and the short one after it joins the batch before
  // skip: [4, 5] | [3, 6] | (12 left out) [2]
  const auto skip = plan_eval_batches(lengths, 10, LongRecord::Skip);
  ASSERT_EQ(skip.size(), 3u);
  EXPECT_EQ(skip[1].size(), 2u);
  EXPECT_EQ(skip[1].back().record, 3);
  ASSERT_EQ(skip[2].size(), 1u);
  EXPECT_EQ(skip[2][0].record, 5);
}

TEST(EvalSet, SharesSplitTheBatchesRoundRobinAndBoundTheHostBytes) {
  EXPECT_EQ(eval_share(5, 2, 0), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(eval_share(5, 2, 1), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(eval_share(1, 3, 2), std::vector<int64_t>{});
  // batch tokens 100, 10, 100, 10, 100: drafter 0 of 2 holds 300
  EXPECT_EQ(max_share_tokens({100, 10, 100, 10, 100}, 2), 300);
  EXPECT_EQ(max_share_tokens({100, 10, 100, 10, 100}, 1), 320);
  EXPECT_EQ(eval_share_summary({100, 10, 100, 10, 100}, 2), "2-3 batch(es) per drafter, at most 300 tokens");
  EXPECT_EQ(eval_share_summary({1000, 1000}, 1), "2 batch(es), 2.0K tokens on the drafter");
}

TEST(EvalSetDeath, AShareTooLargeForADraftersHostIsRefusedWithAHint) {
  EvalBudget budget;  // 1 MiB per token: the 2 GiB hold 2048 tokens per drafter
  budget.bytes_per_token = 1 << 20;
  check_eval_share_fits({1000, 1000}, 2, budget, "eval.h5");  // 1000 tokens per drafter
  check_eval_share_fits({1000, 1000}, 1, budget, "eval.h5");  // 2000 on the one drafter: still fits
  // 2-1 batches over 2 drafters: drafter 0 holds batches 0 and 2 (2100 tokens)
  EXPECT_EXIT(check_eval_share_fits({1000, 1000, 1100}, 2, budget, "eval.h5"), testing::ExitedWithCode(2),
              "eval.h5: a drafter's share of the eval batches \\(2100 tokens\\) would hold 2.1 GiB(.|\n)*more than its 2 GiB "
              "\\(2048 tokens at 1 MiB per token\\)(.|\n)*HINT: lower --eval-max-tokens.*auto: 2048 tokens");
}

// --eval-max-tokens: a file larger than it is evaluated on a fixed sample of whole records.
TEST(EvalSample, AFixedSampleOfWholeRecordsThatFits) {
  std::vector<int64_t> lengths;
  for (int r = 0; r < 500; ++r) lengths.push_back(20 + (r * 37) % 180);  // 20..199 tokens
  int64_t total = 0;
  for (int64_t l : lengths) total += l;
  const EvalSelection a = select_eval_records(lengths, 256, LongRecord::Cut, 5000, "eval.h5");
  EXPECT_EQ(a.file_records, 500);
  EXPECT_EQ(a.file_tokens, total);
  EXPECT_EQ(a.max_tokens, 5000);
  ASSERT_EQ(a.lengths.size(), lengths.size());
  int64_t tokens = 0, records = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    if (a.lengths[r] == 0) continue;
    EXPECT_EQ(a.lengths[r], lengths[r]) << "record " << r << " is taken whole";
    tokens += a.lengths[r];
    ++records;
  }
  EXPECT_EQ(tokens, a.tokens);
  EXPECT_EQ(records, a.records);
  EXPECT_EQ(a.left_out, 500 - records);
  EXPECT_LE(a.tokens, 5000);
  EXPECT_GT(a.tokens, 5000 - 199) << "filled: no record left out would still fit";
  for (size_t r = 0; r < lengths.size(); ++r)
    if (a.lengths[r] == 0) EXPECT_GT(a.tokens + lengths[r], 5000) << "record " << r << " would have fit";
  // A sample, not the file's first records: drawn from all over the file.
  int64_t first_half = 0;
  for (size_t r = 0; r < 250; ++r) first_half += a.lengths[r] > 0;
  EXPECT_GT(first_half, 0);
  EXPECT_LT(first_half, records);
  // The same input draws the same sample (every rank, every run, every resume); a larger N holds more.
  const EvalSelection b = select_eval_records(lengths, 256, LongRecord::Cut, 5000, "eval.h5");
  EXPECT_EQ(a.lengths, b.lengths);
  const EvalSelection c = select_eval_records(lengths, 256, LongRecord::Cut, 20000, "eval.h5");
  EXPECT_NE(a.lengths, c.lengths);
  EXPECT_GT(c.records, a.records);
  // Packed in file order, every piece whole.
  for (const auto& batch : plan_eval_batches(a.lengths, 256, LongRecord::Cut))
    for (const EvalPiece& p : batch) EXPECT_EQ(p.take, lengths[static_cast<size_t>(p.record)]);
}

TEST(EvalSample, TheWholeFileWhenItFitsAndLongRecordsByThePolicy) {
  const std::vector<int64_t> lengths = {4, 5, 3, 6, 12, 2};  // 12 > budget 10: cut to 10, or skipped
  const EvalSelection all = select_eval_records(lengths, 10, LongRecord::Cut, 30, "eval.h5");
  EXPECT_EQ(all.lengths, lengths);
  EXPECT_EQ(all.tokens, 30);
  EXPECT_EQ(all.records, 6);
  EXPECT_EQ(all.left_out, 0);
  EXPECT_EQ(eval_sample_line(all, "eval.h5", true, EvalBudget{}), "");
  const EvalSelection skip = select_eval_records(lengths, 10, LongRecord::Skip, 20, "eval.h5");
  EXPECT_EQ(skip.file_tokens, 20);
  EXPECT_EQ(skip.records, 5);
  EXPECT_EQ(skip.left_out, 0);
  const EvalSelection cut = select_eval_records(lengths, 10, LongRecord::Cut, 12, "eval.h5");
  EXPECT_LE(cut.tokens, 12);
  EXPECT_EQ(cut.left_out, 6 - cut.records);
  for (size_t r = 0; r < lengths.size(); ++r) EXPECT_TRUE(cut.lengths[r] == 0 || cut.lengths[r] == lengths[r]);
}

TEST(EvalSample, AutoIsOneDraftersBudgetAndTheLineSaysWhatWasChosen) {
  EvalBudget b;  // the Qwen3-8B shape on CUDA: 5 captured layers x 4096 x bf16 = 40 KiB per token
  b.bytes_per_token = 5 * 4096 * 2;
  EXPECT_EQ(b.tokens_per_drafter(), 52428);
  EXPECT_EQ(resolve_eval_max_tokens(0, b, 1), 52428);
  EXPECT_EQ(resolve_eval_max_tokens(0, b, 4), 52428) << "auto does not depend on the split";
  EXPECT_EQ(resolve_eval_max_tokens(100000, b, 2), 100000);
  std::vector<int64_t> lengths(2000, 2300);  // the recipe's 2000 held-out conversations, 4.6 M tokens
  const EvalSelection s = select_eval_records(lengths, 16384, LongRecord::Cut, 52428, "eval.h5");
  EXPECT_EQ(s.records, 22);
  EXPECT_EQ(eval_sample_line(s, "eval.h5", true, b),
            "[dflash] eval: eval.h5 has 2000 records (4.6 M tokens); using 22 records (50.6 K tokens), a fixed sample "
            "that fits --eval-max-tokens auto (52.4 K tokens: 2 GiB of eval features per drafter at 40 KiB per token, "
            "this drafter's shape); give --eval-max-tokens to choose");
  EXPECT_EQ(eval_sample_line(s, "eval.h5", false, b),
            "[dflash] eval: eval.h5 has 2000 records (4.6 M tokens); using 22 records (50.6 K tokens), a fixed sample "
            "that fits --eval-max-tokens 52428");
}

TEST(EvalSampleDeath, MoreThanTheDraftersHoldOrLessThanARecordIsRefused) {
  EvalBudget b;
  b.bytes_per_token = 5 * 4096 * 2;
  EXPECT_EXIT(resolve_eval_max_tokens(200000, b, 2), testing::ExitedWithCode(2),
              "--eval-max-tokens 200000 is more than the drafters can keep: 2 GiB of eval features per drafter at 40 KiB "
              "per token \\(this drafter's shape\\) hold 52428 tokens per drafter, 104856 over 2 drafter(.|\n)*HINT: give "
              "--eval-max-tokens 104856 or less, or auto \\(52428 tokens");
  EXPECT_EXIT(select_eval_records({50, 60}, 100, LongRecord::Cut, 40, "eval.h5"), testing::ExitedWithCode(2),
              "--eval-max-tokens 40 holds no record of --eval-data eval.h5 \\(its shortest has 50 tokens\\)");
}

TEST(EvalSet, RoutesGiveEachBatchToItsDrafterThroughATargetOfItsNode) {
  // one node, 2-2: batch i -> drafter i % 2, target i % 2
  std::vector<RankSlot> one = {{0, 0}, {0, 1}, {0, 2}, {0, 3}};
  const Topology t = assign_roles(0, one, TopologySpec{2, 2});
  const std::vector<EvalRoute> r = t.eval_routes(5);
  ASSERT_EQ(r.size(), 5u);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(r[i].batch, i);
    EXPECT_EQ(r[i].drafter, t.drafters[i % 2]);
    EXPECT_EQ(r[i].target, t.targets[i % 2]);
  }
  // 1-2: the one target forwards every batch
  const Topology u = assign_roles(0, {{0, 0}, {0, 1}, {0, 2}}, TopologySpec{1, 2});
  for (const EvalRoute& e : u.eval_routes(4)) EXPECT_EQ(e.target, 0);
  // two nodes of 2-1: drafters 2 and 5; a rank of node 1 sees only node 1's batches (odd ones), from its targets
  std::vector<RankSlot> two = {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}};
  const Topology v = assign_roles(4, two, TopologySpec{2, 1});
  const std::vector<EvalRoute> w = v.eval_routes(6);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].batch, 1);
  EXPECT_EQ(w[0].drafter, 5);
  EXPECT_EQ(w[0].target, 3);  // the drafter's 0th batch: node target 0
  EXPECT_EQ(w[1].target, 4);  // 1st: node target 1
  EXPECT_EQ(w[2].target, 3);
  // Every batch has exactly one route over the nodes, and the drafter's share is eval_share's.
  const Topology n0 = assign_roles(0, two, TopologySpec{2, 1});
  const std::vector<EvalRoute> w0 = n0.eval_routes(6);
  std::vector<int64_t> d0;
  for (const EvalRoute& e : w0) d0.push_back(e.batch);
  EXPECT_EQ(d0, eval_share(6, 2, 0));
}

TEST(EvalStats, FillMetricsReportsTheCountsBehindTheMeans) {
  train::LossRows rows;  // as LossMetrics.StreakSkipsMissingPositionsAndStopsAtFirstMiss
  rows.block = {0, 0, 1, 1};
  rows.offset = {1, 3, 1, 2};
  rows.label = {5, 6, 7, 8};
  rows.block_row = {1, 3, 5, 6};
  rows.teacher_at = {0, 0, 0, 0};
  rows.weight = {1, 1, 1, 1};
  const std::vector<int32_t> am_q = {5, 6, 0, 8};
  StepStats st;
  train::fill_metrics(rows, am_q.data(), nullptr, 3, 4, st);
  EXPECT_EQ(st.per_pos_rows, (std::vector<double>{0, 2, 1, 1}));
  EXPECT_EQ(st.per_pos_correct, (std::vector<double>{0, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(st.streak_sum, 2.0);
}

namespace {
StepStats batch_stats(double loss, double wsum, std::vector<double> rows, std::vector<double> ok, double streak_sum,
                      int64_t anchors, int64_t tokens) {
  StepStats st;
  st.loss = loss;
  st.weight_sum = wsum;
  st.per_pos_rows = rows;
  st.per_pos_correct = ok;
  st.streak_sum = streak_sum;
  st.anchors = anchors;
  st.tokens = tokens;
  return st;
}
}  // namespace

TEST(EvalStats, SumsOverDraftersEqualOneDrafterEvaluatingEverything) {
  const StepStats a = batch_stats(2.0, 3.0, {0, 4, 2, 2}, {0, 2, 1, 0}, 3, 4, 100);
  const StepStats b = batch_stats(1.0, 1.0, {0, 1, 1, 0}, {0, 1, 0, 0}, 1, 1, 20);
  const StepStats c = batch_stats(4.0, 2.0, {0, 2, 0, 0}, {0, 0, 0, 0}, 0, 2, 30);
  EvalSums all(4), d0(4), d1(4);
  all.add(a, 2);
  all.add(b, 1);
  all.add(c, 1);
  d0.add(a, 2);
  d0.add(c, 1);
  d1.add(b, 1);
  std::vector<double> sum = d0.pack();  // MPI_SUM of the two packs
  const std::vector<double> p1 = d1.pack();
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += p1[i];
  EXPECT_EQ(sum, all.pack());
  const EvalMetrics m = EvalSums::unpack(sum, 4).metrics();
  EXPECT_DOUBLE_EQ(m.loss, (2.0 * 3 + 1.0 * 1 + 4.0 * 2) / 6.0);  // weighted, not a mean of means
  EXPECT_DOUBLE_EQ(m.acc, 4.0 / 12.0);
  EXPECT_DOUBLE_EQ(m.streak, 4.0 / 7.0);
  ASSERT_EQ(m.acc_by_pos.size(), 3u);  // positions 1..3
  EXPECT_DOUBLE_EQ(m.acc_by_pos[0], 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(m.acc_by_pos[1], 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.acc_by_pos[2], 0.0);
  EXPECT_EQ(m.tokens, 150);
  EXPECT_EQ(m.anchors, 7);
  EXPECT_EQ(m.seqs, 4);
  // A drafter without a share adds nothing; a set without rows has NaN numbers, not zeros.
  const EvalMetrics none = EvalSums(4).metrics();
  EXPECT_TRUE(std::isnan(none.loss) && std::isnan(none.acc) && std::isnan(none.acc_by_pos[0]));
}

TEST(EvalStats, EveryDefaultsToTheCheckpointIntervalElseATenthOfTheRun) {
  EXPECT_EQ(resolve_eval_every(7, 100, 1000), 7);     // given
  EXPECT_EQ(resolve_eval_every(0, 100, 1000), 0);     // given: only at the end
  EXPECT_EQ(resolve_eval_every(-1, 100, 1000), 100);  // --checkpoint-every N
  EXPECT_EQ(resolve_eval_every(-1, 0, 1000), 100);    // 10% of the planned steps
  EXPECT_EQ(resolve_eval_every(-1, 0, 18), 2);
  EXPECT_EQ(resolve_eval_every(-1, 0, 3), 1);
  EXPECT_EQ(resolve_eval_every(-1, 0, 0), 0);         // no planned end
  EXPECT_TRUE(eval_due(200, 100));
  EXPECT_FALSE(eval_due(150, 100));
  EXPECT_FALSE(eval_due(0, 100));
  EXPECT_FALSE(eval_due(100, 0));
}

TEST(EvalStats, StatusLine) {
  EvalMetrics m;
  m.step = 200;
  m.loss = 4.12341;
  m.acc = 0.1234;
  m.streak = 0.449;
  m.seqs = 12;
  m.tokens = 3100;
  m.seconds = 0.42;
  EXPECT_EQ(format_eval_line(m), "[eval] step=200 loss=4.1234 acc=0.123 streak=0.45 (12 seqs, 3.1K tok, 0.4 s)");
}

TEST(EvalMetricsFile, EvalRowsAppendAndAResumeDropsThoseAfterItsCheckpoint) {
  const std::string path = test::make_temp_dir("dflash-eval-metrics-") + "/metrics.h5";
  MetricsLayout layout;
  layout.block_size = 4;
  auto row = [](int64_t step, double loss) {
    EvalMetrics m;
    m.step = step;
    m.loss = loss;
    m.acc = 0.5;
    m.acc_by_pos = {0.25, 0.5, std::nan("")};
    m.tokens = 100;
    m.seqs = 3;
    return m;
  };
  {
    MetricsWriter w(path, layout);
    w.drop_eval_after(0);  // no /eval yet: nothing to do
    w.append_eval(row(10, 3.0));
    w.append_eval(row(20, 2.5));
    w.append_eval(row(30, 2.0));
  }
  {
    const MetricsReader r(path);
    EXPECT_EQ(r.series("eval/step"), (std::vector<double>{10, 20, 30}));
    EXPECT_EQ(r.series("eval/loss"), (std::vector<double>{3.0, 2.5, 2.0}));
    int64_t cols = 0;
    const std::vector<double> acc = r.matrix("eval/acc_by_pos", &cols);
    EXPECT_EQ(cols, 3);
    EXPECT_EQ(acc[3], 0.25);
    EXPECT_TRUE(std::isnan(acc[5]));
  }
  {
    MetricsWriter w(path, layout, MetricsOpen::Append);  // resumed from the step-20 checkpoint
    w.drop_eval_after(20);
    w.append_eval(row(30, 1.5));
  }
  const MetricsReader r(path);
  EXPECT_EQ(r.series("eval/step"), (std::vector<double>{10, 20, 30}));
  EXPECT_EQ(r.series("eval/loss"), (std::vector<double>{3.0, 2.5, 1.5}));
  EXPECT_EQ(r.rows("eval/acc_by_pos"), 3);
}
