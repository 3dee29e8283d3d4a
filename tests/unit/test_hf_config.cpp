// config.json parsing for Qwen3 targets and DFlash drafters: the golden configs, both RoPE spellings,
// text_config nesting, defaults, the release-format export, and clear BadInput errors (exit code 3).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dflash/error.h"
#include "dflash/drafter_ops.h"
#include "dflash/hf_config.h"

using namespace dflash;
using nlohmann::json;

namespace {

const std::string kGolden = std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a";
const int kBadInput = static_cast<int>(ExitCode::BadInput);

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// A small valid Qwen3 config (transformers-5 spelling).
json tiny_qwen3() {
  return json{{"architectures", {"Qwen3ForCausalLM"}},
              {"vocab_size", 1000},
              {"hidden_size", 128},
              {"intermediate_size", 256},
              {"num_hidden_layers", 3},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 4},
              {"head_dim", 32},
              {"rms_norm_eps", 1e-5},
              {"rope_parameters", {{"rope_theta", 500000.0}, {"rope_type", "default"}}},
              {"tie_word_embeddings", true},
              {"sliding_window", nullptr}};
}

json golden_drafter_json() { return read_json(kGolden + "/drafter_init/config.json"); }

}  // namespace

// ---- Qwen3 -------------------------------------------------------------------------------------
TEST(HfConfig, GoldenTargetMatchesCase) {
  const json c = read_json(kGolden + "/case.json")["config"];
  Qwen3Config q = load_qwen3_config(kGolden + "/target/config.json");
  EXPECT_EQ(q.vocab_size, c["V"].get<int>());
  EXPECT_EQ(q.hidden_size, c["H"].get<int>());
  EXPECT_EQ(q.num_hidden_layers, c["L"].get<int>());
  EXPECT_EQ(q.num_attention_heads, c["NH"].get<int>());
  EXPECT_EQ(q.num_key_value_heads, c["NKV"].get<int>());
  EXPECT_EQ(q.head_dim, c["HD"].get<int>());
  EXPECT_EQ(q.intermediate_size, c["I"].get<int>());
  EXPECT_FLOAT_EQ(q.rope_theta, c["theta"].get<float>());
  EXPECT_FLOAT_EQ(q.rms_norm_eps, 1e-6f);
  EXPECT_FALSE(q.tie_word_embeddings);
  EXPECT_EQ(q.weight_prefix, "model.");
  EXPECT_EQ(q.layer_types, std::vector<std::string>(q.num_hidden_layers, "full_attention"));
  EXPECT_EQ(q.sliding_window, 0);
}

TEST(HfConfig, ImplausibleSizesAreRefusedBeforeAnythingIsSized) {
  json a = tiny_qwen3();
  a["num_hidden_layers"] = 1000000000;
  EXPECT_EXIT(parse_qwen3_config(a, "a.json"), testing::ExitedWithCode(kBadInput), "is not plausible \\(at most 4096\\)");
  json b = tiny_qwen3();
  b["vocab_size"] = 1 << 30;
  EXPECT_EXIT(parse_qwen3_config(b, "b.json"), testing::ExitedWithCode(kBadInput), "'vocab_size' in b.json = ");
}

TEST(HfConfig, ConfigThatIsNotARegularFileIsRefusedWithoutReading) {
  EXPECT_EXIT(load_qwen3_config("/dev/zero"), testing::ExitedWithCode(kBadInput), "/dev/zero is not a regular file");
}

TEST(HfConfig, RopeThetaUnderBothSpellings) {
  json a = tiny_qwen3();
  EXPECT_FLOAT_EQ(parse_qwen3_config(a, "a.json").rope_theta, 500000.0f);
  json b = tiny_qwen3();
  b.erase("rope_parameters");
  b["rope_theta"] = 1234567.0;
  b["rope_scaling"] = nullptr;
  EXPECT_FLOAT_EQ(parse_qwen3_config(b, "b.json").rope_theta, 1234567.0f);
  json both = tiny_qwen3();  // both spellings: equal is fine, different is refused (which would a loader read?)
  both["rope_theta"] = 500000.0;
  EXPECT_FLOAT_EQ(parse_qwen3_config(both, "both.json").rope_theta, 500000.0f);
  both["rope_theta"] = 10000000.0;
  EXPECT_EXIT(parse_qwen3_config(both, "both.json"), testing::ExitedWithCode(kBadInput), "disagree");
  json c = tiny_qwen3();
  c.erase("rope_parameters");
  EXPECT_EXIT(parse_qwen3_config(c, "c.json"), testing::ExitedWithCode(kBadInput), "missing field 'rope_theta' in c.json");
  json d = tiny_qwen3();
  d["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_EXIT(parse_qwen3_config(d, "d.json"), testing::ExitedWithCode(kBadInput), "unsupported RoPE scaling \"yarn\"");
}

TEST(HfConfig, DefaultsForOptionalFields) {
  json j = tiny_qwen3();
  j.erase("num_key_value_heads");
  j.erase("head_dim");
  j.erase("sliding_window");
  j.erase("tie_word_embeddings");
  Qwen3Config q = parse_qwen3_config(j, "x.json");
  EXPECT_EQ(q.num_key_value_heads, q.num_attention_heads);
  EXPECT_EQ(q.head_dim, 128 / 8);
  EXPECT_EQ(q.sliding_window, 0);
  EXPECT_FALSE(q.tie_word_embeddings);
  EXPECT_EQ(q.layer_types, std::vector<std::string>(3, "full_attention"));
  EXPECT_TRUE(parse_qwen3_config(tiny_qwen3(), "t.json").tie_word_embeddings);
}

TEST(HfConfig, SlidingWindowLayers) {
  json j = tiny_qwen3();
  j["sliding_window"] = 2048;
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  Qwen3Config q = parse_qwen3_config(j, "s.json");
  EXPECT_EQ(q.sliding_window, 2048);
  EXPECT_EQ(q.layer_types[0], "sliding_attention");
  EXPECT_EQ(q.layer_types[1], "full_attention");
  // Older configs: use_sliding_window + max_window_layers instead of layer_types.
  json old = tiny_qwen3();
  old["sliding_window"] = 4096;
  old["use_sliding_window"] = true;
  old["max_window_layers"] = 1;
  Qwen3Config o = parse_qwen3_config(old, "o.json");
  EXPECT_EQ(o.layer_types, (std::vector<std::string>{"full_attention", "sliding_attention", "sliding_attention"}));
  json bad = j;
  bad["sliding_window"] = nullptr;
  EXPECT_EXIT(parse_qwen3_config(bad, "s.json"), testing::ExitedWithCode(kBadInput),
              "sliding_attention layers but 'sliding_window' in s.json");
  json wrong_len = j;
  wrong_len["layer_types"] = {"full_attention"};
  EXPECT_EXIT(parse_qwen3_config(wrong_len, "s.json"), testing::ExitedWithCode(kBadInput),
              "'layer_types' in s.json must be a list of 3");
  json unknown = j;
  unknown["layer_types"][2] = "chunked_attention";
  EXPECT_EXIT(parse_qwen3_config(unknown, "s.json"), testing::ExitedWithCode(kBadInput),
              "unknown layer type \"chunked_attention\"");
}

TEST(HfConfig, TextConfigNesting) {
  json inner = tiny_qwen3();
  inner.erase("architectures");
  json vlm = {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"text_config", inner},
              {"vision_config", {{"hidden_size", 9}}}};
  Qwen3Config q = parse_qwen3_config(vlm, "vlm.json");
  EXPECT_EQ(q.weight_prefix, "model.language_model.");
  EXPECT_EQ(q.hidden_size, 128);
  EXPECT_EQ(q.vocab_size, 1000);
  EXPECT_FLOAT_EQ(q.rope_theta, 500000.0f);
  vlm["text_config"].erase("hidden_size");
  EXPECT_EXIT(parse_qwen3_config(vlm, "vlm.json"), testing::ExitedWithCode(kBadInput),
              "missing field 'text_config.hidden_size' in vlm.json");
}

TEST(HfConfig, BadFieldsAreClearErrors) {
  json missing = tiny_qwen3();
  missing.erase("vocab_size");
  EXPECT_EXIT(parse_qwen3_config(missing, "m.json"), testing::ExitedWithCode(kBadInput),
              "missing field 'vocab_size' in m.json");
  json not_int = tiny_qwen3();
  not_int["hidden_size"] = "128";
  EXPECT_EXIT(parse_qwen3_config(not_int, "n.json"), testing::ExitedWithCode(kBadInput),
              "'hidden_size' in n.json must be an integer");
  json frac = tiny_qwen3();
  frac["intermediate_size"] = 256.5;
  EXPECT_EXIT(parse_qwen3_config(frac, "f.json"), testing::ExitedWithCode(kBadInput),
              "'intermediate_size' in f.json must be an integer");
  json zero = tiny_qwen3();
  zero["num_hidden_layers"] = 0;
  EXPECT_EXIT(parse_qwen3_config(zero, "z.json"), testing::ExitedWithCode(kBadInput),
              "'num_hidden_layers' in z.json = 0 is out of range");
  json heads = tiny_qwen3();
  heads["num_key_value_heads"] = 3;
  EXPECT_EXIT(parse_qwen3_config(heads, "h.json"), testing::ExitedWithCode(kBadInput),
              "num_attention_heads = 8 is not divisible by num_key_value_heads = 3");
  json eps = tiny_qwen3();
  eps["rms_norm_eps"] = -1;
  EXPECT_EXIT(parse_qwen3_config(eps, "e.json"), testing::ExitedWithCode(kBadInput),
              "'rms_norm_eps' in e.json = -1 must be positive");
  json tie = tiny_qwen3();
  tie["tie_word_embeddings"] = "yes";
  EXPECT_EXIT(parse_qwen3_config(tie, "t.json"), testing::ExitedWithCode(kBadInput),
              "'tie_word_embeddings' in t.json must be true or false");
  EXPECT_EXIT(parse_qwen3_config(json::array(), "arr.json"), testing::ExitedWithCode(kBadInput),
              "arr.json is not a JSON object");
}

TEST(HfConfig, NotAJsonFile) {
  char tmpl[] = "/tmp/dflash_cfg_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/config.json";
  std::ofstream(path) << "this is not json {";
  EXPECT_EXIT(load_qwen3_config(path), testing::ExitedWithCode(kBadInput), "config.json is not valid JSON");
  EXPECT_EXIT(load_qwen3_config(std::string(tmpl) + "/absent.json"), testing::ExitedWithCode(kBadInput),
              "cannot open .*absent.json");
  EXPECT_EXIT(load_drafter_config(path), testing::ExitedWithCode(kBadInput), "is not valid JSON");
  std::filesystem::remove_all(tmpl);
}

// ---- DFlash drafter ----------------------------------------------------------------------------
TEST(HfConfig, GoldenDrafterMatchesCase) {
  const json c = read_json(kGolden + "/case.json");
  DrafterConfig d = load_drafter_config(kGolden + "/drafter_init/config.json");
  EXPECT_EQ(d.layers.num_hidden_layers, c["config"]["D"].get<int>());
  EXPECT_EQ(d.layers.num_attention_heads, c["config"]["DNH"].get<int>());
  EXPECT_EQ(d.layers.num_key_value_heads, c["config"]["DNKV"].get<int>());
  EXPECT_EQ(d.layers.head_dim, c["config"]["DHD"].get<int>());
  EXPECT_EQ(d.layers.intermediate_size, c["config"]["DI"].get<int>());
  EXPECT_EQ(d.layers.weight_prefix, "");
  EXPECT_EQ(d.block_size, c["block_size"].get<int>());
  EXPECT_EQ(d.mask_token_id, c["mask_token_id"].get<int>());
  EXPECT_EQ(d.target_layer_ids, c["layer_ids"].get<std::vector<int>>());
  EXPECT_EQ(d.num_target_layers, c["config"]["L"].get<int>());
  EXPECT_EQ(d.torch_dtype, "float32");
  Qwen3Config t = load_qwen3_config(kGolden + "/target/config.json");
  check_drafter_fits_target(d, t);  // must not exit
  // The golden case used the default ids for its shape.
  EXPECT_EQ(default_target_layer_ids(t.num_hidden_layers, d.layers.num_hidden_layers), d.target_layer_ids);
}

TEST(HfConfig, DrafterConfigToJsonHasTheReleaseFormatKeys) {
  const json golden = golden_drafter_json();
  DrafterConfig d = parse_drafter_config(golden, "golden");
  const json out = drafter_config_to_json(d);
  std::set<std::string> want, got;
  for (auto it = golden.begin(); it != golden.end(); ++it) want.insert(it.key());
  for (auto it = out.begin(); it != out.end(); ++it) got.insert(it.key());
  // auto_map is the one key left out on purpose: it names a modeling file (dflash.py) that the export
  // does not ship, so AutoModel(..., trust_remote_code=True) would fail on it (docs/serving.md).
  want.erase("auto_map");
  EXPECT_FALSE(got.count("auto_map"));
  for (const std::string& k : want) EXPECT_TRUE(got.count(k)) << "missing key " << k;
  EXPECT_TRUE(got.count("rope_theta"));  // for loaders older than transformers 5
  // Same values for every field that describes the model.
  for (const char* k : {"architectures", "block_size", "dflash_config", "head_dim", "hidden_act",
                        "hidden_size", "intermediate_size", "layer_types", "model_type", "num_attention_heads",
                        "num_hidden_layers", "num_key_value_heads", "num_target_layers", "rms_norm_eps",
                        "rope_parameters", "sliding_window", "tie_word_embeddings", "use_sliding_window",
                        "vocab_size", "attention_bias", "dtype"})
    EXPECT_EQ(out[k], golden[k]) << k;
  EXPECT_EQ(out["rope_theta"], golden["rope_parameters"]["rope_theta"]);
  // vLLM's name for the layers read, in its numbering (id j = the output of layer j-1): target_layer_ids + 1,
  // which vLLM releases that read dflash_config.target_layer_ids unshifted take from here (docs/serving.md).
  ASSERT_TRUE(out.contains("eagle_aux_hidden_state_layer_ids"));
  std::vector<int> aux;
  for (int id : d.target_layer_ids) aux.push_back(id + 1);
  EXPECT_EQ(out["eagle_aux_hidden_state_layer_ids"].get<std::vector<int>>(), aux);
  // And it parses back to the same config.
  DrafterConfig back = parse_drafter_config(out, "out");
  EXPECT_EQ(back.target_layer_ids, d.target_layer_ids);
  EXPECT_EQ(back.mask_token_id, d.mask_token_id);
  EXPECT_EQ(back.layers.head_dim, d.layers.head_dim);
  EXPECT_FLOAT_EQ(back.layers.rope_theta, d.layers.rope_theta);

  // A sliding-window drafter keeps its window and says so.
  DrafterConfig s = d;
  s.layers.layer_types = {"sliding_attention", "full_attention"};
  s.layers.sliding_window = 2048;
  const json sj = drafter_config_to_json(s);
  EXPECT_EQ(sj["sliding_window"], 2048);
  EXPECT_EQ(sj["use_sliding_window"], true);
  EXPECT_EQ(parse_drafter_config(sj, "s").layers.layer_types, s.layers.layer_types);
}

TEST(HfConfig, DrafterConfigErrors) {
  json not_dflash = golden_drafter_json();
  not_dflash["architectures"] = {"Qwen3ForCausalLM"};
  EXPECT_EXIT(parse_drafter_config(not_dflash, "d.json"), testing::ExitedWithCode(kBadInput),
              "d.json is not a DFlash or DFlash2 drafter config");
  json no_dflash = golden_drafter_json();
  no_dflash.erase("dflash_config");
  EXPECT_EXIT(parse_drafter_config(no_dflash, "d.json"), testing::ExitedWithCode(kBadInput),
              "missing object 'dflash_config' in d.json");
  json no_mask = golden_drafter_json();
  no_mask["dflash_config"].erase("mask_token_id");
  EXPECT_EXIT(parse_drafter_config(no_mask, "d.json"), testing::ExitedWithCode(kBadInput),
              "missing field 'dflash_config.mask_token_id' in d.json");
  json bad_id = golden_drafter_json();
  bad_id["dflash_config"]["target_layer_ids"] = {1, 6};
  EXPECT_EXIT(parse_drafter_config(bad_id, "d.json"), testing::ExitedWithCode(kBadInput),
              "target layer id 6 in 'dflash_config.target_layer_ids' in d.json is outside \\[0, 6\\)");
  json no_block = golden_drafter_json();
  no_block.erase("block_size");
  EXPECT_EXIT(parse_drafter_config(no_block, "d.json"), testing::ExitedWithCode(kBadInput),
              "missing field 'block_size' in d.json");
  json default_ids = golden_drafter_json();
  default_ids["dflash_config"].erase("target_layer_ids");
  EXPECT_EQ(parse_drafter_config(default_ids, "d.json").target_layer_ids, (std::vector<int>{1, 3}));
}

TEST(HfConfig, DefaultTargetLayerIds) {
  // Values of the official build_target_layer_ids (z-lab/dflash, SpecForge), computed with its Python:
  //   [L // 2] if n == 1 else [int(round(1 + i * (L - 4) / (n - 1))) for i in range(n)]
  struct Case { int L, n; std::vector<int> ids; };
  const Case official[] = {
      {36, 5, {1, 9, 17, 25, 33}},   // Qwen3-8B
      {64, 5, {1, 16, 31, 46, 61}},  // Qwen3.6-27B
      {52, 5, {1, 13, 25, 37, 49}},  // the DFlash2 fixture's target (z-lab/dflash tests/fixtures)
      {6, 2, {1, 3}},                // golden case
      {28, 3, {1, 13, 25}},
      {48, 8, {1, 7, 14, 20, 26, 32, 39, 45}},
      {7, 3, {1, 2, 4}},             // 2.5 rounds half to even: 2
      {9, 3, {1, 4, 6}},             // 3.5 rounds half to even: 4
      {11, 5, {1, 3, 4, 6, 8}},      // 1 + 3.5 = 4.5 rounds half to even: 4
      {28, 1, {14}},                 // one drafter layer: the middle layer
      {36, 1, {18}},
      {7, 1, {3}},
      {2, 1, {1}},
      {1, 1, {0}},
  };
  for (const Case& c : official) EXPECT_EQ(default_target_layer_ids(c.L, c.n), c.ids) << c.L << " " << c.n;
  // Every id is inside the target and the ids never decrease.
  for (int L = 5; L <= 80; ++L)
    for (int n = 1; n <= 8; ++n) {
      std::vector<int> ids = default_target_layer_ids(L, n);
      ASSERT_EQ(ids.size(), static_cast<size_t>(n));
      if (n == 1) {
        EXPECT_EQ(ids.front(), L / 2) << L;
      } else {
        EXPECT_EQ(ids.front(), 1) << L << " " << n;
        EXPECT_EQ(ids.back(), L - 3) << L << " " << n;
      }
      for (size_t i = 1; i < ids.size(); ++i) EXPECT_LE(ids[i - 1], ids[i]);
    }
  EXPECT_EXIT(default_target_layer_ids(2, 2), testing::ExitedWithCode(kBadInput), "fall outside the target");
  EXPECT_EXIT(default_target_layer_ids(36, 0), testing::ExitedWithCode(kBadInput), "0 drafter layers");
}

TEST(HfConfig, CheckDrafterFitsTargetRejections) {
  const DrafterConfig good = load_drafter_config(kGolden + "/drafter_init/config.json");
  const Qwen3Config t = load_qwen3_config(kGolden + "/target/config.json");
  const auto code = testing::ExitedWithCode(kBadInput);
  DrafterConfig d = good;
  d.layers.hidden_size = t.hidden_size * 2;
  EXPECT_EXIT(check_drafter_fits_target(d, t), code, "drafter hidden_size 128 differs from the target's hidden_size 64");
  d = good;
  d.target_layer_ids = {1, t.num_hidden_layers};
  EXPECT_EXIT(check_drafter_fits_target(d, t), code, "target layer id 6 is outside the target's layers");
  d = good;
  d.target_layer_ids = {-1};
  EXPECT_EXIT(check_drafter_fits_target(d, t), code, "target layer id -1 is outside");
  d = good;
  d.block_size = 1;
  EXPECT_EXIT(check_drafter_fits_target(d, t), code, "block_size 1 is below 2");
  d = good;
  d.mask_token_id = t.vocab_size;
  EXPECT_EXIT(check_drafter_fits_target(d, t), code, "mask_token_id 512 is outside the target's vocabulary");
  d = good;
  d.num_target_layers = t.num_hidden_layers + 1;
  EXPECT_EXIT(check_drafter_fits_target(d, t), code, "num_target_layers 7 differs");
  d = good;
  d.layers.vocab_size = t.vocab_size + 1;
  EXPECT_EXIT(check_drafter_fits_target(d, t), code, "vocab_size 513 differs");
}

TEST(HfConfig, Qwen35HybridConfigParsesItsSharedFields) {
  const std::string path = std::string(DFLASH_TEST_DATA) + "/golden/qwen35-tiny-a/target/config.json";
  const json raw = read_json(path);
  Qwen3Config q = load_qwen3_config(path);
  EXPECT_EQ(q.layer_types, raw["layer_types"].get<std::vector<std::string>>());
  EXPECT_EQ(q.head_dim, raw["head_dim"].get<int>());
  EXPECT_FLOAT_EQ(q.rope_theta, raw["rope_parameters"]["rope_theta"].get<float>());
  // The VLM release nests the same fields under text_config and keeps tie_word_embeddings at the top.
  json vlm = {{"text_config", raw}, {"tie_word_embeddings", true}};
  vlm["text_config"].erase("tie_word_embeddings");
  Qwen3Config v = parse_qwen3_config(vlm, "vlm.json");
  EXPECT_EQ(v.weight_prefix, "model.language_model.");
  EXPECT_TRUE(v.tie_word_embeddings);
  EXPECT_EQ(v.layer_types, q.layer_types);
}

namespace {

// A DFlash2 release config (the golden case's drafter_init, written like the official fixture): the
// architecture, block_size from dflash_config only, the conv/selector shape, compute_logits' fields and
// is_causal; written back and parsed again, the same; a group size that does not divide the hidden size and
// is_causal false with a sliding layer are refused against the target.
TEST(HfConfig, DFlash2ReleaseConfigRoundTrips) {
  const std::string dir = std::string(DFLASH_TEST_DATA) + "/golden/dflash2-tiny-a";
  const dflash::DrafterConfig d = dflash::load_drafter_config(dir + "/drafter_init/config.json");
  EXPECT_EQ(d.arch, dflash::DraftArch::DFlash2);
  EXPECT_EQ(d.block_size, 8);
  EXPECT_EQ(d.d2.conv_kernel_size, 2);
  EXPECT_EQ(d.d2.conv_group_size, 16);
  EXPECT_EQ(d.d2.selector_top_k, 16);
  EXPECT_EQ(d.d2.selector_rank, 16);
  EXPECT_FLOAT_EQ(d.output_multiplier, 2.5f);
  EXPECT_FLOAT_EQ(d.final_logit_softcapping, 4.0f);
  EXPECT_EQ(d.is_causal, 0);
  const nlohmann::json j = dflash::drafter_config_to_json(d);
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"DFlash2DraftModel"}));
  EXPECT_FALSE(j.contains("block_size"));
  EXPECT_EQ(j["dflash_config"]["block_size"], 8);
  const dflash::DrafterConfig back = dflash::parse_drafter_config(j, "round trip");
  EXPECT_EQ(back.arch, d.arch);
  EXPECT_EQ(back.block_size, d.block_size);
  EXPECT_EQ(back.d2.selector_rank, d.d2.selector_rank);
  EXPECT_EQ(back.final_logit_softcapping, d.final_logit_softcapping);
  EXPECT_EQ(back.is_causal, d.is_causal);
  const dflash::Qwen3Config t = dflash::load_qwen3_config(dir + "/target/config.json");
  dflash::check_drafter_fits_target(d, t);
  dflash::DrafterConfig bad = d;
  bad.d2.conv_group_size = 24;
  EXPECT_DEATH(dflash::check_drafter_fits_target(bad, t), "conv_group_size 24 does not divide hidden_size 64");
  bad = d;
  bad.is_causal = 1;  // full layers causal within the block: not offered
  EXPECT_DEATH(dflash::check_drafter_fits_target(bad, t), "is_causal true with a full_attention layer 0");
  dflash::DrafterConfig sliding = d;  // the release's combination: sliding layers, is_causal false
  sliding.layers.layer_types[0] = "sliding_attention";
  sliding.layers.sliding_window = 16;
  dflash::check_drafter_fits_target(sliding, t);
  EXPECT_TRUE(dflash::ops::drafter_attn_spec(sliding, 0).full_block);
  EXPECT_FALSE(dflash::ops::drafter_attn_spec(sliding, 1).full_block);  // a full layer: the window is 0 anyway
  sliding.is_causal = -1;
  EXPECT_FALSE(dflash::ops::drafter_attn_spec(sliding, 0).full_block);
}

}  // namespace
