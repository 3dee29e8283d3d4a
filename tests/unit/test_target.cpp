// The Qwen3 target forward on the CPU backend against the golden case (HF transformers in float64),
// packing invariance, 16-bit checkpoints, and the loader's refusals.
#include <gtest/gtest.h>

#include <ostream>
#include <unistd.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "dflash/safetensors.h"
#include "dflash/target.h"
#include "model/capture_stack.h"
#include "ops_test_util.h"
#include "target_golden.h"
#include "test_support.h"

namespace dflash {
// Readable parameter values for gtest (and the ctest names made from them): "BF16", not "1-byte object <02>".
void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
namespace {

const std::string kCase = std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a";
const std::string kTargetDir = kCase + "/target";

using test::all_layers;
using test::load_target;
using test::read_f32;
using test::read_i32;
using test::run_target;
using test::RunResult;
using test::TensorCopy;

PackedBatch golden_batch() { return test::golden_batch(kCase); }
std::string make_temp_dir() { return test::make_temp_dir("dflash_target_"); }

// Writes a copy of the golden target into dir as one model.safetensors in `dtype`; `edit` may drop or
// reshape tensors on the way.
void write_target_copy(const std::string& dir, DType dtype,
                       const std::function<void(std::vector<TensorCopy>&)>& edit = nullptr) {
  std::filesystem::copy_file(kTargetDir + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  test::write_checkpoint_copy(kTargetDir, dir, dtype, nullptr, edit);
}

// ---- config and factory ----------------------------------------------------------------------------

TEST(TargetConfig, DenseGoldenFamilyAndWidths) {
  const TargetConfig c = load_target_config(kTargetDir);
  EXPECT_EQ(c.family, TargetFamily::Qwen3);
  EXPECT_STREQ(target_family_name(c.family), "qwen3");
  EXPECT_EQ(c.qwen35, nullptr);
  EXPECT_EQ(c.text.num_hidden_layers, 6);
  EXPECT_EQ(c.text.hidden_size, 64);
  EXPECT_EQ(c.text.vocab_size, 512);
  EXPECT_EQ(c.text.head_dim, 24);
  EXPECT_EQ(c.text.intermediate_size, 128);
}

TEST(TargetConfig, FactoryBuildsTheDenseTarget) {
  const TargetConfig c = load_target_config(kTargetDir);
  const std::unique_ptr<TargetModel> model = make_target_model(c, kTargetDir, cpu_ctx(), {0, 5}, 16);
  EXPECT_EQ(model->family(), TargetFamily::Qwen3);
  EXPECT_EQ(model->config().hidden_size, c.text.hidden_size);
  EXPECT_EQ(model->capture_layers(), (std::vector<int>{0, 5}));
  EXPECT_EQ(model->activation_dtype(), DType::F32);
  EXPECT_EQ(model->embed_tokens().shape_str(), "[512, 64]");
}

// The dense checks run when the config is read, before any weight: a sliding-window layer is refused there.
TEST(TargetConfig, UnrunnableDenseConfigIsRefusedWhenRead) {
  const std::string dir = make_temp_dir();
  std::ifstream in(kTargetDir + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["layer_types"] = std::vector<std::string>(6, "full_attention");
  j["layer_types"][2] = "sliding_attention";
  j["sliding_window"] = 8;
  std::ofstream(dir + "/config.json") << j.dump();
  EXPECT_EXIT(load_target_config(dir), testing::ExitedWithCode(3), "layer 2 is sliding_attention");
  EXPECT_EXIT(load_target_config(dir + "/absent"), testing::ExitedWithCode(3), "cannot open .*absent/config.json");
}

// ---- the forward ------------------------------------------------------------------------------------

TEST(TargetGolden, EveryLayerFinalNormAndLogitsMatchTransformers) {
  auto model = load_target(kTargetDir, cpu_ctx(), all_layers(6), golden_batch().num_tokens());
  ASSERT_EQ(model->config().num_hidden_layers, 6);
  test::expect_matches_golden(*model, kCase, "dense");
}

TEST(TargetGolden, PackedBatchEqualsEachSequenceAlone) {
  const PackedBatch batch = golden_batch();
  const std::vector<int> layers = {3, 1, 5};  // out of order, and the last layer
  auto model = load_target(kTargetDir, cpu_ctx(), layers, batch.num_tokens());
  test::expect_packed_equals_each_alone(*model, batch);
}

TEST(TargetGolden, LayerListedTwiceIsCapturedTwice) {
  const PackedBatch batch = golden_batch();
  const int64_t T = batch.num_tokens();
  auto model = load_target(kTargetDir, cpu_ctx(), {2, 4, 2}, T);
  RunResult r = run_target(*model, batch);
  test::expect_slots_match_golden(r.features, {0, 2}, 2, kCase, T, model->config().hidden_size);
}

TEST(TargetGolden, CapturesOnlyAndEmptyFinalNorm) {
  // No captures and no final_norm is legal (it runs no decoder layer: nothing would read them); a later run
  // with final_norm still works.
  const PackedBatch batch = golden_batch();
  auto model = load_target(kTargetDir, cpu_ctx(), {}, batch.num_tokens());
  model->forward(batch, CaptureOut{});
  RunResult r = run_target(*model, batch);
  SafetensorsFile g(kCase + "/golden.safetensors");
  EXPECT_LT(test::rel_err(r.final_norm, read_f32(g, "target.final_norm")), 1e-5);
}

TEST(TargetGolden, WithoutFinalNormTheCapturesStillMatch) {
  // A CE job asks for no final norm: the forward stops after the last captured layer (3 of the golden 6),
  // and the captured layers are those of the full run.
  const PackedBatch batch = golden_batch();
  const int64_t T = batch.num_tokens();
  auto model = load_target(kTargetDir, cpu_ctx(), {1, 3}, T);
  const int64_t H = model->config().hidden_size;
  std::vector<float> features(2 * T * H, NAN);
  CaptureOut out;
  out.features = Tensor(features.data(), DType::F32, Device::CPU, {2, T, H});
  model->forward(batch, out);
  test::expect_slots_match_golden(features, {0}, 1, kCase, T, H);
  test::expect_slots_match_golden(features, {1}, 3, kCase, T, H);
}

TEST(CaptureStack, StopsAfterTheLastCaptureWithoutFinalNorm) {
  // Six layers, captures {3, 1}: with a final norm every layer runs; without one, layers 0..3 only.
  const int64_t T = 2, H = 4;
  const CapturePlan plan = plan_captures({3, 1}, 6, "test");
  Buffer stream[2] = {Buffer(Device::CPU, DType::F32, {T, H}), Buffer(Device::CPU, DType::F32, {T, H})};
  std::vector<float> features(2 * T * H), final_norm(T * H), weight(H, 1.f);
  std::fill(static_cast<float*>(stream[0].t().data), static_cast<float*>(stream[0].t().data) + T * H, 1.f);
  std::vector<int> ran;
  const LayerForward layer = [&](int l, const Tensor& in, const Tensor& dst) {
    ran.push_back(l);
    for (int64_t i = 0; i < T * H; ++i) static_cast<float*>(dst.data)[i] = static_cast<const float*>(in.data)[i] + 1.f;
  };
  CaptureOut out;
  out.features = Tensor(features.data(), DType::F32, Device::CPU, {2, T, H});
  capture_stack_forward(cpu_ctx(), plan, stream, T, H, out, Tensor(), 1e-6f, layer);
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(features[0], 5.f);      // slot 0 = layer 3: 1 + 4 layers
  EXPECT_EQ(features[T * H], 3.f);  // slot 1 = layer 1
  ran.clear();
  std::fill(static_cast<float*>(stream[0].t().data), static_cast<float*>(stream[0].t().data) + T * H, 1.f);
  out.final_norm = cpu_view(final_norm.data(), {T, H});
  capture_stack_forward(cpu_ctx(), plan, stream, T, H, out, cpu_view(weight.data(), {H}), 1e-6f, layer);
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

class TargetHalfCheckpoint : public ::testing::TestWithParam<DType> {};

TEST_P(TargetHalfCheckpoint, MatchesFloat32WithinRounding) {
  const DType dtype = GetParam();
  const std::string dir = make_temp_dir();
  write_target_copy(dir, dtype);
  const PackedBatch batch = golden_batch();
  auto ref = load_target(kTargetDir, cpu_ctx(), {1, 3}, batch.num_tokens());
  auto half = load_target(dir, cpu_ctx(), {1, 3}, batch.num_tokens());
  RunResult a = run_target(*ref, batch), b = run_target(*half, batch);
  const double tol = dtype == DType::BF16 ? 2e-2 : 2e-3;
  const double feat_err = test::rel_err(b.features, a.features), norm_err = test::rel_err(b.final_norm, a.final_norm);
  std::printf("  %s weights: features rel err %.3g, final_norm rel err %.3g\n", dtype_name(dtype), feat_err, norm_err);
  EXPECT_LT(feat_err, tol);
  EXPECT_LT(norm_err, tol);
  EXPECT_GT(feat_err, 0.0) << "the 16-bit weights should change the result a little";
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Target, TargetHalfCheckpoint, ::testing::Values(DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(TargetErrors, MissingTensorIsBadInputNamingIt) {
  const std::string dir = make_temp_dir();
  write_target_copy(dir, DType::F32, [](std::vector<TensorCopy>& t) {
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](const TensorCopy& c) { return c.name == "model.layers.4.self_attn.k_norm.weight"; }),
            t.end());
  });
  EXPECT_EXIT(load_target(dir, cpu_ctx(), {1}, 16), testing::ExitedWithCode(3),
              "missing tensor model.layers.4.self_attn.k_norm.weight");
  std::filesystem::remove_all(dir);
}

TEST(TargetErrors, MisshapedTensorIsBadInputNamingIt) {
  const std::string dir = make_temp_dir();
  write_target_copy(dir, DType::F32, [](std::vector<TensorCopy>& t) {
    for (TensorCopy& c : t)
      if (c.name == "model.layers.2.mlp.down_proj.weight") c.shape = {c.shape[1], c.shape[0]};  // transposed
  });
  EXPECT_EXIT(load_target(dir, cpu_ctx(), {1}, 16), testing::ExitedWithCode(3),
              "tensor model.layers.2.mlp.down_proj.weight in .* has shape \\[128, 64\\], expected \\[64, 128\\]");
  std::filesystem::remove_all(dir);
}

TEST(TargetErrors, CaptureLayerOutOfRangeIsBadOptions) {
  EXPECT_EXIT(load_target(kTargetDir, cpu_ctx(), {1, 6}, 16), testing::ExitedWithCode(2),
              "capture layer 6 is out of range");
  EXPECT_EXIT(load_target(kTargetDir, cpu_ctx(), {-1}, 16), testing::ExitedWithCode(2),
              "capture layer -1 is out of range");
}

TEST(TargetErrors, TokenOutsideVocabIsBadInput) {
  auto model = load_target(kTargetDir, cpu_ctx(), {}, 8);
  PackedBatch b;
  b.tokens = {1, 2, 512};
  b.cu_seqlens = {0, 3};
  EXPECT_EXIT(model->forward(b, CaptureOut{}), testing::ExitedWithCode(3),
              "token id 512 at position 2 is outside the target's vocabulary");
}

TEST(TargetErrors, BatchLargerThanMaxTokensIsRefused) {
  auto model = load_target(kTargetDir, cpu_ctx(), {}, 2);
  PackedBatch b;
  b.tokens = {1, 2, 3};
  b.cu_seqlens = {0, 3};
  EXPECT_EXIT(model->forward(b, CaptureOut{}), testing::ExitedWithCode(3), "packed batch of 3 tokens");
}

// Qwen3.5 hybrid targets are no longer refused: tests/unit/test_qwen35.cpp covers them.

}  // namespace
}  // namespace dflash
