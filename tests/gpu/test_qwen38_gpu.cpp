// The Qwen3.8-shaped hybrid target (tests/data/golden/qwen38-tiny-a: Qwen3_5ForConditionalGeneration with the
// release's keys, 8 layers of 3 Gated DeltaNet + 1 gated attention, head dim 64) on the CUDA backend: every
// decoder layer and the final norm against the float64 golden case, and against the float32 CPU backend on
// the same batch. dflash-selftest tests/data/golden/qwen38-tiny-a --backend cuda runs the same case with logits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "dflash/backend.h"
#include "dflash/safetensors.h"
#include "dflash/target.h"
#include "../unit/test_support.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::read_f32;
using test::rel_err;
// DFLASH_TEST_DATA in the environment wins over the build's path (the binary may run in another checkout).
const std::string kCase =
    std::string(std::getenv("DFLASH_TEST_DATA") ? std::getenv("DFLASH_TEST_DATA") : DFLASH_TEST_DATA) +
    "/golden/qwen38-tiny-a";
const std::string kTargetDir = kCase + "/target";
constexpr int kLayers = 8;
constexpr double kForwardTol = test::tol::kTargetForwardEightLayers;

// The golden case's packed batch, every token in the loss (tests/unit/test_support.h).
PackedBatch golden_batch() { return test::golden_batch(kCase); }

struct ForwardRun {
  std::vector<float> features, final_norm;  // [L, T, H], [T, H] as float32 on the host
};

ForwardRun run_forward(const Ctx& ctx, const PackedBatch& batch) {
  const int64_t T = batch.num_tokens();
  std::vector<int> layers(kLayers);
  for (int l = 0; l < kLayers; ++l) layers[l] = l;
  const std::unique_ptr<TargetModel> model = make_target_model(load_target_config(kTargetDir), kTargetDir, ctx, layers, T);
  EXPECT_EQ(model->family(), TargetFamily::Qwen35Hybrid);
  const int64_t H = model->config().hidden_size;
  const DType act = model->activation_dtype();
  Buffer features(ctx.device, act, {kLayers, T, H}), final_norm(ctx.device, act, {T, H});
  if (ctx.device == Device::CUDA) {  // NaN-poisoned: every element must be written
    cudaMemset(features.t().data, 0xff, features.t().nbytes());
    cudaMemset(final_norm.t().data, 0xff, final_norm.t().nbytes());
  }
  model->forward(batch, CaptureOut{features, final_norm});
  synchronize(ctx);
  ForwardRun r{std::vector<float>(kLayers * T * H), std::vector<float>(T * H)};
  copy_tensor(ctx, Tensor(r.features.data(), DType::F32, Device::CPU, {kLayers, T, H}), features);
  copy_tensor(ctx, cpu_view(r.final_norm.data(), {T, H}), final_norm);
  return r;
}

std::vector<float> layer(const std::vector<float>& all, int64_t l, int64_t n) {
  return std::vector<float>(all.begin() + l * n, all.begin() + (l + 1) * n);
}

TEST(GpuQwen38, GoldenEveryLayerAndFinalNorm) {
  SKIP_WITHOUT_GPU();
  SafetensorsFile g(kCase + "/golden.safetensors");
  const ForwardRun r = run_forward(test::gpu(), golden_batch());
  const std::vector<float> hidden = read_f32(g, "target.hidden");
  const int64_t n = static_cast<int64_t>(r.final_norm.size());
  for (int64_t l = 0; l < kLayers; ++l) {
    const double err = rel_err(layer(r.features, l, n), layer(hidden, l, n));
    std::printf("  cuda qwen3.8 target.hidden[%d] rel err %.3g\n", static_cast<int>(l), err);
    EXPECT_LT(err, kForwardTol) << "decoder layer " << l;
  }
  const double norm_err = rel_err(r.final_norm, read_f32(g, "target.final_norm"));
  std::printf("  cuda qwen3.8 target.final_norm rel err %.3g\n", norm_err);
  EXPECT_LT(norm_err, kForwardTol);
}

TEST(GpuQwen38, MatchesCpuBackend) {
  SKIP_WITHOUT_GPU();
  const PackedBatch batch = golden_batch();
  const ForwardRun gpu = run_forward(test::gpu(), batch), cpu = run_forward(cpu_ctx(), batch);
  const double feat_err = rel_err(gpu.features, cpu.features), norm_err = rel_err(gpu.final_norm, cpu.final_norm);
  std::printf("  cuda vs cpu (qwen3.8): features rel err %.3g, final_norm rel err %.3g\n", feat_err, norm_err);
  EXPECT_LT(feat_err, kForwardTol);
  EXPECT_LT(norm_err, kForwardTol);
}

}  // namespace
}  // namespace dflash
