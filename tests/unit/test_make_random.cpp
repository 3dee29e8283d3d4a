// dflash-make-random's hybrid presets (apps/dflash-make-random.cpp, the layout in apps/make_target_common.h):
// qwen36-27b with the 27B's per-head shapes (attention 24/4 heads x 256, partial rotary 64; Gated DeltaNet
// 16 key / 48 value heads x 128, conv 4) at a small width loads through make_target_model as the Qwen3.5/3.6
// hybrid its config says, and its random forward is numerically sane: every layer's output finite and of a
// bounded size, over many layers too (tiny-hybrid at 48 layers), and FP8 (--target-precision fp8 and
// fp8-dynamic, what bench/fp8_run.sh measures on the GPU at the 27B's width) stays close to bf16.
// tiny-hybrid writes dflash-make-tiny --hybrid's layout: the same config and tensor names and shapes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/safetensors.h"
#include "dflash/target.h"
#include "model/qwen35_config.h"
#include "ops_test_util.h"
#include "test_support.h"

namespace dflash {
namespace {

const std::string kBin = DFLASH_BIN_DIR;

bool have(const std::string& prog) {
  struct stat st;
  return ::stat((kBin + "/" + prog).c_str(), &st) == 0;
}

// Runs PROG ARGS > dir/log.txt; the exit code.
int run_prog(const std::string& prog, const std::string& args, const std::string& log) {
  const int rc = std::system((kBin + "/" + prog + " " + args + " > " + log + " 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

nlohmann::json read_json(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  EXPECT_NE(f, nullptr) << path;
  if (!f) return {};
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) s.append(buf, n);
  std::fclose(f);
  return nlohmann::json::parse(s);
}

// name -> shape of every tensor of a checkpoint directory (through its index).
std::map<std::string, std::vector<int64_t>> tensor_shapes(const std::string& dir) {
  std::map<std::string, std::vector<int64_t>> out;
  const nlohmann::json index = read_json(dir + "/model.safetensors.index.json");
  std::map<std::string, bool> files;
  for (const auto& [name, file] : index["weight_map"].items()) files[file.get<std::string>()] = true;
  for (const auto& [file, _] : files) {
    SafetensorsFile f(dir + "/" + file);
    for (const auto& [name, file2] : index["weight_map"].items())
      if (file2 == file) out[name] = f.get(name).shape;
  }
  return out;
}

// Random tokens in 2 packed sequences.
PackedBatch random_batch(int vocab, int64_t len) {
  PackedBatch b;
  std::mt19937 rng(7);
  b.cu_seqlens = {0};
  for (int s = 0; s < 2; ++s) {
    for (int64_t t = 0; t < len; ++t) b.tokens.push_back(static_cast<int32_t>(rng() % vocab));
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
  }
  b.loss_mask.assign(b.tokens.size(), 1);
  return b;
}

test::RunResult forward(const std::string& dir, const std::string& precision, const PackedBatch& batch) {
  TargetConfig cfg = load_target_config(dir);
  resolve_target_precision(cfg.quant, precision);
  auto model = make_target_model(cfg, dir, cpu_ctx(), test::all_layers(cfg.text.num_hidden_layers), batch.num_tokens());
  return test::run_target(*model, batch);
}

// Every captured layer's output finite, its RMS within [lo, hi] (the residual stream neither dies nor
// blows up); the final norm finite.
void expect_sane(const test::RunResult& r, int layers, int64_t T, int64_t H, double lo, double hi) {
  for (int l = 0; l < layers; ++l) {
    double ss = 0;
    bool finite = true;
    for (int64_t i = 0; i < T * H; ++i) {
      const float x = r.features[l * T * H + i];
      finite = finite && std::isfinite(x);
      ss += double(x) * x;
    }
    const double rms = std::sqrt(ss / double(T * H));
    ASSERT_TRUE(finite) << "layer " << l << " has inf/NaN";
    EXPECT_GT(rms, lo) << "layer " << l;
    EXPECT_LT(rms, hi) << "layer " << l;
    if (l == 0 || l == layers - 1) std::printf("  layer %d output RMS %.3f\n", l, rms);
  }
  for (float x : r.final_norm) ASSERT_TRUE(std::isfinite(x)) << "final norm has inf/NaN";
}

TEST(MakeRandom, Qwen36At27bHeadShapesLoadsAndRunsSane) {
  if (!have("dflash-make-random")) GTEST_SKIP() << "build the dflash-make-random target first";
  const std::string dir = test::make_temp_dir("dflash-make-random-");
  // The 27B's heads, a small width: 8 layers = 6 Gated DeltaNet + 2 gated attention (layers 3 and 7).
  ASSERT_EQ(run_prog("dflash-make-random",
                     dir + " --preset qwen36-27b --hidden 256 --intermediate 512 --vocab 1024 --layers 8 --records 3"
                           " --min-len 32 --max-len 48 --threads 2 --shard-gb 0.02",
                     dir + "/log.txt"),
            0)
      << "see " << dir << "/log.txt";
  const std::string target = dir + "/target";

  const TargetConfig cfg = load_target_config(target);
  ASSERT_EQ(cfg.family, TargetFamily::Qwen35Hybrid);
  ASSERT_NE(cfg.qwen35, nullptr);
  const Qwen35Config& q = *cfg.qwen35;
  EXPECT_EQ(cfg.text.num_hidden_layers, 8);
  EXPECT_EQ(cfg.text.hidden_size, 256);
  EXPECT_EQ(cfg.text.vocab_size, 1024);
  EXPECT_EQ(cfg.text.num_attention_heads, 24);
  EXPECT_EQ(cfg.text.num_key_value_heads, 4);
  EXPECT_EQ(cfg.text.head_dim, 256);
  EXPECT_EQ(q.rotary_dim, 64);
  EXPECT_FLOAT_EQ(cfg.text.rope_theta, 1e7f);
  EXPECT_EQ(q.linear_num_key_heads, 16);
  EXPECT_EQ(q.linear_num_value_heads, 48);
  EXPECT_EQ(q.linear_key_head_dim, 128);
  EXPECT_EQ(q.linear_value_head_dim, 128);
  EXPECT_EQ(q.linear_conv_kernel_dim, 4);
  EXPECT_FALSE(cfg.text.tie_word_embeddings);
  for (int l = 0; l < 8; ++l)
    EXPECT_EQ(q.kinds[l], (l + 1) % 4 ? Qwen35LayerKind::LinearAttention : Qwen35LayerKind::FullAttention) << l;

  // The checkpoint's shapes: the gated q_proj's query + gate rows, the GDN's projections and its conv.
  const auto shapes = tensor_shapes(target);
  EXPECT_EQ(shapes.at("model.layers.3.self_attn.q_proj.weight"), (std::vector<int64_t>{2 * 24 * 256, 256}));
  EXPECT_EQ(shapes.at("model.layers.3.self_attn.k_proj.weight"), (std::vector<int64_t>{4 * 256, 256}));
  EXPECT_EQ(shapes.at("model.layers.0.linear_attn.in_proj_qkv.weight"), (std::vector<int64_t>{10240, 256}));
  EXPECT_EQ(shapes.at("model.layers.0.linear_attn.in_proj_z.weight"), (std::vector<int64_t>{6144, 256}));
  EXPECT_EQ(shapes.at("model.layers.0.linear_attn.in_proj_b.weight"), (std::vector<int64_t>{48, 256}));
  EXPECT_EQ(shapes.at("model.layers.0.linear_attn.conv1d.weight"), (std::vector<int64_t>{10240, 1, 4}));
  EXPECT_EQ(shapes.at("model.layers.0.linear_attn.out_proj.weight"), (std::vector<int64_t>{256, 6144}));
  EXPECT_EQ(shapes.at("lm_head.weight"), (std::vector<int64_t>{1024, 256}));
  // embed; 14 per GDN layer (2 norms, 4 in_proj, conv, A_log, dt_bias, gated norm, out_proj, 3 MLP); 11 per
  // attention layer (2 norms, q/k/v/o, q/k norms, 3 MLP); model.norm + lm_head
  EXPECT_EQ(shapes.size(), 1u + 6 * 14 + 2 * 11 + 2u);

  // The GDN decay parameters as HF initialises them: A_log in [0, log 16], dt_bias = softplus^-1 of a dt in
  // [1e-3, 1e-1]; the zero-centred norms near 0.
  {
    const nlohmann::json index = read_json(target + "/model.safetensors.index.json");
    auto values = [&](const std::string& name) {
      SafetensorsFile f(target + "/" + index["weight_map"][name].get<std::string>());
      return test::read_f32(f, name);
    };
    for (float a : values("model.layers.1.linear_attn.A_log")) {
      EXPECT_GE(a, -0.01f);
      EXPECT_LE(a, std::log(16.f) + 0.02f);
    }
    for (float d : values("model.layers.1.linear_attn.dt_bias")) {
      EXPECT_GE(d, -7.0f);  // softplus^-1(1e-3) = -6.9
      EXPECT_LE(d, -2.2f);  // softplus^-1(1e-1) = -2.25
    }
    for (float w : values("model.layers.1.input_layernorm.weight")) EXPECT_LT(std::abs(w), 0.2f);
    for (float w : values("model.layers.1.linear_attn.norm.weight")) EXPECT_NEAR(w, 1.f, 0.2f);
  }

  const PackedBatch batch = random_batch(1024, 48);
  const int64_t T = batch.num_tokens(), H = 256;
  const test::RunResult bf16 = forward(target, "", batch);
  expect_sane(bf16, 8, T, H, 0.3, 30.0);
  // What bench/fp8_run.sh measures at the 27B's width on the GPU, here through the CPU's FP8 emulation.
  for (const char* p : {"fp8", "fp8-dynamic"}) {
    const test::RunResult r = forward(target, p, batch);
    expect_sane(r, 8, T, H, 0.3, 30.0);
    const double e = test::rel_err(r.features, bf16.features);
    std::printf("  --target-precision %s: relative L2 error of the features %.4f\n", p, e);
    EXPECT_GT(e, 1e-3) << p << " changed nothing";
    EXPECT_LT(e, 0.15) << p;
  }
}

TEST(MakeRandom, TinyHybridStaysSaneOverManyLayers) {
  if (!have("dflash-make-random")) GTEST_SKIP() << "build the dflash-make-random target first";
  const std::string dir = test::make_temp_dir("dflash-make-random-");
  ASSERT_EQ(run_prog("dflash-make-random",
                     dir + " --preset tiny-hybrid --layers 48 --records 2 --min-len 32 --max-len 48 --threads 2",
                     dir + "/log.txt"),
            0)
      << "see " << dir << "/log.txt";
  const TargetConfig cfg = load_target_config(dir + "/target");
  ASSERT_EQ(cfg.family, TargetFamily::Qwen35Hybrid);
  EXPECT_EQ(std::count(cfg.qwen35->kinds.begin(), cfg.qwen35->kinds.end(), Qwen35LayerKind::FullAttention), 12);
  const PackedBatch batch = random_batch(512, 64);
  expect_sane(forward(dir + "/target", "", batch), 48, batch.num_tokens(), 64, 0.3, 30.0);
}

// One place knows the hybrid layout (apps/make_target_common.h): dflash-make-random --preset tiny-hybrid and
// dflash-make-tiny --hybrid write the same config.json (but for their provenance) and the same tensors.
TEST(MakeRandom, TinyHybridIsMakeTinysLayout) {
  if (!have("dflash-make-random") || !have("dflash-make-tiny"))
    GTEST_SKIP() << "build the dflash-make-random and dflash-make-tiny targets first";
  const std::string dir = test::make_temp_dir("dflash-make-random-");
  ASSERT_EQ(run_prog("dflash-make-random", dir + "/r --preset tiny-hybrid --records 2 --min-len 32 --max-len 48",
                     dir + "/r.log"),
            0);
  ASSERT_EQ(run_prog("dflash-make-tiny", dir + "/t --hybrid --records 4 --min-len 24 --max-len 32", dir + "/t.log"),
            0);
  nlohmann::json r = read_json(dir + "/r/target/config.json"), t = read_json(dir + "/t/target/config.json");
  EXPECT_EQ(r["dflash_random"]["preset"], "tiny-hybrid");
  r.erase("dflash_random");
  t.erase("dflash_tiny");
  EXPECT_EQ(r, t);
  EXPECT_EQ(tensor_shapes(dir + "/r/target"), tensor_shapes(dir + "/t/target"));
}

// The Gated DeltaNet's shape flags belong to the hybrid presets; a hybrid head_dim must leave an even
// partial rotary (a quarter of it).
TEST(MakeRandom, RefusesHybridFlagsOnDensePresetsAndBadHybridShapes) {
  if (!have("dflash-make-random")) GTEST_SKIP() << "build the dflash-make-random target first";
  const std::string dir = test::make_temp_dir("dflash-make-random-");
  EXPECT_EQ(run_prog("dflash-make-random", dir + "/a --preset tiny --gdn-value-heads 8", dir + "/a.log"), 2);
  EXPECT_EQ(run_prog("dflash-make-random", dir + "/b --preset tiny-hybrid --head-dim 12", dir + "/b.log"), 2);
  EXPECT_EQ(run_prog("dflash-make-random", dir + "/c --preset tiny-hybrid --gdn-key-heads 3", dir + "/c.log"), 2);
  EXPECT_EQ(run_prog("dflash-make-random", dir + "/d --preset qwen36-9b", dir + "/d.log"), 2);
}

}  // namespace
}  // namespace dflash
