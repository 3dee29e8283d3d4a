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
      // Steps run while fewer than max_new tokens follow the prefill's (the reference's loop condition).
      ASSERT_FALSE(r.acceptance.empty());
      EXPECT_GE(sum, max_new);
      EXPECT_LT(sum - r.acceptance.back(), max_new);
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
      const SpecDecodeResult r = dec.generate(prompt, 2, {});
      ASSERT_EQ(r.tokens.size(), 2u);
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
