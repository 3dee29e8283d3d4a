// The head dims the target attention serves per backend (ops/attention_head_dim.h), and the loader's use
// of that rule: a CUDA target whose head_dim the kernels cannot hold is refused (BadOptions, exit 2) by
// make_target_model before any weight is read. Runs in CPU-only builds too: no CUDA call is made.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "dflash/target.h"
#include "ops/attention_head_dim.h"
#include "test_support.h"

namespace dflash {
namespace {

TEST(AttentionHeadDim, CudaServesMultiplesOf8UpTo256) {
  for (int64_t hd = -8; hd <= 1100; ++hd) {
    const bool want = hd > 0 && hd <= 256 && hd % 8 == 0;
    EXPECT_EQ(ops::attention_head_dim_supported(Device::CUDA, hd), want) << "head_dim " << hd;
  }
  // Every Qwen head dim: Qwen3 (128), Qwen3.5/3.6 full attention (256), the golden tiny models (24, 32).
  for (int64_t hd : {24, 32, 64, 80, 96, 128, 256}) EXPECT_TRUE(ops::attention_head_dim_supported(Device::CUDA, hd));
  EXPECT_EQ(ops::attention_head_dims_text(Device::CUDA), "multiples of 8 from 8 to 256");
}

TEST(AttentionHeadDim, CpuServesAnyUpTo1024) {
  EXPECT_FALSE(ops::attention_head_dim_supported(Device::CPU, 0));
  EXPECT_TRUE(ops::attention_head_dim_supported(Device::CPU, 1));
  EXPECT_TRUE(ops::attention_head_dim_supported(Device::CPU, 100));
  EXPECT_TRUE(ops::attention_head_dim_supported(Device::CPU, 320));
  EXPECT_TRUE(ops::attention_head_dim_supported(Device::CPU, 1024));
  EXPECT_FALSE(ops::attention_head_dim_supported(Device::CPU, 1025));
  EXPECT_EQ(ops::attention_head_dims_text(Device::CPU), "1 to 1024");
}

// A copy of a golden target's config.json (no weights) with head_dim replaced.
std::string config_with_head_dim(const std::string& golden_case, int head_dim) {
  const std::string dir = test::make_temp_dir("dflash_head_dim_");
  std::ifstream in(std::string(DFLASH_TEST_DATA) + "/golden/" + golden_case + "/target/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["head_dim"] = head_dim;
  std::ofstream(dir + "/config.json") << j.dump();
  return dir;
}

Ctx cuda_ctx_without_device() {
  Ctx c;  // the check reads ctx.device only: no GPU needed
  c.device = Device::CUDA;
  return c;
}

TEST(AttentionHeadDim, CudaTargetWithUnsupportedHeadDimIsRefusedBeforeWeights) {
  const Ctx cuda = cuda_ctx_without_device();
  for (int hd : {320, 100, 512}) {
    const std::string dir = config_with_head_dim("qwen3-tiny-a", hd);
    const TargetConfig cfg = load_target_config(dir);  // the config itself is fine (even head_dim)
    EXPECT_EXIT(make_target_model(cfg, dir, cuda, {0}, 16), testing::ExitedWithCode(2),
                "has head_dim " + std::to_string(hd) + "; attention on the .* backend supports head dims multiples "
                "of 8 from 8 to 256");
  }
}

// The hybrid (whose other refusal on CUDA may go away) is checked the same way, first.
TEST(AttentionHeadDim, CudaHybridTargetWithUnsupportedHeadDimIsRefused) {
  const Ctx cuda = cuda_ctx_without_device();
  const std::string dir = config_with_head_dim("qwen35-tiny-a", 512);
  EXPECT_EXIT(make_target_model(load_target_config(dir), dir, cuda, {1}, 16), testing::ExitedWithCode(2),
              "has head_dim 512");
}

// A supported head dim passes the check: what fails next is the missing checkpoint, not the head dim.
TEST(AttentionHeadDim, SupportedHeadDimPassesTheCheck) {
  const std::string dir = config_with_head_dim("qwen3-tiny-a", 256);
  EXPECT_EXIT(make_target_model(load_target_config(dir), dir, cpu_ctx(), {0}, 16), testing::ExitedWithCode(3),
              "safetensors");
}

}  // namespace
}  // namespace dflash
