// Qwen3.8 targets: Qwen3.8-27B has Qwen3.6-27B's architecture and config keys (Qwen3_5ForConditionalGeneration,
// model_type qwen3_5, the text model under text_config). The release's config parses to the hybrid with its
// widths; the keys that leave the text forward unchanged are accepted, the ones that would change it are
// refused; and the tiny Qwen3.8-shaped golden case (tests/data/golden/qwen38-tiny-a, made by
// gen_golden_qwen38.py with HF transformers in float64) matches on the CPU backend.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dflash/drafter.h"
#include "dflash/hf_config.h"
#include "dflash/target.h"
#include "model/qwen35_config.h"
#include "target_golden.h"
#include "test_support.h"

namespace dflash {
namespace {

using nlohmann::json;

const std::string kCase = std::string(DFLASH_TEST_DATA) + "/golden/qwen38-tiny-a";
const std::string kTargetDir = kCase + "/target";

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Qwen3.8-27B's config.json as its release writes it (text and top-level keys; the vision tower trimmed
// to the keys that matter here).
json release_config() {
  json layer_types = json::array();
  for (int l = 0; l < 64; ++l) layer_types.push_back((l + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  json text = {
      {"attention_bias", false}, {"attention_dropout", 0.0}, {"attn_output_gate", true},
      {"bos_token_id", 248044}, {"dtype", "bfloat16"}, {"eos_token_id", 248044},
      {"full_attention_interval", 4}, {"head_dim", 256}, {"hidden_act", "silu"}, {"hidden_size", 5120},
      {"initializer_range", 0.02}, {"intermediate_size", 17408}, {"layer_types", layer_types},
      {"linear_conv_kernel_dim", 4}, {"linear_key_head_dim", 128}, {"linear_num_key_heads", 16},
      {"linear_num_value_heads", 48}, {"linear_value_head_dim", 128}, {"mamba_ssm_dtype", "float32"},
      {"max_position_embeddings", 262144}, {"model_type", "qwen3_5_text"}, {"mtp_num_hidden_layers", 1},
      {"mtp_use_dedicated_embeddings", false}, {"num_attention_heads", 24}, {"num_hidden_layers", 64},
      {"num_key_value_heads", 4}, {"output_gate_type", "swish"}, {"pad_token_id", nullptr},
      {"partial_rotary_factor", 0.25}, {"rms_norm_eps", 1e-6},
      {"rope_parameters", {{"mrope_interleaved", true}, {"mrope_section", {11, 11, 10}},
                           {"partial_rotary_factor", 0.25}, {"rope_theta", 10000000.0}, {"rope_type", "default"}}},
      {"tie_word_embeddings", false}, {"use_cache", true}, {"vocab_size", 248320}};
  return {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"},
          {"language_model_only", false}, {"image_token_id", 248056}, {"video_token_id", 248057},
          {"vision_start_token_id", 248053}, {"vision_end_token_id", 248054}, {"tie_word_embeddings", false},
          {"text_config", text},
          {"vision_config", {{"model_type", "qwen3_5_vision"}, {"depth", 27}, {"hidden_size", 1152},
                             {"out_hidden_size", 5120}}}};
}

TEST(Qwen38Config, ReleaseConfigIsTheHybridWithItsWidths) {
  const json j = release_config();
  check_target_config_supported(j, "qwen3.8.json", /*hybrid=*/true);
  const Qwen35Config c = parse_qwen35_config(j, "qwen3.8.json");
  EXPECT_EQ(c.text.weight_prefix, "model.language_model.");
  EXPECT_EQ(c.text.num_hidden_layers, 64);
  EXPECT_EQ(c.text.hidden_size, 5120);
  EXPECT_EQ(c.text.intermediate_size, 17408);
  EXPECT_EQ(c.text.num_attention_heads, 24);
  EXPECT_EQ(c.text.num_key_value_heads, 4);
  EXPECT_EQ(c.text.head_dim, 256);
  EXPECT_EQ(c.text.vocab_size, 248320);
  EXPECT_FLOAT_EQ(c.text.rope_theta, 1e7f);
  EXPECT_EQ(c.rotary_dim, 64);  // int(256 * 0.25): 32 frequencies = mrope_section 11 + 11 + 10
  EXPECT_EQ(c.linear_num_key_heads, 16);
  EXPECT_EQ(c.linear_num_value_heads, 48);
  EXPECT_EQ(c.linear_key_head_dim, 128);
  EXPECT_EQ(c.linear_value_head_dim, 128);
  ASSERT_EQ(c.kinds.size(), 64u);
  for (int l = 0; l < 64; ++l)
    EXPECT_EQ(c.kinds[l], l % 4 == 3 ? Qwen35LayerKind::FullAttention : Qwen35LayerKind::LinearAttention) << l;
  // A fresh drafter for it: Qwen3.6's mask token and the DFlash layer ids of a 64-layer target.
  const DrafterConfig d = fresh_drafter_config(c.text, 5, 16, -1);
  EXPECT_EQ(d.mask_token_id, 248070);
  EXPECT_EQ(d.target_layer_ids, (std::vector<int>{1, 16, 31, 46, 61}));
  EXPECT_EQ(default_target_layer_ids(64, 1), (std::vector<int>{32}));
}

TEST(Qwen38Config, KeysThatChangeTheMathAreRefused) {
  const json base = release_config();
  auto text_edit = [&](const std::function<void(json&)>& f) {
    json j = base;
    f(j["text_config"]);
    return j;
  };
  // A sigmoid (or unknown, or null) Gated DeltaNet output gate is other math than silu.
  for (const json& gate : {json("sigmoid"), json("gelu"), json(nullptr), json(3)})
    EXPECT_EXIT(parse_qwen35_config(text_edit([&](json& t) { t["output_gate_type"] = gate; }), "c.json"),
                testing::ExitedWithCode(3), "output_gate_type") << gate.dump();
  for (const char* gate : {"silu", "swish"})  // the same function under both names
    EXPECT_EQ(parse_qwen35_config(text_edit([&](json& t) { t["output_gate_type"] = gate; }), "c.json").rotary_dim, 64);
  // Multimodal RoPE sections that do not cover the 32 rotary frequencies describe another rotation.
  for (const json& sec : {json({11, 11, 11}), json({11, -1, 22}), json("11,11,10"), json::array()})
    EXPECT_EXIT(parse_qwen35_config(text_edit([&](json& t) { t["rope_parameters"]["mrope_section"] = sec; }), "c.json"),
                testing::ExitedWithCode(3), "mrope_section") << sec.dump();
  EXPECT_EXIT(parse_qwen35_config(text_edit([](json& t) { t["rope_parameters"]["mrope_interleaved"] = "yes"; }), "c.json"),
              testing::ExitedWithCode(3), "mrope_interleaved");
  // The 1M-context variant's YaRN scaling: not plain RoPE.
  EXPECT_EXIT(parse_qwen35_config(text_edit([](json& t) {
                                    t["rope_parameters"]["rope_type"] = "yarn";
                                    t["rope_parameters"]["factor"] = 4.0;
                                    t["rope_parameters"]["original_max_position_embeddings"] = 262144;
                                  }),
                                  "c.json"),
              testing::ExitedWithCode(3), "unsupported RoPE scaling \"yarn\"");
  // The harmless keys may go: the parse is the same without them.
  const json bare = text_edit([](json& t) {
    for (const char* k : {"output_gate_type", "mamba_ssm_dtype", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"})
      t.erase(k);
    t["rope_parameters"].erase("mrope_section");
    t["rope_parameters"].erase("mrope_interleaved");
  });
  EXPECT_EQ(parse_qwen35_config(bare, "c.json").rotary_dim, 64);
}

// ---- the tiny Qwen3.8-shaped golden case ------------------------------------------------------------

TEST(Qwen38Golden, CaseHasTheReleaseShape) {
  const json cfg = read_json(kTargetDir + "/config.json");
  EXPECT_EQ(cfg["architectures"], json({"Qwen3_5ForConditionalGeneration"}));
  EXPECT_EQ(cfg["model_type"], "qwen3_5");
  const json& t = cfg["text_config"];
  EXPECT_EQ(t["output_gate_type"], "swish");
  EXPECT_EQ(t["mtp_num_hidden_layers"], 1);
  EXPECT_EQ(t["rope_parameters"]["mrope_section"], json({3, 3, 2}));
  const TargetConfig c = load_target_config(kTargetDir);
  EXPECT_EQ(c.family, TargetFamily::Qwen35Hybrid);
  ASSERT_NE(c.qwen35, nullptr);
  EXPECT_EQ(c.text.num_hidden_layers, 8);
  EXPECT_EQ(c.text.num_attention_heads / c.text.num_key_value_heads, 24 / 4);
  EXPECT_EQ(c.qwen35->linear_num_value_heads / c.qwen35->linear_num_key_heads, 48 / 16);
  EXPECT_EQ(c.qwen35->rotary_dim, 16);  // int(64 * 0.25) = 2 x (3 + 3 + 2)
  EXPECT_EQ(c.text.weight_prefix, "model.language_model.");
}

TEST(Qwen38Golden, EveryLayerFinalNormAndLogitsMatchTransformers) {
  const PackedBatch batch = test::golden_batch(kCase);
  auto model = test::load_target(kTargetDir, cpu_ctx(), test::all_layers(8), batch.num_tokens());
  test::expect_matches_golden(*model, kCase, "Qwen3.8 layout");
}

TEST(Qwen38Golden, PackedBatchEqualsEachSequenceAlone) {
  PackedBatch batch = test::golden_batch(kCase);
  batch.tokens.push_back(11);  // a one-token third sequence
  batch.cu_seqlens.push_back(batch.cu_seqlens.back() + 1);
  auto model = test::load_target(kTargetDir, cpu_ctx(), {7, 2, 3}, batch.num_tokens());
  test::expect_packed_equals_each_alone(*model, batch);
}

// The release's checkpoint also holds the multi-token-prediction head (mtp.*), which the text forward
// does not use: it is not read.
TEST(Qwen38Golden, MtpHeadTensorsAreIgnored) {
  const std::string dir = test::make_temp_dir("dflash_qwen38_");
  std::ofstream(dir + "/config.json") << read_json(kTargetDir + "/config.json").dump(2);
  test::write_checkpoint_copy(kTargetDir, dir, DType::F32, nullptr, [](std::vector<test::TensorCopy>& ts) {
    ts.push_back({"mtp.fc.weight", {64, 128}, std::vector<float>(64 * 128, 0.5f)});
    ts.push_back({"mtp.layers.0.self_attn.q_proj.weight", {768, 64}, std::vector<float>(768 * 64, -1.0f)});
    ts.push_back({"mtp.norm.weight", {64}, std::vector<float>(64, 2.0f)});
  });
  const PackedBatch batch = test::golden_batch(kCase);
  auto model = test::load_target(dir, cpu_ctx(), test::all_layers(8), batch.num_tokens());
  test::expect_matches_golden(*model, kCase, "with mtp.* tensors");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dflash
