// Batched speculative decoding (SpecDecoder::generate_batch, include/dflash/spec_decode.h): prompts decoding
// together in one packed target forward per step give, prompt by prompt, the tokens and acceptance lengths
// of decoding each alone (bit for bit on the CPU backend), greedy and sampled.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "dflash/drafter.h"
#include "dflash/spec_decode.h"
#include "test_support.h"

namespace dflash {
namespace {

std::string golden(const std::string& name) { return std::string(DFLASH_TEST_DATA) + "/golden/" + name; }

// Runs the target over `seqs` packed into one batch; returns each sequence's features then final_norm rows.
std::vector<std::vector<float>> packed_rows(TargetModel& t, const std::vector<std::vector<int32_t>>& seqs) {
  const int64_t H = t.config().hidden_size, k = static_cast<int64_t>(t.capture_layers().size());
  PackedBatch b;
  b.cu_seqlens = {0};
  for (const auto& s : seqs) {
    b.tokens.insert(b.tokens.end(), s.begin(), s.end());
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
  }
  const int64_t T = b.num_tokens();
  b.loss_mask.assign(static_cast<size_t>(T), 0);
  std::vector<float> feat(static_cast<size_t>(k * T * H)), fn(static_cast<size_t>(T * H));
  CaptureOut out;
  out.features = cpu_view(feat.data(), {k, T, H});
  out.final_norm = cpu_view(fn.data(), {T, H});
  t.forward(b, out);
  std::vector<std::vector<float>> rows;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t a = b.cu_seqlens[i], e = b.cu_seqlens[i + 1];
    std::vector<float> r;
    for (int64_t j = 0; j < k; ++j)
      r.insert(r.end(), feat.begin() + (j * T + a) * H, feat.begin() + (j * T + e) * H);
    r.insert(r.end(), fn.begin() + a * H, fn.begin() + e * H);
    rows.push_back(std::move(r));
  }
  return rows;
}

// Why batching is exact on the CPU: a sequence's captured rows do not depend on what else is packed with it
// (the matmuls reduce each row on its own, attention and the recurrences run per sequence), bit for bit;
// and lm_head's rows do not depend on how many are computed together.
TEST(SpecDecodeBatch, CpuTargetRowsDoNotDependOnThePacking) {
  const Ctx ctx = cpu_ctx();
  for (const std::string& name : {std::string("qwen3-tiny-a"), std::string("qwen35-tiny-a")}) {
    const TargetConfig tcfg = load_target_config(golden(name) + "/target");
    const int L = tcfg.text.num_hidden_layers;
    auto target = make_target_model(tcfg, golden(name) + "/target", ctx, {0, L - 1}, 256);
    const std::vector<int32_t> a = {3, 17, 42, 5, 9, 11, 2}, b = {7, 7, 1}, c = {30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40};
    const auto alone = packed_rows(*target, {a});
    const auto packed = packed_rows(*target, {b, a, c});
    const auto other = packed_rows(*target, {c, c, b, a});
    ASSERT_EQ(alone[0].size(), packed[1].size());
    EXPECT_EQ(std::memcmp(alone[0].data(), packed[1].data(), alone[0].size() * sizeof(float)), 0) << name;
    EXPECT_EQ(std::memcmp(alone[0].data(), other[3].data(), alone[0].size() * sizeof(float)), 0) << name;
    // lm_head: row 0 of a 1-row product equals row 0 of a 9-row one
    const int64_t H = tcfg.text.hidden_size, V = tcfg.text.vocab_size;
    std::vector<float> fn(static_cast<size_t>(9 * H)), one(static_cast<size_t>(V)), nine(static_cast<size_t>(9 * V));
    for (size_t i = 0; i < fn.size(); ++i) fn[i] = static_cast<float>((i * 37 % 101) - 50) / 50.f;
    target->lm_head_forward(cpu_view(one.data(), {1, V}), cpu_view(fn.data() + 4 * H, {1, H}));
    target->lm_head_forward(cpu_view(nine.data(), {9, V}), cpu_view(fn.data(), {9, H}));
    EXPECT_EQ(std::memcmp(one.data(), nine.data() + 4 * V, static_cast<size_t>(V) * sizeof(float)), 0) << name;
  }
}

struct Case {
  std::string name;  // golden case: its target and drafter_init
  std::vector<std::vector<int32_t>> prompts;
  int max_new = 24;
};

// Prompts of different lengths (1 to 20 tokens): they finish at different steps.
std::vector<std::vector<int32_t>> mixed_prompts() {
  std::vector<std::vector<int32_t>> p;
  for (int len : {6, 1, 13, 4, 20, 9, 2, 15}) {
    std::vector<int32_t> s;
    for (int i = 0; i < len; ++i) s.push_back(static_cast<int32_t>((len * 31 + i * 17) % 200 + 3));
    p.push_back(s);
  }
  return p;
}

std::vector<DecodePrompt> all_of(const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<DecodePrompt> d;
  for (size_t i = 0; i < prompts.size(); ++i) d.push_back({&prompts[i], i});
  return d;
}

// Decodes every prompt with prompt_batch 1 (one after another, the sequential path), with 3 together in a
// packed forward too small for 3 of the longest (prompts wait for room), and with all together (the drafter
// takes 4 blocks a forward: greedy lanes draft in groups of up to 4); the tokens and acceptance lengths
// must be the same, prompt by prompt, bit for bit. Greedy, then sampled.
void expect_batched_equals_sequential(const SamplingSpec& sampling) {
  const Ctx ctx = cpu_ctx();
  const std::vector<std::vector<int32_t>> prompts = mixed_prompts();
  const int max_new = 24;
  for (const std::string& name : {std::string("qwen3-tiny-a"), std::string("dflash2-tiny-a")}) {
    SCOPED_TRACE(name + (sampling.temperature > 0 ? " sampled" : " greedy"));
    const std::string dir = golden(name);
    const TargetConfig tcfg = load_target_config(dir + "/target");
    TrainOptions opt;
    opt.max_anchors = 4;  // the lanes of a step draft up to 4 in one drafter forward
    DrafterTrainer drafter(dir + "/target", dir + "/drafter_init", 1, opt, ctx, 1024);
    const int B = drafter.config().block_size;
    const int64_t max_tokens = 20 + max_new + B;
    std::vector<size_t> lengths;
    for (const auto& p : prompts) lengths.push_back(p.size());
    const int64_t all = packed_tokens_for(lengths, max_new, 16, 1 << 20, "test");
    auto target = make_target_model(tcfg, dir + "/target", ctx, drafter.config().target_layer_ids, all);
    // A stop token from the middle of prompt 0's greedy output: some prompts stop early, others run to the limit.
    SpecDecoder seq(*target, drafter, ctx, max_tokens, 0, 1);
    const std::vector<int32_t> g = seq.greedy(prompts[0], max_new, {});
    const std::vector<int32_t> stop = {g[g.size() / 2]};
    seq.set_sampling(sampling);
    const std::vector<SpecDecodeResult> want = seq.generate_batch(all_of(prompts), max_new, stop);
    // the first prompt alone (stream 0) through generate() is the same too
    const SpecDecodeResult first = seq.generate(prompts[0], max_new, stop);
    EXPECT_EQ(first.tokens, want[0].tokens);
    EXPECT_EQ(first.acceptance, want[0].acceptance);
    size_t shortest = max_new, longest = 0;
    int multi = 0;
    for (const SpecDecodeResult& r : want) {
      shortest = std::min(shortest, r.tokens.size());
      longest = std::max(longest, r.tokens.size());
      for (int a : r.acceptance) multi += a > 1;
    }
    EXPECT_LT(shortest, static_cast<size_t>(max_new)) << "no prompt stopped early";
    EXPECT_EQ(longest, static_cast<size_t>(max_new)) << "every prompt stopped early";
    std::printf("%s: %zu to %zu new tokens; %d steps kept more than one token\n", name.c_str(), shortest, longest, multi);
    const int64_t three = packed_tokens_for({20, 15, 13}, max_new, 3, 1 << 20, "test") - 20;  // 3 of the longest do not fit
    for (const auto& [batch, packed] : std::vector<std::pair<int, int64_t>>{{3, three}, {16, all}}) {
      SpecDecoder dec(*target, drafter, ctx, max_tokens, packed, batch);
      dec.set_sampling(sampling);
      const std::vector<SpecDecodeResult> got = dec.generate_batch(all_of(prompts), max_new, stop);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i << ", " << batch << " at a time";
        EXPECT_EQ(got[i].acceptance, want[i].acceptance) << "prompt " << i << ", " << batch << " at a time";
        EXPECT_EQ(got[i].tau(), want[i].tau());
      }
      if (sampling.temperature <= 0)  // lossless: the target's own greedy tokens
        for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].tokens, seq.greedy(prompts[i], max_new, stop)) << i;
    }
  }
}

TEST(SpecDecodeBatch, GreedyBatchedEqualsSequential) { expect_batched_equals_sequential(SamplingSpec{}); }

TEST(SpecDecodeBatch, SampledBatchedEqualsSequential) {
  SamplingSpec s;
  s.temperature = 0.8f;
  s.top_k = 6;
  s.seed = 11;
  expect_batched_equals_sequential(s);
}

// The whole vocabulary (no top-k / top-p: sampling_probs' direct path, the one dflash-eval runs at T = 1),
// where DFlash's drafts come from one lm_head over every lane's block and each lane draws on a host thread.
TEST(SpecDecodeBatch, SampledWholeVocabularyBatchedEqualsSequential) {
  SamplingSpec s;
  s.temperature = 1.0f;
  s.seed = 5;
  expect_batched_equals_sequential(s);
}

// A prompt's draws depend on its stream, not on its neighbours: decoding prompt 2 alone with stream 2
// gives what it got among the others; with another stream, other draws.
TEST(SpecDecodeBatch, SampledStreamsArePerPrompt) {
  EXPECT_NE(prompt_seed(5, 0), prompt_seed(5, 1));
  EXPECT_NE(prompt_seed(5, 1), prompt_seed(6, 0));
  const Ctx ctx = cpu_ctx();
  const std::string dir = golden("qwen3-tiny-a");
  TrainOptions opt;
  opt.max_anchors = 1;
  DrafterTrainer drafter(dir + "/target", dir + "/drafter_init", 1, opt, ctx, 128);
  auto target = make_target_model(load_target_config(dir + "/target"), dir + "/target", ctx,
                                  drafter.config().target_layer_ids, 1024);
  SpecDecoder dec(*target, drafter, ctx, 128, 1024, 8);
  SamplingSpec s;
  s.temperature = 1.0f;
  s.seed = 3;
  dec.set_sampling(s);
  const std::vector<std::vector<int32_t>> prompts = mixed_prompts();
  const std::vector<SpecDecodeResult> all = dec.generate_batch(all_of(prompts), 24, {});
  const SpecDecodeResult alone = dec.generate_batch({{&prompts[2], 2}}, 24, {})[0];
  EXPECT_EQ(alone.tokens, all[2].tokens);
  EXPECT_EQ(alone.acceptance, all[2].acceptance);
  EXPECT_NE(dec.generate_batch({{&prompts[2], 9}}, 24, {})[0].tokens, all[2].tokens);
}

}  // namespace
}  // namespace dflash
