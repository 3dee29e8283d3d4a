// A fresh drafter's recipe from dflash-train's options (--block-size, --mask-token, --target-layers,
// --draft-layer-types, --draft-sliding-window): parsed, resolved (a mask token looked up in the target's
// tokenizer.json), turned into the drafter config, and each impossible combination refused with exit 2.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "dflash/drafter.h"
#include "dflash/hf_config.h"
#include "dflash/options.h"
#include "test_support.h"

using namespace dflash;

namespace {

const std::string kTarget = std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a/target";  // 6 layers, vocab 512

Options parse(std::vector<std::string> extra, const std::string& target = kTarget) {
  std::vector<std::string> args = {"dflash-train", "--target", target, "--data", "D.h5", "--out", "O"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_options(static_cast<int>(argv.size()), argv.data()).options;
}

Qwen3Config tiny() { return load_qwen3_config(kTarget + "/config.json"); }

}  // namespace

TEST(DrafterRecipe, DefaultsAreDFlashs) {
  const Options o = parse({"--draft-layers", "2"});
  const DrafterConfig d = fresh_drafter_config(tiny(), o.draft_layers, o.train);
  EXPECT_EQ(d.block_size, 16);
  EXPECT_EQ(d.mask_token_id, 511);  // vocab 512: not a Qwen family vocabulary, so vocab - 1
  EXPECT_EQ(d.target_layer_ids, default_target_layer_ids(6, 2));
  EXPECT_EQ(d.layers.layer_types, std::vector<std::string>(2, "full_attention"));
  EXPECT_EQ(d.layers.sliding_window, 0);
}

// The Qwen3.6-27B recipe's shape, scaled to the tiny target: sliding layers, a full last layer, chosen
// target layers, a block size and a mask token id; and it survives the release format's config.json.
TEST(DrafterRecipe, SlidingLayersTargetLayersBlockAndMask) {
  const Options o = parse({"--draft-layers", "3", "--draft-layer-types", "sliding, sliding,full", "--draft-sliding-window",
                           "32", "--target-layers", "0,2,5", "--block-size", "8", "--mask-token", "7"});
  const DrafterConfig d = fresh_drafter_config(tiny(), o.draft_layers, o.train);
  EXPECT_EQ(d.layers.layer_types,
            (std::vector<std::string>{"sliding_attention", "sliding_attention", "full_attention"}));
  EXPECT_EQ(d.layers.sliding_window, 32);
  EXPECT_EQ(d.target_layer_ids, (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(d.block_size, 8);
  EXPECT_EQ(d.mask_token_id, 7);
  const DrafterConfig back = parse_drafter_config(drafter_config_to_json(d), "export");
  EXPECT_EQ(back.layers.layer_types, d.layers.layer_types);
  EXPECT_EQ(back.layers.sliding_window, 32);
  EXPECT_EQ(back.target_layer_ids, d.target_layer_ids);
  EXPECT_EQ(back.block_size, 8);
  EXPECT_EQ(back.mask_token_id, 7);
}

TEST(DrafterRecipe, MaskTokenFromTheTargetsTokenizer) {
  const std::string dir = test::make_temp_dir("dflash-recipe-");
  std::filesystem::copy_file(kTarget + "/config.json", dir + "/config.json");
  std::ofstream(dir + "/tokenizer.json") << R"({"added_tokens": [{"id": 300, "content": "<|mask|>"}],
    "model": {"vocab": {"hello": 12}}})";
  EXPECT_EQ(parse({"--mask-token", "<|mask|>"}, dir).train.mask_token_id, 300);
  EXPECT_EQ(parse({"--mask-token", "hello"}, dir).train.mask_token_id, 12);
  EXPECT_EQ(parse({"--mask-token", "auto"}, dir).train.mask_token_id, -1);
  EXPECT_EXIT(parse({"--mask-token", "<|nope|>"}, dir), testing::ExitedWithCode(2), "not a token of");
  EXPECT_EXIT(parse({"--mask-token", "<|mask|>"}), testing::ExitedWithCode(2), "no .*tokenizer.json");
  std::ofstream(dir + "/tokenizer.json") << "{broken";
  EXPECT_EXIT(parse({"--mask-token", "<|mask|>"}, dir), testing::ExitedWithCode(3), "tokenizer.json is not valid JSON");
}

TEST(DrafterRecipeDeath, ImpossibleRecipesAreRefused) {
  auto fresh = [](std::vector<std::string> args) {
    const Options o = parse(args);
    fresh_drafter_config(tiny(), o.draft_layers, o.train);
  };
  EXPECT_EXIT(parse({"--drafter", "X", "--block-size", "8"}), testing::ExitedWithCode(2),
              "--block-size describes a fresh drafter");
  EXPECT_EXIT(parse({"--draft-layer-types", "full,diagonal"}), testing::ExitedWithCode(2), "'diagonal' is not full or sliding");
  EXPECT_EXIT(parse({"--target-layers", "1,x"}), testing::ExitedWithCode(2), "'x' is not a layer number");
  EXPECT_EXIT(parse({"--block-size", "1"}), testing::ExitedWithCode(2), "block-size 1");
  EXPECT_EXIT(fresh({"--draft-layers", "2", "--draft-layer-types", "sliding"}), testing::ExitedWithCode(2),
              "names 1 layers for a drafter of 2");
  EXPECT_EXIT(fresh({"--draft-layers", "1", "--draft-layer-types", "sliding"}), testing::ExitedWithCode(2),
              "need --draft-sliding-window");
  EXPECT_EXIT(fresh({"--draft-layers", "1", "--draft-sliding-window", "64"}), testing::ExitedWithCode(2),
              "without a sliding layer");
  EXPECT_EXIT(fresh({"--draft-layers", "1", "--target-layers", "1,6"}), testing::ExitedWithCode(2),
              "layer 6 is not one of the target's 6 layers");
}

// Issue 47: the selector's candidates (strict by default, as SpecForge now) and its schedule's ratios.
TEST(DrafterRecipe, SelectorCandidatesAndSchedule) {
  const Options d = parse({"--draft-arch", "dflash2"});
  EXPECT_EQ(d.train.selector_candidates, SelectorCandidates::Strict);
  EXPECT_EQ(d.train.selector_warmup_ratio, 0.0);
  EXPECT_EQ(d.train.selector_ramp_ratio, 0.0);
  const Options o = parse({"--draft-arch", "dflash2", "--selector-candidates", "insert", "--selector-warmup-ratio",
                           "0.0005", "--selector-ramp-ratio", "0.25"});
  EXPECT_EQ(o.train.selector_candidates, SelectorCandidates::Insert);
  EXPECT_EQ(o.train.selector_warmup_ratio, 0.0005);  // a double: int(total * ratio) as Python's
  EXPECT_EQ(o.train.selector_ramp_ratio, 0.25);
}

TEST(DrafterRecipeDeath, SelectorOptionsOutOfRange) {
  EXPECT_EXIT(parse({"--selector-candidates", "gold"}), testing::ExitedWithCode(2), "selector-candidates");
  EXPECT_EXIT(parse({"--selector-warmup-ratio", "1.5"}), testing::ExitedWithCode(2), "selector-warmup-ratio");
  EXPECT_EXIT(parse({"--selector-ramp-ratio", "-0.1"}), testing::ExitedWithCode(2), "selector-ramp-ratio");
}

// A fresh DFlash2 drafter starts with a zero successor codebook and zero conv projections (exact no-ops: the
// reference's init), the predecessor codebook and hidden projection random.
TEST(DrafterRecipe, FreshDFlash2SelectorStartsAsANoOp) {
  const Options o = parse({"--draft-arch", "dflash2", "--draft-layers", "1", "--block-size", "4", "--selector-rank", "4",
                           "--selector-top-k", "4", "--conv-group-size", "8"});
  const DrafterConfig d = fresh_drafter_config(tiny(), o.draft_layers, o.train);
  ASSERT_EQ(d.arch, DraftArch::DFlash2);
  std::vector<float> flat(drafter_param_count(d), 1.f);
  init_drafter_weights(d, 7, flat.data());
  for (const ParamSpec& p : drafter_param_layout(d)) {
    double sum_abs = 0;
    for (size_t i = 0; i < p.numel(); ++i) sum_abs += std::fabs(flat[p.offset + i]);
    if (p.name == "candidate_selector.successor_codebook" || p.is_conv_projection())
      EXPECT_EQ(sum_abs, 0.0) << p.name;
    else
      EXPECT_GT(sum_abs, 0.0) << p.name;
  }
}

// --draft-heads/--draft-head-dim/--draft-kv-heads (issue 47): a fresh drafter of another head shape than the
// target's (tiny target: 4 heads x 24, 2 KV heads); its config.json says the new heads; 0 keeps the target's.
TEST(DrafterRecipe, DraftHeadsOtherThanTheTargets) {
  const DrafterConfig same = fresh_drafter_config(tiny(), 1, parse({}).train);
  EXPECT_EQ(same.layers.num_attention_heads, tiny().num_attention_heads);
  EXPECT_EQ(same.layers.head_dim, tiny().head_dim);
  const Options o = parse({"--draft-layers", "2", "--draft-heads", "6", "--draft-head-dim", "8", "--draft-kv-heads", "3"});
  const DrafterConfig d = fresh_drafter_config(tiny(), o.draft_layers, o.train);
  EXPECT_EQ(d.layers.num_attention_heads, 6);
  EXPECT_EQ(d.layers.head_dim, 8);
  EXPECT_EQ(d.layers.num_key_value_heads, 3);
  const nlohmann::json j = drafter_config_to_json(d);
  EXPECT_EQ(j.at("num_attention_heads").get<int>(), 6);
  EXPECT_EQ(j.at("head_dim").get<int>(), 8);
  EXPECT_EQ(j.at("num_key_value_heads").get<int>(), 3);
  for (const ParamSpec& p : drafter_param_layout(d))
    if (p.name == "layers.0.self_attn.q_proj.weight") EXPECT_EQ(p.shape, (std::vector<int64_t>{48, tiny().hidden_size}));
}

TEST(DrafterRecipeDeath, DraftHeadsThatCannotBeBuilt) {
  auto fresh = [](std::vector<std::string> args) {
    const Options o = parse(args);
    fresh_drafter_config(tiny(), o.draft_layers, o.train);
  };
  EXPECT_EXIT(fresh({"--draft-heads", "6", "--draft-kv-heads", "4"}), testing::ExitedWithCode(2), "not a multiple");
  EXPECT_EXIT(fresh({"--draft-head-dim", "7"}), testing::ExitedWithCode(2), "must be even");
  EXPECT_EXIT(parse({"--drafter", "X", "--draft-heads", "8"}), testing::ExitedWithCode(2), "--draft-heads describes a fresh drafter");
}
