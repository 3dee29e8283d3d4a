// The drafter export that serving engines load: a bf16 release-format export of the golden drafter has
// exactly drafter_init's tensor names and shapes, the config fields vLLM/SGLang read, bf16-rounded
// values, and loads back through the project's own loader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "dflash/drafter.h"
#include "dflash/hf_config.h"
#include "dflash/safetensors.h"

namespace fs = std::filesystem;
using namespace dflash;

namespace {
const std::string kCase = std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}
}  // namespace

TEST(DrafterExport, Bf16ExportMatchesTheReleaseFormatOfTheGoldenDrafter) {
  const std::string out = (fs::path(testing::TempDir()) / ("dflash_export_" + std::to_string(::getpid()))).string();
  fs::remove_all(out);
  TrainOptions opt;
  DrafterTrainer trainer(kCase + "/target", kCase + "/drafter_init", 0, opt, cpu_ctx(), 256);
  trainer.export_release(out, DType::BF16);

  // Same tensors, same shapes; bf16 values = the fp32 weights rounded.
  SafetensorsFile ref(kCase + "/drafter_init/model.safetensors");
  SafetensorsFile got(out + "/model.safetensors");
  EXPECT_EQ(std::set<std::string>(got.names().begin(), got.names().end()),
            std::set<std::string>(ref.names().begin(), ref.names().end()));
  for (const std::string& name : ref.names()) {
    ASSERT_TRUE(got.has(name)) << name;
    const TensorInfo& r = ref.get(name);
    const TensorInfo& g = got.get(name);
    EXPECT_EQ(g.shape, r.shape) << name;
    EXPECT_EQ(g.dtype, DType::BF16) << name;
    std::vector<float> rv(r.numel()), gv(g.numel());
    tensor_to_f32(r, rv.data(), ref.path());
    tensor_to_f32(g, gv.data(), got.path());
    for (size_t i = 0; i < rv.size(); ++i) ASSERT_EQ(gv[i], bf16_to_f32(f32_to_bf16(rv[i]))) << name << "[" << i << "]";
  }

  // The config fields a serving engine reads are those of the reference release.
  const nlohmann::json rc = read_json(kCase + "/drafter_init/config.json");
  const nlohmann::json gc = read_json(out + "/config.json");
  for (const char* key : {"architectures", "block_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim", "num_target_layers",
                          "vocab_size", "layer_types", "model_type", "rms_norm_eps", "tie_word_embeddings"}) {
    ASSERT_TRUE(gc.contains(key)) << key;
    EXPECT_EQ(gc[key], rc[key]) << key;
  }
  EXPECT_EQ(gc["dflash_config"]["mask_token_id"], rc["dflash_config"]["mask_token_id"]);
  EXPECT_EQ(gc["dflash_config"]["target_layer_ids"], rc["dflash_config"]["target_layer_ids"]);
  // One more than the release: vLLM's own name for the layers read, each id + 1 (its numbering).
  std::vector<int> aux;
  for (int id : rc["dflash_config"]["target_layer_ids"]) aux.push_back(id + 1);
  EXPECT_EQ(gc["eagle_aux_hidden_state_layer_ids"].get<std::vector<int>>(), aux);
  const DrafterConfig a = load_drafter_config(out + "/config.json");
  const DrafterConfig b = load_drafter_config(kCase + "/drafter_init/config.json");
  EXPECT_FLOAT_EQ(a.layers.rope_theta, b.layers.rope_theta);

  // The project's loader takes it back (as a --drafter to start from): weights = the rounded values.
  DrafterTrainer back(kCase + "/target", out, 0, opt, cpu_ctx(), 256);
  ASSERT_EQ(back.master_weights().numel(), trainer.master_weights().numel());
  const float* w = trainer.master_weights().ptr<float>();
  const float* v = back.master_weights().ptr<float>();
  for (size_t i = 0; i < trainer.master_weights().numel(); ++i) ASSERT_EQ(v[i], bf16_to_f32(f32_to_bf16(w[i]))) << i;
  fs::remove_all(out);
}
