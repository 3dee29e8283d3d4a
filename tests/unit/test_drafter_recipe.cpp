// A fresh drafter's recipe from dflash-train's options (--block-size, --mask-token, --target-layers,
// --draft-layer-types, --draft-sliding-window): parsed, resolved (a mask token looked up in the target's
// tokenizer.json), turned into the drafter config, and each impossible combination refused with exit 2.
#include <gtest/gtest.h>

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
