// Speculative decoding (include/dflash/spec_decode.h) on the golden tiny target: the output equals the
// target's own greedy decoding, and every step's acceptance length is accounted for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "dflash/drafter.h"
#include "dflash/spec_decode.h"
#include "test_support.h"

namespace dflash {
namespace {

const std::string kTarget = std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a/target";
const std::string kDrafter = std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a/drafter_init";

TEST(SpecDecode, AcceptedPrefixCountsTheLeadingMatches) {
  const std::vector<int32_t> d = {4, 8, 15, 16}, p = {4, 8, 23, 16};
  EXPECT_EQ(accepted_prefix(d.data(), p.data(), 4), 2);
  EXPECT_EQ(accepted_prefix(d.data(), d.data(), 4), 4);
  EXPECT_EQ(accepted_prefix(d.data(), p.data(), 0), 0);
  const std::vector<int32_t> q = {5, 8, 15, 16};
  EXPECT_EQ(accepted_prefix(d.data(), q.data(), 4), 0);  // a later match does not count
}

TEST(SpecDecode, TauIsTheMeanAcceptanceLength) {
  SpecDecodeResult r;
  EXPECT_EQ(r.tau(), 0.0);
  r.acceptance = {1, 3, 2};
  EXPECT_DOUBLE_EQ(r.tau(), 2.0);
}

// For each drafter (the reference release's and a fresh one), several prompts and lengths: the output is
// the target's greedy output, and the steps' acceptance lengths add up to the tokens generated.
// The official dflash_generate's count (z-lab dflash, dflash/model.py) on constructed steps, against the
// count before it (accepted drafts + 1, over B - 1 drafts, however near the limit or a stop token).
TEST(SpecDecode, StepCountIsTheOfficialOne) {
  const int B = 4;
  // Prompt of 2, 3 new tokens: max_length 5; the prefill's token is at start 2. The last block verifies
  // min(4, 5 - 2) = 3 rows: 2 drafts, both accepted, then the bonus; only 2 tokens fit before the limit.
  EXPECT_EQ(official_verify_rows(B, 2, 5), 3);
  EXPECT_EQ(official_verify_rows(B, 10, 100), B);
  OfficialStep s = official_step_count({11, 12, 13}, 2, 5, {});
  EXPECT_EQ(s.produced, 2);  // the count before: 3 drafts accepted of B - 1 + 1 = 4
  EXPECT_FALSE(s.stopped);
  // A stop token among the accepted drafts: the step keeps it and nothing after it.
  s = official_step_count({11, 99, 12, 13}, 10, 100, {99});
  EXPECT_EQ(s.produced, 2);  // the count before: 4
  EXPECT_TRUE(s.stopped);
  // A stop token past the limit's cut is not seen.
  s = official_step_count({11, 12, 13, 99}, 10, 13, {99});
  EXPECT_EQ(s.produced, 2);
  EXPECT_FALSE(s.stopped);
  // Far from both: accepted drafts + 1.
  EXPECT_EQ(official_step_count({11, 12}, 10, 100, {99}).produced, 2);
  // tau over a run of 7 new tokens, B 4, every draft accepted: the official steps keep 4, then 2 of the last
  // block's 3 (6 after the prefill's token), tau 3.0; the count before counted 4, 4: tau 4.0.
  SpecDecodeResult r;
  for (int64_t start = 2, max_length = 2 + 7; start + 1 < max_length;) {
    const std::vector<int32_t> kept(static_cast<size_t>(official_verify_rows(B, start, max_length)), 11);
    const OfficialStep step = official_step_count(kept, start, max_length, {});
    r.acceptance.push_back(step.produced);
    start += step.produced;
  }
  EXPECT_EQ(r.acceptance, (std::vector<int>{4, 2}));
  EXPECT_DOUBLE_EQ(r.tau(), 3.0);
}

TEST(SpecDecode, LosslessAgainstGreedyOnTheGoldenTarget) {
  const Ctx ctx = cpu_ctx();
  const TargetConfig tcfg = load_target_config(kTarget);
  for (const std::string& drafter_dir : {kDrafter, std::string()}) {
    TrainOptions opt;
    opt.max_anchors = 1;
    opt.block_size = 4;  // a fresh drafter's block; the release's own config gives its own
    DrafterTrainer drafter(kTarget, drafter_dir, 1, opt, ctx, 128);
    const int B = drafter.config().block_size;
    auto target = make_target_model(tcfg, kTarget, ctx, drafter.config().target_layer_ids, 128);
    SpecDecoder dec(*target, drafter, ctx, 128);
    EXPECT_EQ(dec.block_size(), B);
    for (int max_new : {1, 7, 30}) {
      const std::vector<int32_t> prompt = {3, 17, 42, 5, 9, static_cast<int32_t>(max_new)};
      const SpecDecodeResult r = dec.generate(prompt, max_new, {});
      const std::vector<int32_t> g = dec.greedy(prompt, max_new, {});
      ASSERT_EQ(static_cast<int>(g.size()), max_new);
      EXPECT_EQ(r.tokens, g) << "drafter '" << drafter_dir << "', max_new " << max_new;
      const int sum = std::accumulate(r.acceptance.begin(), r.acceptance.end(), 0);
      // Steps run while fewer than max_new tokens are there (the reference's loop condition), and each counts
      // the tokens it kept (official_step_count): they add up to the tokens after the prefill's.
      EXPECT_EQ(r.acceptance.empty(), max_new == 1);
      EXPECT_EQ(sum, max_new - 1);
      for (int a : r.acceptance) {
        EXPECT_GE(a, 1);
        EXPECT_LE(a, B);
      }
      // A stop token: the output ends right after its first occurrence in the greedy output.
      const int32_t stop = g[g.size() / 2];
      const SpecDecodeResult rs = dec.generate(prompt, max_new, {stop});
      const auto at = std::find(g.begin(), g.end(), stop);
      EXPECT_EQ(rs.tokens, std::vector<int32_t>(g.begin(), at + 1));
      EXPECT_EQ(dec.greedy(prompt, max_new, {stop}), rs.tokens);
      EXPECT_EQ(std::accumulate(rs.acceptance.begin(), rs.acceptance.end(), 0), static_cast<int>(rs.tokens.size()) - 1);
    }
  }
}

}  // namespace
}  // namespace dflash

namespace dflash {
namespace {

// sampling_probs follows the official _sampling_probs: top-k first, then the entries whose preceding mass
// (descending) is below top_p, renormalised.
TEST(SpecDecodeSampling, SamplingProbsTopKThenTopP) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, 3.0f, -1.0f};
  SamplingSpec s;
  s.temperature = 1.f;
  std::vector<double> p;
  sampling_probs(logits.data(), 5, s, p);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(p[i], std::exp(logits[i]) / z, 1e-6);
  std::vector<double> all(9, 7.0);  // a top-k as large as the vocabulary is the whole of it, bit for bit
  s.top_k = 5;
  sampling_probs(logits.data(), 5, s, all);
  EXPECT_EQ(all, p);
  s.top_k = 3;  // ids 3, 0, 1
  sampling_probs(logits.data(), 5, s, p);
  const double z3 = std::exp(3.0) + std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(p[3], std::exp(3.0) / z3, 1e-6);
  EXPECT_EQ(p[2], 0.0);
  EXPECT_EQ(p[4], 0.0);
  s.top_p = 0.7f;  // p3 = 0.665 (< 0.7 before id 0 is counted): ids 3 and 0 are kept
  sampling_probs(logits.data(), 5, s, p);
  EXPECT_NEAR(p[3], std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-6);
  EXPECT_NEAR(p[0], std::exp(2.0) / (std::exp(3.0) + std::exp(2.0)), 1e-6);
  EXPECT_EQ(p[1], 0.0);
}

// The target's own next-token distribution after `seq` under spec (its logits through sampling_probs).
std::vector<double> target_next(TargetModel& t, const std::vector<int32_t>& seq, const SamplingSpec& spec) {
  const int64_t T = static_cast<int64_t>(seq.size()), H = t.config().hidden_size, V = t.config().vocab_size;
  const int64_t k = static_cast<int64_t>(t.capture_layers().size());
  std::vector<float> feat(static_cast<size_t>(k * T * H)), fn(static_cast<size_t>(T * H)), lg(static_cast<size_t>(V));
  PackedBatch b;
  b.tokens = seq;
  b.cu_seqlens = {0, static_cast<int32_t>(T)};
  b.loss_mask.assign(static_cast<size_t>(T), 0);
  CaptureOut out;
  out.features = cpu_view(feat.data(), {k, T, H});
  out.final_norm = cpu_view(fn.data(), {T, H});
  t.forward(b, out);
  t.lm_head_forward(cpu_view(lg.data(), {1, V}), cpu_view(fn.data() + (T - 1) * H, {1, H}));
  std::vector<double> p;
  sampling_probs(lg.data(), V, spec, p);
  return p;
}

// Sampled speculative decoding is lossless in distribution: over 3000 seeds the first two new tokens follow
// the target's own sampled distribution p(t1) p(t2 | t1) (every pair of mass > 1 % within 4.5 standard
// errors), for an untrained DFlash drafter (q far from p: the residual path) and the DFlash2 golden drafter
// (the selector's sampled walk, q over its candidates).
TEST(SpecDecodeSampling, LosslessInDistribution) {
  SamplingSpec spec;
  spec.temperature = 0.8f;
  spec.top_k = 6;
  for (const std::string& name : {std::string("qwen3-tiny-a"), std::string("dflash2-tiny-a")}) {
    const std::string dir = std::string(DFLASH_TEST_DATA) + "/golden/" + name;
    const Ctx ctx = cpu_ctx();
    const TargetConfig tcfg = load_target_config(dir + "/target");
    TrainOptions opt;
    opt.max_anchors = 1;
    opt.block_size = 4;
    DrafterTrainer drafter(dir + "/target", name == "dflash2-tiny-a" ? dir + "/drafter_init" : std::string(), 1, opt,
                           ctx, 64);
    auto target = make_target_model(tcfg, dir + "/target", ctx, drafter.config().target_layer_ids, 64);
    SpecDecoder dec(*target, drafter, ctx, 64);
    const std::vector<int32_t> prompt = {3, 17, 42, 5, 9};
    // exact joint of the first two tokens
    const std::vector<double> p1 = target_next(*target, prompt, spec);
    std::map<std::pair<int32_t, int32_t>, double> exact;
    for (int32_t a = 0; a < static_cast<int32_t>(p1.size()); ++a) {
      if (p1[a] <= 0) continue;
      std::vector<int32_t> seq = prompt;
      seq.push_back(a);
      const std::vector<double> p2 = target_next(*target, seq, spec);
      for (int32_t b = 0; b < static_cast<int32_t>(p2.size()); ++b)
        if (p2[b] > 0) exact[{a, b}] = p1[a] * p2[b];
    }
    const int N = 3000;
    std::map<std::pair<int32_t, int32_t>, int> seen;
    int accepted_drafts = 0;
    for (int i = 0; i < N; ++i) {
      spec.seed = 1000 + static_cast<uint64_t>(i);
      dec.set_sampling(spec);
      // 3 new tokens: with 2, the official count keeps one token of the only step (its cut at the limit).
      const SpecDecodeResult r = dec.generate(prompt, 3, {});
      ASSERT_EQ(r.tokens.size(), 3u);
      ++seen[{r.tokens[0], r.tokens[1]}];
      accepted_drafts += r.acceptance[0] > 1;
    }
    for (const auto& [pair, n] : seen) EXPECT_TRUE(exact.count(pair)) << name << ": a pair the target never samples";
    int checked = 0;
    for (const auto& [pair, pe] : exact) {
      if (pe < 0.01) continue;
      ++checked;
      const double f = seen.count(pair) ? seen[pair] / double(N) : 0.0;
      EXPECT_NEAR(f, pe, 4.5 * std::sqrt(pe * (1 - pe) / N)) << name << ": pair " << pair.first << "," << pair.second;
    }
    EXPECT_GT(checked, 3) << name;
    std::printf("%s: %d pairs checked, drafts accepted in %d of %d first steps\n", name.c_str(), checked, accepted_drafts, N);
  }
}

}  // namespace
}  // namespace dflash
