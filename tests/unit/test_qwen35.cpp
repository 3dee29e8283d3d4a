// The Qwen3.5 / Qwen3.6 hybrid target on the CPU backend: the Gated DeltaNet ops against independent
// double-precision references (the delta rule against Hugging Face's chunked UT-transform form), the whole
// forward against the golden case (HF Qwen3_5ForCausalLM in float64), packing invariance, the VLM layout
// (model.language_model. + text_config), and the refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>

#include <nlohmann/json.hpp>

#include "dflash/safetensors.h"
#include "dflash/target.h"
#include "model/qwen35_config.h"
#include "model/qwen3_weights.h"
#include "ops/gated_delta.h"
#include "ops_test_util.h"
#include "target_golden.h"
#include "test_support.h"

namespace dflash {
namespace {

using nlohmann::json;

const std::string kCase = std::string(DFLASH_TEST_DATA) + "/golden/qwen35-tiny-a";
const std::string kTargetDir = kCase + "/target";

using test::all_layers;
using test::load_target;
using test::read_f32;
using test::read_i32;
using test::run_target;
using test::RunResult;
using test::TensorCopy;

PackedBatch golden_batch() { return test::golden_batch(kCase); }
std::string make_temp_dir() { return test::make_temp_dir("dflash_qwen35_"); }

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Writes a copy of the golden target into dir (one model.safetensors, float32): config from
// `config`, every tensor name passed through `rename`, tensors edited by `edit` on the way.
void write_target_copy(const std::string& dir, const json& config,
                       const std::function<std::string(const std::string&)>& rename = nullptr,
                       const std::function<void(std::vector<TensorCopy>&)>& edit = nullptr) {
  std::ofstream(dir + "/config.json") << config.dump(2);
  test::write_checkpoint_copy(kTargetDir, dir, DType::F32, rename, edit);
}

// ---- ops ------------------------------------------------------------------------------------------

// Hugging Face's torch_chunk_gated_delta_rule for one sequence and one value head, in double: a
// different algorithm (UT transform per chunk, chunk scan) from the op's token recurrence.
// q, k [S, dk] (already l2-normalised, q scaled), v [S, dv], g, beta [S]; returns out [S, dv].
std::vector<double> chunked_delta_rule(const std::vector<double>& q, const std::vector<double>& k,
                                       const std::vector<double>& v, const std::vector<double>& g,
                                       const std::vector<double>& beta, int64_t S, int64_t dk, int64_t dv,
                                       int64_t C) {
  std::vector<double> out(S * dv, 0.0), state(dk * dv, 0.0);
  for (int64_t c0 = 0; c0 < S; c0 += C) {
    const int64_t n = std::min(C, S - c0);  // the zero padding of a last short chunk changes nothing
    std::vector<double> cum(n);
    for (int64_t i = 0; i < n; ++i) cum[i] = (i ? cum[i - 1] : 0.0) + g[c0 + i];
    auto dot = [&](const std::vector<double>& a, int64_t i, const std::vector<double>& b, int64_t j) {
      double s = 0.0;
      for (int64_t d = 0; d < dk; ++d) s += a[(c0 + i) * dk + d] * b[(c0 + j) * dk + d];
      return s;
    };
    // (I + L) X = B with L[i][j] = beta_i (k_i . k_j) exp(cum_i - cum_j), j < i; B = [v beta | k beta exp(cum)].
    std::vector<double> new_v(n * dv), kcd(n * dk);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t e = 0; e < dv; ++e) new_v[i * dv + e] = v[(c0 + i) * dv + e] * beta[c0 + i];
      for (int64_t d = 0; d < dk; ++d) kcd[i * dk + d] = k[(c0 + i) * dk + d] * beta[c0 + i] * std::exp(cum[i]);
      for (int64_t j = 0; j < i; ++j) {
        const double L = beta[c0 + i] * dot(k, i, k, j) * std::exp(cum[i] - cum[j]);
        for (int64_t e = 0; e < dv; ++e) new_v[i * dv + e] -= L * new_v[j * dv + e];
        for (int64_t d = 0; d < dk; ++d) kcd[i * dk + d] -= L * kcd[j * dk + d];
      }
    }
    // v_new = new_v - kcd S;  out = (q exp(cum)) S + intra v_new;  S = exp(cum_last) S + (k exp(cum_last - cum))^T v_new
    std::vector<double> v_new(n * dv);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < dv; ++e) {
        double s = new_v[i * dv + e];
        for (int64_t d = 0; d < dk; ++d) s -= kcd[i * dk + d] * state[d * dv + e];
        v_new[i * dv + e] = s;
      }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < dv; ++e) {
        double s = 0.0;
        for (int64_t d = 0; d < dk; ++d) s += q[(c0 + i) * dk + d] * std::exp(cum[i]) * state[d * dv + e];
        for (int64_t j = 0; j <= i; ++j) s += dot(q, i, k, j) * std::exp(cum[i] - cum[j]) * v_new[j * dv + e];
        out[(c0 + i) * dv + e] = s;
      }
    const double last = cum[n - 1];
    for (int64_t d = 0; d < dk; ++d)
      for (int64_t e = 0; e < dv; ++e) {
        double s = std::exp(last) * state[d * dv + e];
        for (int64_t j = 0; j < n; ++j) s += k[(c0 + j) * dk + d] * std::exp(last - cum[j]) * v_new[j * dv + e];
        state[d * dv + e] = s;
      }
  }
  return out;
}

TEST(Qwen35Ops, GatedDeltaRuleMatchesChunkedReferencePerSequence) {
  const ops::GdnHeads h{2, 8, 4, 6};  // two value heads per key head
  std::vector<int32_t> cu = {0, 5, 16, 17};  // a short, a multi-chunk and a one-token sequence
  const int64_t T = cu.back(), row = h.qkv_dim();
  const std::vector<float> qkv = test::random_vec(T * row, 11);
  std::vector<float> g = test::random_vec(T * h.nv, 12, 0.5f), beta = test::random_vec(T * h.nv, 13);
  for (float& x : g) x = -std::fabs(x);                    // log decays <= 0
  for (float& x : beta) x = 1.0f / (1.0f + std::exp(-x));  // in (0, 1)
  std::vector<float> out(T * h.value_dim(), NAN), state(h.nv * h.dk * h.dv, NAN);
  ops::gated_delta_rule_forward(cpu_ctx(), cpu_view(out.data(), {T, h.value_dim()}),
                                Tensor(state.data(), DType::F32, Device::CPU, {h.nv, h.dk, h.dv}),
                                cpu_view(qkv.data(), {T, row}), cpu_view(g.data(), {T, h.nv}),
                                cpu_view(beta.data(), {T, h.nv}), cpu_view(cu.data(), {4}), h);

  std::vector<double> want(T * h.value_dim());
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t b = cu[s], S = cu[s + 1] - cu[s];
    for (int64_t vh = 0; vh < h.nv; ++vh) {
      const int64_t kh = vh / (h.nv / h.nk);  // repeat_interleave: consecutive value heads share a key head
      std::vector<double> q(S * h.dk), k(S * h.dk), v(S * h.dv), gg(S), bb(S);
      for (int64_t t = 0; t < S; ++t) {
        const float* x = qkv.data() + (b + t) * row;
        double nq = 0, nk = 0;
        for (int64_t d = 0; d < h.dk; ++d) {
          nq += double(x[kh * h.dk + d]) * x[kh * h.dk + d];
          nk += double(x[h.key_dim() + kh * h.dk + d]) * x[h.key_dim() + kh * h.dk + d];
        }
        for (int64_t d = 0; d < h.dk; ++d) {
          q[t * h.dk + d] = x[kh * h.dk + d] / std::sqrt(nq + 1e-6) / std::sqrt(double(h.dk));
          k[t * h.dk + d] = x[h.key_dim() + kh * h.dk + d] / std::sqrt(nk + 1e-6);
        }
        for (int64_t e = 0; e < h.dv; ++e) v[t * h.dv + e] = x[2 * h.key_dim() + vh * h.dv + e];
        gg[t] = g[(b + t) * h.nv + vh];
        bb[t] = beta[(b + t) * h.nv + vh];
      }
      const std::vector<double> o = chunked_delta_rule(q, k, v, gg, bb, S, h.dk, h.dv, /*chunk=*/4);
      for (int64_t t = 0; t < S; ++t)
        for (int64_t e = 0; e < h.dv; ++e) want[(b + t) * h.value_dim() + vh * h.dv + e] = o[t * h.dv + e];
    }
  }
  const double err = test::rel_err(out, want);
  std::printf("  gated delta rule vs chunked reference: rel err %.3g\n", err);
  EXPECT_LT(err, 1e-5);
}

TEST(Qwen35Ops, CausalConvSiluRestartsAtEachSequence) {
  const int64_t C = 5, K = 4;
  std::vector<int32_t> cu = {0, 2, 9};
  const int64_t T = cu.back();
  const std::vector<float> in = test::random_vec(T * C, 21), w = test::random_vec(C * K, 22);
  std::vector<float> out(T * C, NAN);
  ops::causal_conv1d_silu_forward(cpu_ctx(), cpu_view(out.data(), {T, C}), cpu_view(in.data(), {T, C}),
                                  cpu_view(w.data(), {C, K}), cpu_view(cu.data(), {3}));
  std::vector<double> want(T * C);
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0.0;  // F.conv1d with padding K-1, first T outputs
        for (int64_t j = 0; j < K; ++j) {
          const int64_t u = t - (K - 1) + j;
          if (u >= cu[s]) acc += double(w[c * K + j]) * in[u * C + c];
        }
        want[t * C + c] = acc / (1.0 + std::exp(-acc));
      }
  EXPECT_LT(test::rel_err(out, want), 1e-6);
}

TEST(Qwen35Ops, GatesAndGatedNorm) {
  const int64_t T = 3, nv = 4, dv = 6;
  const std::vector<float> a = test::random_vec(T * nv, 31, 10.0f), b = test::random_vec(T * nv, 32);
  const std::vector<float> A_log = test::random_vec(nv, 33), dt = test::random_vec(nv, 34, 10.0f);
  std::vector<float> g(T * nv), beta(T * nv);
  ops::gdn_gates_forward(cpu_ctx(), cpu_view(g.data(), {T, nv}), cpu_view(beta.data(), {T, nv}),
                         cpu_view(a.data(), {T, nv}), cpu_view(b.data(), {T, nv}), cpu_view(A_log.data(), {nv}),
                         cpu_view(dt.data(), {nv}));
  std::vector<double> g_ref(T * nv), beta_ref(T * nv);
  for (int64_t i = 0; i < T * nv; ++i) {
    const double x = double(a[i]) + dt[i % nv];
    g_ref[i] = -std::exp(double(A_log[i % nv])) * (x > 20 ? x : std::log1p(std::exp(x)));
    beta_ref[i] = 1.0 / (1.0 + std::exp(-double(b[i])));
  }
  EXPECT_LT(test::rel_err(g, g_ref), 1e-6);
  EXPECT_LT(test::rel_err(beta, beta_ref), 1e-6);

  const std::vector<float> x = test::random_vec(T * dv, 35), z = test::random_vec(T * dv, 36),
                           w = test::random_vec(dv, 37);
  std::vector<float> y = x;  // in place
  ops::gated_rmsnorm_forward(cpu_ctx(), cpu_view(y.data(), {T, dv}), cpu_view(y.data(), {T, dv}),
                             cpu_view(z.data(), {T, dv}), cpu_view(w.data(), {dv}), 1e-6f);
  std::vector<double> y_ref = test::ref::rmsnorm(test::to_double(x), test::to_double(w), T, dv, 1e-6);
  for (int64_t i = 0; i < T * dv; ++i) y_ref[i] *= z[i] / (1.0 + std::exp(-double(z[i])));
  EXPECT_LT(test::rel_err(y, y_ref), 1e-6);
}

// ---- config ---------------------------------------------------------------------------------------

TEST(Qwen35Config, GoldenConfigFields) {
  const Qwen35Config c = load_qwen35_config(kTargetDir + "/config.json");
  EXPECT_EQ(c.text.num_hidden_layers, 4);
  EXPECT_EQ(c.text.weight_prefix, "model.");
  EXPECT_EQ(c.rotary_dim, 8);  // int(32 * 0.25)
  EXPECT_FLOAT_EQ(c.text.rope_theta, 1e7f);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.linear_num_key_heads, 2);
  EXPECT_EQ(c.linear_num_value_heads, 4);
  EXPECT_EQ(c.linear_key_head_dim, 16);
  EXPECT_EQ(c.linear_value_head_dim, 16);
  ASSERT_EQ(c.kinds.size(), 4u);
  EXPECT_EQ(c.kinds[0], Qwen35LayerKind::LinearAttention);
  EXPECT_EQ(c.kinds[3], Qwen35LayerKind::FullAttention);
  EXPECT_TRUE(is_qwen35_checkpoint(kTargetDir));
  EXPECT_FALSE(is_qwen35_checkpoint(std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a/target"));
}

TEST(Qwen35Config, DefaultsAndTopLevelRotaryFactor) {
  json j = read_json(kTargetDir + "/config.json");
  j.erase("layer_types");
  j.erase("linear_conv_kernel_dim");
  j["rope_parameters"].erase("partial_rotary_factor");
  j["partial_rotary_factor"] = 0.5;
  j["num_hidden_layers"] = 8;
  const Qwen35Config c = parse_qwen35_config(j, "test");
  EXPECT_EQ(c.rotary_dim, 16);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  ASSERT_EQ(c.kinds.size(), 8u);
  for (int l = 0; l < 8; ++l)  // HF default: every 4th layer is full attention
    EXPECT_EQ(c.kinds[l], l % 4 == 3 ? Qwen35LayerKind::FullAttention : Qwen35LayerKind::LinearAttention) << l;
}

TEST(Qwen35Config, RefusesWhatThisBuildCannotRun) {
  const json base = read_json(kTargetDir + "/config.json");
  json moe = base;
  moe["model_type"] = "qwen3_5_moe_text";
  EXPECT_EXIT(parse_qwen35_config(moe, "cfg.json"), testing::ExitedWithCode(3), "mixture-of-experts");
  json ungated = base;
  ungated["attn_output_gate"] = false;
  EXPECT_EXIT(parse_qwen35_config(ungated, "cfg.json"), testing::ExitedWithCode(3), "attn_output_gate");
  json groups = base;
  groups["linear_num_value_heads"] = 3;
  EXPECT_EXIT(parse_qwen35_config(groups, "cfg.json"), testing::ExitedWithCode(3), "not a multiple");
  json sliding = base;
  sliding["layer_types"][1] = "sliding_attention";
  sliding["sliding_window"] = 16;
  EXPECT_EXIT(parse_qwen35_config(sliding, "cfg.json"), testing::ExitedWithCode(3), "layer 1 is sliding_attention");
  json rot = base;
  rot["rope_parameters"]["partial_rotary_factor"] = 0.01;
  EXPECT_EXIT(parse_qwen35_config(rot, "cfg.json"), testing::ExitedWithCode(3), "rotary dim 0");
}

TEST(Qwen35Config, TargetConfigIsTheHybridWithItsTextWidths) {
  const TargetConfig c = load_target_config(kTargetDir);
  EXPECT_EQ(c.family, TargetFamily::Qwen35Hybrid);
  EXPECT_STREQ(target_family_name(c.family), "qwen3.5-hybrid");
  ASSERT_NE(c.qwen35, nullptr);
  EXPECT_EQ(c.text.num_hidden_layers, 4);
  EXPECT_EQ(c.text.hidden_size, 64);
  EXPECT_EQ(c.text.vocab_size, 512);
  EXPECT_EQ(c.text.head_dim, 32);
  EXPECT_EQ(c.qwen35->text.hidden_size, c.text.hidden_size);
  EXPECT_EQ(c.qwen35->text.layer_types, c.text.layer_types);
  EXPECT_EQ(c.qwen35->rotary_dim, 8);
  ASSERT_EQ(c.qwen35->kinds.size(), 4u);
}

TEST(Qwen35Config, FactoryBuildsTheHybridTarget) {
  const TargetConfig c = load_target_config(kTargetDir);
  const std::unique_ptr<TargetModel> model = make_target_model(c, kTargetDir, cpu_ctx(), {3}, 16);
  EXPECT_EQ(model->family(), TargetFamily::Qwen35Hybrid);
  EXPECT_EQ(model->config().num_hidden_layers, 4);
  EXPECT_EQ(model->capture_layers(), std::vector<int>{3});
  EXPECT_EQ(model->lm_head().shape_str(), "[512, 64]");
}

// ---- the whole forward ----------------------------------------------------------------------------

TEST(Qwen35Golden, EveryLayerFinalNormAndLogitsMatchTransformers) {
  auto model = load_target(kTargetDir, cpu_ctx(), all_layers(4), golden_batch().num_tokens());
  EXPECT_EQ(model->activation_dtype(), DType::F32);
  test::expect_matches_golden(*model, kCase, "text layout");
}

TEST(Qwen35Golden, PackedBatchEqualsEachSequenceAlone) {
  PackedBatch batch = golden_batch();
  // A third, one-token sequence: the conv and recurrent state must restart for it too.
  batch.tokens.push_back(7);
  batch.cu_seqlens.push_back(batch.cu_seqlens.back() + 1);
  const std::vector<int> layers = {2, 0, 3};  // out of order; linear and full-attention layers
  auto model = load_target(kTargetDir, cpu_ctx(), layers, batch.num_tokens());
  test::expect_packed_equals_each_alone(*model, batch);
}

TEST(Qwen35Golden, LayerListedTwiceIsCapturedTwice) {
  const PackedBatch batch = golden_batch();
  const int64_t T = batch.num_tokens();
  auto model = load_target(kTargetDir, cpu_ctx(), {1, 3, 1}, T);
  RunResult r = run_target(*model, batch);
  test::expect_slots_match_golden(r.features, {0, 2}, 1, kCase, T, model->config().hidden_size);
}

// The released checkpoints' layout: a Qwen3_5ForConditionalGeneration config with the text fields under
// text_config, text weights under model.language_model. (vision weights beside them are ignored).
TEST(Qwen35Golden, VisionLanguageLayoutLoadsAndMatches) {
  const std::string dir = make_temp_dir();
  json text = read_json(kTargetDir + "/config.json");
  text.erase("architectures");
  text.erase("tie_word_embeddings");  // kept at the top level only, as some VLM configs do
  json vlm = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
              {"model_type", "qwen3_5"},
              {"text_config", text},
              {"vision_config", {{"model_type", "qwen3_5_vision"}, {"hidden_size", 16}, {"depth", 1}}},
              {"tie_word_embeddings", false},
              {"image_token_id", 500}};
  write_target_copy(
      dir, vlm,
      [](const std::string& n) { return n.rfind("model.", 0) == 0 ? "model.language_model." + n.substr(6) : n; },
      [](std::vector<TensorCopy>& ts) {  // a vision tower tensor the text model must ignore
        ts.push_back({"model.visual.patch_embed.proj.weight", {16, 3}, std::vector<float>(48, 1.0f)});
      });
  auto model = load_target(dir, cpu_ctx(), all_layers(4), golden_batch().num_tokens());
  test::expect_matches_golden(*model, kCase, "VLM layout");
  std::filesystem::remove_all(dir);
}

// ---- refusals -------------------------------------------------------------------------------------

TEST(Qwen35Errors, WrongShapeNamesTheTensor) {
  const std::string dir = make_temp_dir();
  write_target_copy(dir, read_json(kTargetDir + "/config.json"), nullptr, [](std::vector<TensorCopy>& ts) {
    for (TensorCopy& t : ts)
      if (t.name == "model.layers.1.linear_attn.conv1d.weight") t.shape = {t.shape[0], t.shape[2], t.shape[1]};
  });
  EXPECT_EXIT(load_target(dir, cpu_ctx(), {1}, 16), testing::ExitedWithCode(3),
              "model.layers.1.linear_attn.conv1d.weight");
  std::filesystem::remove_all(dir);
}

TEST(Qwen35Errors, MissingTensorIsNamed) {
  const std::string dir = make_temp_dir();
  write_target_copy(dir, read_json(kTargetDir + "/config.json"), nullptr, [](std::vector<TensorCopy>& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](const TensorCopy& t) {
               return t.name == "model.layers.3.self_attn.q_norm.weight";
             }),
             ts.end());
  });
  EXPECT_EXIT(load_target(dir, cpu_ctx(), {1}, 16), testing::ExitedWithCode(3), "model.layers.3.self_attn.q_norm");
  std::filesystem::remove_all(dir);
}

TEST(Qwen35Errors, BadBatchIsRefused) {
  auto model = load_target(kTargetDir, cpu_ctx(), {}, 8);
  PackedBatch b;
  b.tokens = {1, 2, 512};
  b.cu_seqlens = {0, 3};
  EXPECT_EXIT(model->forward(b, CaptureOut{}), testing::ExitedWithCode(3), "token id 512 at position 2");
  b.tokens = std::vector<int32_t>(9, 1);
  b.cu_seqlens = {0, 9};
  EXPECT_EXIT(model->forward(b, CaptureOut{}), testing::ExitedWithCode(3), "packed batch of 9 tokens");
}

// The CUDA delta rule takes Gated DeltaNet head dims that are multiples of 8 up to 128: another is refused
// before any weight is loaded or any CUDA call is made (so this runs in CPU-only builds too).
TEST(Qwen35Errors, CudaUnsupportedDeltaRuleHeadDimIsRefusedUpFront) {
  Ctx cuda;
  cuda.device = Device::CUDA;
  for (const char* key : {"linear_key_head_dim", "linear_value_head_dim"}) {
    const std::string dir = make_temp_dir();
    nlohmann::json j = nlohmann::json::parse(std::ifstream(kTargetDir + "/config.json"));
    j[key] = 256;
    std::ofstream(dir + "/config.json") << j.dump(2);
    EXPECT_EXIT(make_target_model(load_target_config(dir), dir, cuda, {1}, 16), testing::ExitedWithCode(2),
                "delta rule takes multiples of 8 up to 128");
    std::filesystem::remove_all(dir);
  }
}

// The dense Qwen3 loader itself still refuses hybrid layers (only make_target_model's dispatch routes them here).
TEST(Qwen35Errors, DenseLoaderRefusesLinearAttentionLayers) {
  const Qwen3Config c = load_qwen3_config(kTargetDir + "/config.json");
  EXPECT_EXIT(check_qwen3_target_config(c, "config.json"), testing::ExitedWithCode(3), "linear_attention");
}

}  // namespace
}  // namespace dflash
