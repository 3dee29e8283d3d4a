// Speculative decoding (include/dflash/spec_decode.h) on the golden tiny target: the output equals the
// target's own greedy decoding, and every step's acceptance length is accounted for.
#include <gtest/gtest.h>

#include <algorithm>
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
