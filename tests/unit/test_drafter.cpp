// DrafterTrainer beyond the golden numbers: finite differences through the whole network (fc/hidden_norm
// path, a sliding-window drafter), release-format export/load, fresh drafters, rejection of a drafter that
// does not fit the target, noise, D-PACE.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dflash/drafter.h"
#include "dflash/safetensors.h"
#include "dflash/tensor.h"
#include "drafter/drafter_golden.h"

namespace {

namespace fs = std::filesystem;
using dflash::DrafterTrainer;
using dflash::StepStats;
using dflash::train::GoldenInputs;

const std::string kCase = std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a";

const GoldenInputs& golden() {
  static const GoldenInputs g = dflash::train::load_golden_inputs(kCase);
  return g;
}

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("dflash_drafter_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

const dflash::ParamSpec& param(const DrafterTrainer& tr, const std::string& name) {
  for (const auto& p : tr.param_layout())
    if (p.name == name) return p;
  throw std::runtime_error("no parameter " + name);
}

// Central differences of evaluate().loss (float32 network) against forward_backward's gradient, on the
// `count` largest-gradient entries of a parameter.
void fd_check(DrafterTrainer& tr, const std::string& name, int count, double eps, double tol) {
  const GoldenInputs& g = golden();
  const auto fb = g.feature_batch();
  tr.forward_backward(fb, g.anchors);
  const auto& p = param(tr, name);
  const float* grad = tr.grads().ptr<float>() + p.offset;
  std::vector<size_t> idx(p.numel());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::partial_sort(idx.begin(), idx.begin() + std::min<size_t>(count, idx.size()), idx.end(),
                    [&](size_t a, size_t b) { return std::fabs(grad[a]) > std::fabs(grad[b]); });
  std::vector<float> analytic(grad, grad + p.numel());
  float* w = tr.master_weights().ptr<float>() + p.offset;
  for (int c = 0; c < count && c < static_cast<int>(idx.size()); ++c) {
    const size_t i = idx[c];
    const float keep = w[i];
    w[i] = keep + static_cast<float>(eps);
    const double lp = tr.evaluate(fb, g.anchors).loss;
    w[i] = keep - static_cast<float>(eps);
    const double lm = tr.evaluate(fb, g.anchors).loss;
    w[i] = keep;
    const double numeric = (lp - lm) / (2 * eps);
    EXPECT_NEAR(analytic[i], numeric, tol * std::max(1e-3, std::fabs(numeric))) << name << "[" << i << "]";
  }
}

TEST(DrafterFiniteDiff, FcAndHiddenNormPathCe) {
  DrafterTrainer tr(golden().target_dir, golden().drafter_dir, 0, golden().opt, dflash::cpu_ctx(),
                    golden().batch.num_tokens());
  fd_check(tr, "fc.weight", 6, 1e-2, 2e-2);
  fd_check(tr, "hidden_norm.weight", 6, 1e-2, 2e-2);
  fd_check(tr, "layers.0.self_attn.k_proj.weight", 4, 1e-2, 2e-2);
}

TEST(DrafterFiniteDiff, FcAndHiddenNormPathKl) {
  auto opt = golden().opt;
  opt.loss = dflash::LossKind::KL;
  DrafterTrainer tr(golden().target_dir, golden().drafter_dir, 0, opt, dflash::cpu_ctx(), golden().batch.num_tokens());
  fd_check(tr, "fc.weight", 6, 1e-2, 2e-2);
  fd_check(tr, "hidden_norm.weight", 6, 1e-2, 2e-2);
}

// Writes a copy of drafter_init whose config.json is edited by `edit`.
std::string edited_drafter(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  const std::string dir = temp_dir(name);
  fs::copy_file(golden().drafter_dir + "/model.safetensors", dir + "/model.safetensors");
  std::ifstream in(golden().drafter_dir + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump(2);
  return dir;
}

TEST(DrafterFiniteDiff, SlidingWindowDrafter) {
  const std::string dir = edited_drafter("sliding", [](nlohmann::json& j) {
    j["layer_types"] = {"sliding_attention", "full_attention"};
    j["sliding_window"] = 3;
    j["use_sliding_window"] = true;
  });
  DrafterTrainer slide(golden().target_dir, dir, 0, golden().opt, dflash::cpu_ctx(), golden().batch.num_tokens());
  DrafterTrainer full(golden().target_dir, golden().drafter_dir, 0, golden().opt, dflash::cpu_ctx(),
                      golden().batch.num_tokens());
  const auto fb = golden().feature_batch();
  // the window changes what layer 0 sees
  EXPECT_GT(std::fabs(slide.evaluate(fb, golden().anchors).loss - full.evaluate(fb, golden().anchors).loss), 1e-6);
  fd_check(slide, "layers.0.self_attn.q_proj.weight", 4, 1e-2, 2e-2);
  fd_check(slide, "fc.weight", 4, 1e-2, 2e-2);
  fs::remove_all(dir);
}

TEST(DrafterRelease, ExportLoadRoundTripIsBitExactF32) {
  auto opt = golden().opt;
  DrafterTrainer tr(golden().target_dir, golden().drafter_dir, 0, opt, dflash::cpu_ctx(), golden().batch.num_tokens());
  tr.forward_backward(golden().feature_batch(), golden().anchors);
  tr.optimizer_step();  // weights that differ from the files we started from
  const std::string dir = temp_dir("export_f32");
  tr.export_release(dir + "/drafter", dflash::DType::F32);
  DrafterTrainer back(golden().target_dir, dir + "/drafter", 0, opt, dflash::cpu_ctx(), golden().batch.num_tokens());
  ASSERT_EQ(back.master_weights().numel(), tr.master_weights().numel());
  EXPECT_EQ(0, std::memcmp(back.master_weights().data, tr.master_weights().data, tr.master_weights().nbytes()));
  EXPECT_EQ(back.config().target_layer_ids, tr.config().target_layer_ids);
  EXPECT_EQ(back.config().mask_token_id, tr.config().mask_token_id);
  EXPECT_EQ(back.config().block_size, tr.config().block_size);
  // the exported config is the release format
  std::ifstream in(dir + "/drafter/config.json");
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("architectures")[0], "DFlashDraftModel");
  EXPECT_EQ(j.at("dflash_config").at("mask_token_id"), 511);
  fs::remove_all(dir);
}

TEST(DrafterRelease, Bf16ExportRoundsEachWeight) {
  DrafterTrainer tr(golden().target_dir, golden().drafter_dir, 0, golden().opt, dflash::cpu_ctx(),
                    golden().batch.num_tokens());
  const std::string dir = temp_dir("export_bf16");
  tr.export_release(dir, dflash::DType::BF16);
  DrafterTrainer back(golden().target_dir, dir, 0, golden().opt, dflash::cpu_ctx(), golden().batch.num_tokens());
  const float* a = tr.master_weights().ptr<float>();
  const float* b = back.master_weights().ptr<float>();
  for (size_t i = 0; i < tr.master_weights().numel(); ++i)
    ASSERT_EQ(b[i], dflash::bf16_to_f32(dflash::f32_to_bf16(a[i]))) << i;
  fs::remove_all(dir);
}

TEST(DrafterRelease, FreshDrafterFromTargetConfig) {
  auto opt = golden().opt;
  opt.block_size = 8;
  {
    DrafterTrainer three(golden().target_dir, "", 3, opt, dflash::cpu_ctx(), golden().batch.num_tokens());
    EXPECT_EQ(three.config().target_layer_ids, (std::vector<int>{1, 2, 3}));  // round(1 + i*(6-4)/2)
  }
  // two layers read layers [1, 3], as the golden features
  DrafterTrainer tr(golden().target_dir, "", 2, opt, dflash::cpu_ctx(), golden().batch.num_tokens());
  const auto& c = tr.config();
  EXPECT_EQ(c.layers.num_hidden_layers, 2);
  EXPECT_EQ(c.layers.hidden_size, 64);
  EXPECT_EQ(c.block_size, 8);
  EXPECT_EQ(c.mask_token_id, 511);  // vocab 512: the last id
  EXPECT_EQ(c.target_layer_ids, (std::vector<int>{1, 3}));
  double sum = 0, sq = 0;
  size_t n = 0;
  for (const auto& p : tr.param_layout()) {
    const float* w = tr.master_weights().ptr<float>() + p.offset;
    for (size_t i = 0; i < p.numel(); ++i) {
      if (p.is_norm()) {
        ASSERT_EQ(w[i], 1.0f) << p.name;
      } else {
        sum += w[i];
        sq += double(w[i]) * w[i];
        ++n;
      }
    }
  }
  EXPECT_NEAR(sum / n, 0.0, 2e-3);
  EXPECT_NEAR(std::sqrt(sq / n), 0.02, 1e-3);
  // the same seed gives the same drafter; it trains
  DrafterTrainer again(golden().target_dir, "", 2, opt, dflash::cpu_ctx(), golden().batch.num_tokens());
  EXPECT_EQ(0, std::memcmp(again.master_weights().data, tr.master_weights().data, tr.master_weights().nbytes()));
  const auto fb = golden().feature_batch();
  const double before = tr.evaluate(fb, golden().anchors).loss;
  EXPECT_TRUE(std::isfinite(before));
  for (int i = 0; i < 3; ++i) {
    tr.forward_backward(fb, golden().anchors);
    tr.optimizer_step();
  }
  EXPECT_LT(tr.evaluate(fb, golden().anchors).loss, before);
}

void expect_rejected(const std::string& name, const std::function<void(nlohmann::json&)>& edit,
                     const std::string& message) {
  const std::string dir = edited_drafter(name, edit);
  EXPECT_EXIT(DrafterTrainer(golden().target_dir, dir, 0, golden().opt, dflash::cpu_ctx(), 128),
              testing::ExitedWithCode(3), message)
      << name;
  fs::remove_all(dir);
}

TEST(DrafterRelease, RejectsDrafterThatDoesNotFitTheTarget) {
  expect_rejected("hidden", [](nlohmann::json& j) { j["hidden_size"] = 32; }, "hidden_size");
  expect_rejected("ids", [](nlohmann::json& j) { j["dflash_config"]["target_layer_ids"] = {1, 6}; }, "layer id");
  expect_rejected("block", [](nlohmann::json& j) { j["block_size"] = 1; }, "block_size");
  expect_rejected("mask", [](nlohmann::json& j) { j["dflash_config"]["mask_token_id"] = 512; }, "mask_token_id");
}

// The golden drafter with one tensor left out: exit 3 naming that tensor (not any failure to load).
TEST(DrafterRelease, ExtraLayerTensorsAreBadInput) {
  // A deeper drafter's weights under this config.json: its extra layer would be dropped silently.
  const std::string dir = temp_dir("extra");
  std::ofstream(dir + "/config.json") << std::ifstream(golden().drafter_dir + "/config.json").rdbuf();
  std::ifstream cfg(golden().drafter_dir + "/config.json");
  const int layers = nlohmann::json::parse(cfg).at("num_hidden_layers").get<int>();
  const std::string extra = "layers." + std::to_string(layers) + ".mlp.down_proj.weight";
  {
    dflash::SafetensorsFile src(golden().drafter_dir + "/model.safetensors");
    std::vector<dflash::TensorToWrite> all;
    for (const std::string& n : src.names()) {
      const dflash::TensorInfo& t = src.get(n);
      all.push_back({n, t.dtype, t.shape, nullptr, t.data});
    }
    const dflash::TensorInfo& copy = src.get("layers.0.mlp.down_proj.weight");
    all.push_back({extra, copy.dtype, copy.shape, nullptr, copy.data});
    dflash::write_safetensors(dir + "/model.safetensors", all);
  }
  EXPECT_EXIT(DrafterTrainer(golden().target_dir, dir, 0, golden().opt, dflash::cpu_ctx(), 128),
              testing::ExitedWithCode(3), "belongs to layer " + std::to_string(layers));
  fs::remove_all(dir);
}

TEST(DrafterRelease, MissingTensorIsBadInput) {
  const std::string dir = temp_dir("missing");
  std::ofstream(dir + "/config.json") << std::ifstream(golden().drafter_dir + "/config.json").rdbuf();
  const std::string dropped = "layers.1.mlp.down_proj.weight";
  {
    dflash::SafetensorsFile src(golden().drafter_dir + "/model.safetensors");
    ASSERT_TRUE(src.has(dropped)) << "the golden drafter changed: pick another tensor to drop";
    std::vector<dflash::TensorToWrite> keep;
    for (const std::string& n : src.names()) {
      if (n == dropped) continue;
      const dflash::TensorInfo& t = src.get(n);
      keep.push_back({n, t.dtype, t.shape, nullptr, t.data});
    }
    dflash::write_safetensors(dir + "/model.safetensors", keep);
  }
  EXPECT_EXIT(DrafterTrainer(golden().target_dir, dir, 0, golden().opt, dflash::cpu_ctx(), 128),
              testing::ExitedWithCode(3), dropped);
  fs::remove_all(dir);
}

TEST(DrafterTraining, NoiseOnlyInTrainingAndResumableRng) {
  auto opt = golden().opt;
  opt.hs_noise = 0.5f;
  DrafterTrainer tr(golden().target_dir, golden().drafter_dir, 0, opt, dflash::cpu_ctx(), golden().batch.num_tokens());
  const auto fb = golden().feature_batch();
  const auto& an = golden().anchors;
  const double clean = tr.evaluate(fb, an).loss;
  EXPECT_EQ(clean, tr.evaluate(fb, an).loss);  // evaluation is deterministic, without noise
  const std::string state = tr.rng_state();
  const StepStats a = tr.forward_backward(fb, an);
  EXPECT_NE(a.loss, clean);
  EXPECT_FLOAT_EQ(a.noise, 0.5f);
  std::vector<float> ga(static_cast<const float*>(tr.grads().data),
                        static_cast<const float*>(tr.grads().data) + tr.grads().numel());
  tr.set_rng_state(state);
  const StepStats b = tr.forward_backward(fb, an);
  EXPECT_EQ(a.loss, b.loss);  // same noise again
  EXPECT_EQ(0, std::memcmp(ga.data(), tr.grads().data, tr.grads().nbytes()));
}

TEST(DrafterTraining, SampledAnchorsAndDpace) {
  auto opt = golden().opt;
  opt.max_anchors = 10;
  DrafterTrainer plain(golden().target_dir, golden().drafter_dir, 0, opt, dflash::cpu_ctx(),
                       golden().batch.num_tokens());
  opt.dpace = true;
  DrafterTrainer dp(golden().target_dir, golden().drafter_dir, 0, opt, dflash::cpu_ctx(), golden().batch.num_tokens());
  const auto fb = golden().feature_batch();
  const StepStats s1 = plain.forward_backward(fb);  // same seed: same anchors
  const StepStats s2 = dp.forward_backward(fb);
  EXPECT_EQ(s1.anchors, 10);
  EXPECT_DOUBLE_EQ(s1.loss, s2.loss);  // the reported loss is the decay-weighted objective either way
  double diff = 0, norm = 0;
  const float* g1 = plain.grads().ptr<float>();
  const float* g2 = dp.grads().ptr<float>();
  for (size_t i = 0; i < plain.grads().numel(); ++i) {
    ASSERT_TRUE(std::isfinite(g2[i]));
    diff += (g1[i] - g2[i]) * double(g1[i] - g2[i]);
    norm += g1[i] * double(g1[i]);
  }
  EXPECT_GT(std::sqrt(diff / norm), 1e-3);  // D-PACE re-weights the positions
  // several D-PACE steps lower the loss on these anchors
  const std::vector<int64_t> ten(golden().anchors.begin(), golden().anchors.begin() + 10);
  for (int i = 0; i < 5; ++i) {
    dp.forward_backward(fb, ten);
    dp.optimizer_step();
  }
  EXPECT_LT(dp.evaluate(fb, ten).loss, plain.evaluate(fb, ten).loss);
}

}  // namespace

// A non-finite loss caused by the target's features names the target (exit 6, a target problem), not the
// drafter's learning rate; one on clean features keeps the --lr hint.
TEST(DrafterTrainingDeath, NonFiniteFeaturesAreATargetProblem) {
  GoldenInputs g = golden();
  const int64_t T = g.batch.num_tokens();
  g.features[g.features.size() / 2] = NAN;  // one value of one captured layer
  const dflash::FeatureBatch fb = g.feature_batch();
  DrafterTrainer tr(g.target_dir, g.drafter_dir, 0, g.opt, dflash::cpu_ctx(), T);
  EXPECT_EXIT(tr.forward_backward(fb, g.anchors), testing::ExitedWithCode(6),
              "the target's features for this batch hold 1 non-finite value.*a target problem");
}
