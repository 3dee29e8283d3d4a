// A shortened draft block (DrafterTrainer::draft_block with block_rows V < B: speculative decoding's last
// block, which the official dflash_generate shortens to the tokens left, docs/recipe.md section 6) is what a
// drafter of block size V with the same weights drafts: the same V-1 tokens, the same hidden rows. The whole
// block of B rows gives other hidden rows (so the comparison can fail). DFlash (qwen3-tiny-a) and DFlash2
// (dflash2-tiny-a: convs and the selector's walk) golden drafters.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/drafter.h"
#include "test_support.h"

namespace dflash {
namespace {

// A copy of the drafter directory whose config.json says block size `block` (top level for DFlash,
// dflash_config for DFlash2, wherever it is given).
std::string with_block_size(const std::string& dir, int block) {
  const std::string out = test::make_temp_dir("dflash_block_rows_");
  std::filesystem::copy(dir, out, std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  nlohmann::json j;
  {
    std::ifstream f(out + "/config.json");
    f >> j;
  }
  bool set = false;
  if (j.contains("block_size")) j["block_size"] = block, set = true;
  if (j.contains("dflash_config") && j["dflash_config"].contains("block_size")) j["dflash_config"]["block_size"] = block, set = true;
  EXPECT_TRUE(set) << dir << "/config.json has no block_size";
  std::ofstream(out + "/config.json") << j.dump(2);
  return out;
}

struct Drafted {
  std::vector<int32_t> tokens;  // V - 1 drafts
  std::vector<float> hidden;    // hidden rows 0..V-1 [V, H]
};

// One sequence of anchor + (the drafter's block size) tokens, features a fixed function of (layer, position,
// channel) so that any length holds the same values; the drafter's block of `rows` rows at `anchor`.
Drafted draft(DrafterTrainer& d, int64_t anchor, int rows) {
  const DrafterConfig& c = d.config();
  const int64_t B = c.block_size, T = anchor + B, H = c.layers.hidden_size;
  const int64_t K = static_cast<int64_t>(c.target_layer_ids.size());
  PackedBatch batch;
  for (int64_t t = 0; t < T; ++t) batch.tokens.push_back(t <= anchor ? static_cast<int32_t>(17 * t + 5) % 200 : c.mask_token_id);
  batch.cu_seqlens = {0, static_cast<int32_t>(T)};
  batch.loss_mask.assign(static_cast<size_t>(T), 0);
  std::fill(batch.loss_mask.begin() + anchor + 1, batch.loss_mask.end(), uint8_t{1});
  std::vector<float> feat(static_cast<size_t>(K * T * H));
  for (int64_t l = 0; l < K; ++l)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        feat[static_cast<size_t>((l * T + t) * H + h)] = std::sin(0.37f * static_cast<float>(h + 1) * static_cast<float>(t + 1) + 1.3f * l);
  FeatureBatch fb;
  fb.batch = &batch;
  fb.features = cpu_view(feat.data(), {K, T, H});
  Drafted out;
  out.tokens = d.draft_block(fb, anchor, rows);
  const Tensor hid = d.draft_hidden();
  const float* p = hid.ptr<float>();
  out.hidden.assign(p, p + rows * H);
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

TEST(DraftBlockRows, AShortBlockIsADrafterOfThatBlockSize) {
  for (const std::string& name : {std::string("qwen3-tiny-a"), std::string("dflash2-tiny-a")}) {
    const std::string dir = std::string(DFLASH_TEST_DATA) + "/golden/" + name;
    const Ctx ctx = cpu_ctx();
    TrainOptions opt;
    opt.max_anchors = 1;
    DrafterTrainer whole(dir + "/target", dir + "/drafter_init", 1, opt, ctx, 64);
    const int B = whole.config().block_size;
    ASSERT_GE(B, 4) << name;
    for (int V : std::set<int>{2, B / 2 + 1, B - 1}) {
      DrafterTrainer of_v(dir + "/target", with_block_size(dir + "/drafter_init", V), 1, opt, ctx, 64);
      ASSERT_EQ(of_v.config().block_size, V);
      const int64_t anchor = 9;
      const Drafted shortened = draft(whole, anchor, V), reference = draft(of_v, anchor, V);
      ASSERT_EQ(shortened.tokens.size(), static_cast<size_t>(V - 1));
      EXPECT_EQ(shortened.tokens, reference.tokens) << name << ", V " << V;
      EXPECT_LT(max_diff(shortened.hidden, reference.hidden), 1e-5) << name << ", V " << V;
      // The whole block drafts from other hidden rows: its later rows are visible to the first ones.
      std::vector<float> first = draft(whole, anchor, B).hidden;
      first.resize(reference.hidden.size());
      EXPECT_GT(max_diff(first, reference.hidden), 1e-3) << name << ", V " << V;
    }
  }
}

}  // namespace
}  // namespace dflash
