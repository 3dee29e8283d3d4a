// A shortened draft block on CUDA (DrafterTrainer::draft_block with block_rows V < B: speculative decoding's
// last block, docs/recipe.md section 6; the CUDA drafter step's block attention with BlockAttnSpec::block_rows)
// against a CUDA drafter of block size V with the same weights and against the float32 CPU trainer's
// shortened block (tests/unit/test_draft_block_rows.cpp is the CPU's own check): the final-normed hidden rows
// 0..V-1 within tol::kDrafterHidden, the V-1 drafts equal up to tol::kArgmaxMismatches near-ties. The whole
// block of B rows must differ (the comparison could fail). DFlash (qwen3-tiny-a) and DFlash2
// (dflash2-tiny-a: convs, the selector's walk) golden drafters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "dflash/backend.h"
#include "dflash/drafter.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::gpu;
using test::rel_err;

std::string data_dir() {  // DFLASH_TEST_DATA in the environment wins (the binary may run in another checkout)
  const char* env = std::getenv("DFLASH_TEST_DATA");
  return env ? env : DFLASH_TEST_DATA;
}

// A copy of the drafter directory whose config.json says block size `block` (removed by the caller).
std::string with_block_size(const std::string& dir, int block) {
  std::string tmpl = "/tmp/dflash_gpu_block_rows_XXXXXX";
  const char* made = ::mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr);
  const std::string out = made ? made : "/tmp";
  std::filesystem::copy(dir, out, std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  nlohmann::json j;
  {
    std::ifstream f(out + "/config.json");
    f >> j;
  }
  if (j.contains("block_size")) j["block_size"] = block;
  if (j.contains("dflash_config") && j["dflash_config"].contains("block_size")) j["dflash_config"]["block_size"] = block;
  std::ofstream(out + "/config.json") << j.dump(2);
  return out;
}

struct Drafted {
  std::vector<int32_t> tokens;  // V - 1 drafts
  std::vector<float> hidden;    // hidden rows 0..V-1 [V, H], as float
};

// One sequence of anchor + (the drafter's block size) tokens; features a fixed function of (layer, position,
// channel), so any length holds the same values; BF16 on the device for a CUDA trainer.
Drafted draft(DrafterTrainer& d, const Ctx& ctx, int64_t anchor, int rows) {
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
  Buffer dev;
  if (ctx.device == Device::CUDA) {
    dev = Buffer(Device::CUDA, DType::BF16, {K, T, H});
    copy_tensor(ctx, dev, cpu_view(feat.data(), {K, T, H}));
    synchronize(ctx);
    fb.features = dev.t();
  } else {
    fb.features = cpu_view(feat.data(), {K, T, H});
  }
  Drafted out;
  out.tokens = d.draft_block(fb, anchor, rows);
  const Tensor hid = d.draft_hidden().slice_rows(0, rows);
  out.hidden.resize(static_cast<size_t>(rows * H));
  copy_tensor(ctx, cpu_view(out.hidden.data(), {rows, H}), hid);
  synchronize(ctx);
  return out;
}

int mismatches(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

TEST(GpuDraftBlockRows, AShortBlockIsADrafterOfThatBlockSize) {
  SKIP_WITHOUT_GPU();
  const Ctx g = gpu();
  for (const std::string& name : {std::string("qwen3-tiny-a"), std::string("dflash2-tiny-a")}) {
    const std::string dir = data_dir() + "/golden/" + name;
    TrainOptions opt;
    opt.max_anchors = 1;
    DrafterTrainer whole(dir + "/target", dir + "/drafter_init", 1, opt, g, 64);
    DrafterTrainer whole_cpu(dir + "/target", dir + "/drafter_init", 1, opt, cpu_ctx(), 64);
    const int B = whole.config().block_size;
    ASSERT_GE(B, 4) << name;
    const int64_t anchor = 9;
    for (int V : std::set<int>{2, B / 2 + 1, B - 1}) {
      const std::string dir_v = with_block_size(dir + "/drafter_init", V);
      DrafterTrainer of_v(dir + "/target", dir_v, 1, opt, g, 64);
      ASSERT_EQ(of_v.config().block_size, V);
      const Drafted shortened = draft(whole, g, anchor, V), reference = draft(of_v, g, anchor, V);
      const Drafted on_cpu = draft(whole_cpu, cpu_ctx(), anchor, V);
      ASSERT_EQ(shortened.tokens.size(), static_cast<size_t>(V - 1));
      const std::string what = name + ", V " + std::to_string(V);
      EXPECT_LT(rel_err(shortened.hidden, reference.hidden), test::tol::kDrafterHidden) << what;
      EXPECT_LE(mismatches(shortened.tokens, reference.tokens), test::tol::kArgmaxMismatches) << what;
      // bf16 against float32: the drafter-hidden budget, 1.5x for a block of one drafted row (V 2: the relative
      // error of one row of `hidden` values, not averaged over rows; 0.0217 measured on an H100, 2026-12-06).
      const double cpu_budget = (V == 2 ? 1.5 : 1.0) * test::tol::kDrafterHidden;
      EXPECT_LT(rel_err(shortened.hidden, on_cpu.hidden), cpu_budget) << what << " vs the CPU";
      EXPECT_LE(mismatches(shortened.tokens, on_cpu.tokens), test::tol::kArgmaxMismatches) << what << " vs the CPU";
      // Not vacuous: the whole block's first rows differ from a block of V (by 0.096 relative at the least,
      // float32 CPU: dflash2-tiny-a, V 7).
      std::vector<float> first = draft(whole, g, anchor, B).hidden;
      first.resize(reference.hidden.size());
      EXPECT_GT(rel_err(first, reference.hidden), 3 * test::tol::kDrafterHidden) << what;
      std::filesystem::remove_all(dir_v);
    }
  }
}

}  // namespace
}  // namespace dflash
