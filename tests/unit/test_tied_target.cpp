// tie_word_embeddings followed as Hugging Face follows it: a tied target's head is its embed_tokens, even
// when its files also hold an lm_head.weight (HF's tie_weights() overwrites it). The drafter trains against
// that head (CE logits, KL targets), so reading the stale file tensor trained against another model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/drafter.h"
#include "dflash/safetensors.h"
#include "drafter/drafter_golden.h"

namespace {

namespace fs = std::filesystem;
const std::string kCase = std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a";

// The golden target rewritten as one model.safetensors with tie_word_embeddings = `tied` and lm_head.weight
// set by `head` (from embed_tokens, for the reference) or left out.
enum class Head { Garbage, CopyOfEmbed };
std::string target_variant(const std::string& name, bool tied, Head head) {
  const fs::path dir = fs::temp_directory_path() / ("dflash_tied_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  dflash::Checkpoint ck(kCase + "/target");
  std::vector<std::vector<float>> data;
  std::vector<dflash::TensorToWrite> out;
  std::vector<float> embed;
  for (const std::string& n : ck.names()) {
    const std::vector<int64_t> shape = ck.get(n).shape;
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    data.emplace_back(static_cast<size_t>(numel));
    ck.load_f32(n, shape, data.back().data());
    if (n == "model.embed_tokens.weight") embed = data.back();
  }
  size_t i = 0;
  for (const std::string& n : ck.names()) {
    std::vector<float>& v = data[i++];
    if (n == "lm_head.weight") {
      for (size_t k = 0; k < v.size(); ++k) v[k] = head == Head::CopyOfEmbed ? embed[k] : 0.37f * static_cast<float>(k % 7) - 1.0f;
    }
    out.push_back({n, dflash::DType::F32, ck.get(n).shape, v.data(), nullptr});
  }
  dflash::write_safetensors((dir / "model.safetensors").string(), out);
  std::ifstream in(kCase + "/target/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["tie_word_embeddings"] = tied;
  std::ofstream(dir / "config.json") << j.dump(2);
  return dir.string();
}

}  // namespace

TEST(TiedTarget, HeadIsEmbedTokensEvenWhenTheFilesHoldAnLmHead) {
  const auto g = dflash::train::load_golden_inputs(kCase);
  const std::string tied = target_variant("tied", true, Head::Garbage);
  const std::string reference = target_variant("reference", false, Head::CopyOfEmbed);
  const auto fb = g.feature_batch();
  dflash::DrafterTrainer a(tied, g.drafter_dir, 0, g.opt, dflash::cpu_ctx(), g.batch.num_tokens());
  dflash::DrafterTrainer b(reference, g.drafter_dir, 0, g.opt, dflash::cpu_ctx(), g.batch.num_tokens());
  dflash::DrafterTrainer untied(kCase + "/target", g.drafter_dir, 0, g.opt, dflash::cpu_ctx(), g.batch.num_tokens());
  const double la = a.evaluate(fb, g.anchors).loss, lb = b.evaluate(fb, g.anchors).loss;
  EXPECT_EQ(la, lb) << "a tied target's head must be embed_tokens, not the lm_head.weight in its files";
  // The case's own (untied) lm_head differs from its embedding, so the comparison can tell them apart.
  EXPECT_GT(std::fabs(untied.evaluate(fb, g.anchors).loss - la), 1e-6);
  fs::remove_all(tied);
  fs::remove_all(reference);
}
