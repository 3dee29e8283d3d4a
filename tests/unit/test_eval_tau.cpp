// tau during training (--eval-tau-every): the sums over drafters, the /eval row and line, the schedule,
// and the best-drafter rule (include/dflash/eval_prompts.h, src/runtime/drafter_tau.h, drafter_best.h).
#include <gtest/gtest.h>

#include <cmath>

#include "data/h5_util.h"
#include "dflash/eval_prompts.h"
#include "dflash/metrics.h"
#include "runtime/drafter_best.h"
#include "runtime/drafter_tau.h"
#include "test_support.h"

using namespace dflash;

namespace {
SpecDecodeResult result(std::vector<int> acceptance, size_t tokens, double seconds) {
  SpecDecodeResult r;
  r.acceptance = std::move(acceptance);
  r.tokens.assign(tokens, 7);
  r.seconds = seconds;
  return r;
}
}  // namespace

TEST(TauSums, TauIsTheMeanOverPromptsOfEachPromptsMeanAndSumsAddUp) {
  TauSums a, b, all;
  a.add(result({4, 2}, 6, 0.5));      // tau 3
  b.add(result({1, 1, 1, 1}, 4, 1));  // tau 1
  all.add(result({4, 2}, 6, 0.5));
  all.add(result({1, 1, 1, 1}, 4, 1));
  EXPECT_DOUBLE_EQ(all.tau(), 2.0);  // (3 + 1) / 2, not the pooled 10 / 6
  std::vector<double> v = a.pack(), w = b.pack();
  ASSERT_EQ(v.size(), TauSums::kPacked);
  for (size_t i = 0; i < v.size(); ++i) v[i] += w[i];  // what the allreduce does
  const TauSums s = TauSums::unpack(v.data());
  EXPECT_DOUBLE_EQ(s.tau(), all.tau());
  EXPECT_EQ(s.prompts, 2);
  EXPECT_EQ(s.new_tokens, 10);
  EXPECT_EQ(s.steps, 6);
  EXPECT_EQ(s.accepted, 10);
  EXPECT_DOUBLE_EQ(s.seconds, 1.5);
  EXPECT_EQ(TauSums().tau(), 0.0);
}

TEST(TauSchedule, EveryNStepsAndAtThePlannedLastStep) {
  Options o;
  RunPlan plan;
  o.eval_tau_every = 10;
  o.max_steps = 25;
  EXPECT_FALSE(tau_due(0, o, plan));
  EXPECT_FALSE(tau_due(5, o, plan));
  EXPECT_TRUE(tau_due(10, o, plan));
  EXPECT_TRUE(tau_due(20, o, plan));
  EXPECT_TRUE(tau_due(25, o, plan));  // the run's last step
  o.max_steps = 0;
  plan.schedule.total_steps = 33;  // planned from the data
  EXPECT_TRUE(tau_due(33, o, plan));
  EXPECT_FALSE(tau_due(25, o, plan));
  o.eval_tau_every = 0;
  EXPECT_FALSE(tau_due(10, o, plan));
}

TEST(TauSchedule, ThePromptLimitLeavesRoomForNewTokensAndTheBlock) {
  Options o;
  o.token_budget = 512;
  o.eval_tau_max_new_tokens = 24;
  EXPECT_EQ(tau_max_prompt_length(o, 16), 472);
  o.token_budget = 32768;
  EXPECT_EQ(tau_max_prompt_length(o, 16), kDefaultMaxPromptLength);  // dflash-eval's default
}

// dflash-train's --eval-tau-prompt-batch defaults to one prompt at a time (a drafter rank's memory as the dry run
// counts it); dflash-eval, a process of its own, packs kDefaultPromptBatch.
TEST(TauSchedule, InRunPromptBatchDefaultsToOne) {
  EXPECT_EQ(Options{}.eval_tau_prompt_batch, 1);
  EXPECT_GT(kDefaultPromptBatch, 1);
}

// The packed forward's capacity: the prompt_batch largest reservations (prompt + new tokens), capped at the
// limit; a limit below the longest alone is refused, naming the option.
TEST(TauSchedule, PackedTokensHoldTheLargestPromptsUpToTheLimit) {
  const std::vector<size_t> m = {10, 40, 25, 5};
  EXPECT_EQ(packed_tokens_for(m, 8, 2, 1000, "--x"), (40 + 8) + (25 + 8));
  EXPECT_EQ(packed_tokens_for(m, 8, 16, 1000, "--x"), 10 + 40 + 25 + 5 + 4 * 8);
  EXPECT_EQ(packed_tokens_for(m, 8, 16, 60, "--x"), 60);
  EXPECT_EQ(packed_tokens_for({}, 8, 16, 60, "--x"), 0);
  EXPECT_EXIT(packed_tokens_for(m, 8, 1, 47, "--max-batch-tokens"), ::testing::ExitedWithCode(2),
              "--max-batch-tokens 47 holds no batch: the longest prompt with its new tokens needs 48");
}

TEST(TauSchedule, NoRoomForAPromptIsRefused) {
  Options o;
  o.token_budget = 100;
  o.eval_tau_max_new_tokens = 90;
  EXPECT_EXIT(tau_max_prompt_length(o, 16), ::testing::ExitedWithCode(2), "leave no room for a prompt");
}

TEST(DrafterBestRule, ByTauWhenMeasuredElseByLoss) {
  Options o;
  o.out_dir = "/nonexistent";
  o.eval_tau_every = 10;
  DrafterBest by_tau(o, "");
  EvalMetrics m;
  m.step = 5;
  m.loss = 3.0;  // a loss-only row: never the best by tau
  EXPECT_FALSE(by_tau.offer(m));
  EXPECT_TRUE(by_tau.record().empty());
  m.step = 10, m.tau = 1.5, m.loss = 3.0;
  EXPECT_TRUE(by_tau.offer(m));  // the first measured one
  m.step = 20, m.tau = 1.4, m.loss = 2.0;
  EXPECT_FALSE(by_tau.offer(m));  // a lower loss does not count
  m.step = 30, m.tau = 1.5;
  EXPECT_FALSE(by_tau.offer(m));  // a tie keeps the earlier
  m.step = 40, m.tau = 1.7;
  EXPECT_TRUE(by_tau.offer(m));
  EXPECT_EQ(by_tau.record()["step"], 40);
  EXPECT_EQ(by_tau.record()["by"], "tau");
  o.eval_tau_every = 0;
  DrafterBest by_loss(o, "");
  m = EvalMetrics();
  m.step = 10, m.loss = 3.0;
  EXPECT_TRUE(by_loss.offer(m));
  m.step = 20, m.loss = 3.5;
  EXPECT_FALSE(by_loss.offer(m));
  m.step = 30, m.loss = 2.5;
  EXPECT_TRUE(by_loss.offer(m));
  EXPECT_TRUE(by_loss.record()["tau"].is_null());  // no NaN in JSON
}

TEST(EvalTauMetrics, LineAndRowsCarryTauWhereMeasured) {
  EvalMetrics m;
  m.step = 200, m.loss = 4.12341, m.acc = 0.1234, m.streak = 0.449, m.seqs = 12, m.tokens = 3100, m.seconds = 0.42;
  m.tau = 1.8344;
  EXPECT_EQ(format_eval_line(m), "[eval] step=200 loss=4.1234 acc=0.123 streak=0.45 tau=1.834 (12 seqs, 3.1K tok, 0.4 s)");
  const std::string path = test::make_temp_dir("dflash-eval-tau-") + "/metrics.h5";
  MetricsLayout layout;
  layout.block_size = 4;
  auto row = [](int64_t step, double tau) {
    EvalMetrics r;
    r.step = step;
    r.acc_by_pos = {0.1, 0.2, 0.3};
    r.tau = tau;
    r.tau_prompts = std::isfinite(tau) ? 8 : 0;
    return r;
  };
  {
    MetricsWriter w(path, layout);
    w.append_eval(row(10, std::nan("")));
    w.append_eval(row(20, 1.25));
  }
  {  // a file of a build before tau: its /eval without the tau series
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    for (const char* n : {"eval/tau", "eval/tau_prompts", "eval/tau_new_tokens", "eval/tau_steps", "eval/tau_seconds"})
      ASSERT_GE(H5Ldelete(f, n, H5P_DEFAULT), 0);
    H5Fclose(f);
  }
  {
    MetricsWriter w(path, layout, MetricsOpen::Append);
    w.append_eval(row(30, 1.5));
  }
  const MetricsReader r(path);
  EXPECT_EQ(r.series("eval/step"), (std::vector<double>{10, 20, 30}));
  const std::vector<double> tau = r.series("eval/tau");
  ASSERT_EQ(tau.size(), 3u);  // the older rows get the fill value
  EXPECT_TRUE(std::isnan(tau[0]) && std::isnan(tau[1]));
  EXPECT_EQ(tau[2], 1.5);
  EXPECT_EQ(r.series("eval/tau_prompts"), (std::vector<double>{0, 0, 8}));
}
