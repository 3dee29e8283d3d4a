// Checks shared by the target tests (test_target.cpp: dense Qwen3, test_qwen35.cpp: the Qwen3.5 hybrid)
// against a golden case: <case>/golden.safetensors holds HF transformers' float64 run over the case's
// packed batch (tokens, cu_seqlens, target.hidden [L, T, H], target.final_norm, target.logits), <case>/target
// the checkpoint. Both targets answer the same TargetModel calls, so one check serves both.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "dflash/safetensors.h"
#include "dflash/target.h"
#include "ops_test_util.h"
#include "test_support.h"

namespace dflash::test {

// Rows [i T, (i + 1) T) of a [n, T, H] stack: one layer of the golden hidden states, or one slot of the
// captured features.
inline std::vector<float> layer_rows(const std::vector<float>& stack, int64_t i, int64_t T, int64_t H) {
  return std::vector<float>(stack.begin() + i * T * H, stack.begin() + (i + 1) * T * H);
}

// One tensor of a checkpoint copy, as float32, for a test to drop, rename or reshape before writing.
struct TensorCopy {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Writes the checkpoint at src_dir as one dir/model.safetensors in `dtype`: every name passed through
// `rename`, the tensors edited by `edit` on the way. config.json is the caller's to write.
inline void write_checkpoint_copy(const std::string& src_dir, const std::string& dir, DType dtype,
                                  const std::function<std::string(const std::string&)>& rename = nullptr,
                                  const std::function<void(std::vector<TensorCopy>&)>& edit = nullptr) {
  Checkpoint src(src_dir);
  std::vector<TensorCopy> tensors;
  for (const std::string& name : src.names()) {
    const TensorInfo& t = src.get(name);
    TensorCopy c{rename ? rename(name) : name, t.shape, std::vector<float>(t.numel())};
    src.load_f32(name, t.shape, c.data.data());
    tensors.push_back(std::move(c));
  }
  if (edit) edit(tensors);
  std::vector<TensorToWrite> w;
  for (const TensorCopy& c : tensors) w.push_back({c.name, dtype, c.shape, c.data.data(), nullptr});
  write_safetensors(dir + "/model.safetensors", w);
}

// `model` (capturing every layer, in order) over the case's golden batch: each decoder layer's output, the
// final norm and the logits within 1e-5 of transformers'. `what` names the run in the messages.
inline void expect_matches_golden(TargetModel& model, const std::string& case_dir, const char* what) {
  SafetensorsFile g(case_dir + "/golden.safetensors");
  const PackedBatch batch = golden_batch(case_dir);
  const int64_t T = batch.num_tokens();
  const Qwen3Config& c = model.config();
  const int64_t H = c.hidden_size, V = c.vocab_size, L = c.num_hidden_layers;
  ASSERT_EQ(g.get("target.hidden").shape, (std::vector<int64_t>{L, T, H}));
  RunResult r = run_target(model, batch);
  const std::vector<float> hidden = read_f32(g, "target.hidden");
  for (int64_t l = 0; l < L; ++l) {
    const double err = rel_err(layer_rows(r.features, l, T, H), layer_rows(hidden, l, T, H));
    std::printf("  %s: target.hidden[%d] (%s) rel err %.3g\n", what, static_cast<int>(l), c.layer_types[l].c_str(),
                err);
    EXPECT_LT(err, 1e-5) << what << ": decoder layer " << l;
  }
  const double norm_err = rel_err(r.final_norm, read_f32(g, "target.final_norm"));
  std::printf("  %s: target.final_norm rel err %.3g\n", what, norm_err);
  EXPECT_LT(norm_err, 1e-5) << what;
  std::vector<float> logits(T * V);
  model.lm_head_forward(cpu_view(logits.data(), {T, V}), cpu_view(r.final_norm.data(), {T, H}));
  const double logit_err = rel_err(logits, read_f32(g, "target.logits"));
  std::printf("  %s: target.logits rel err %.3g\n", what, logit_err);
  EXPECT_LT(logit_err, 1e-5) << what;
}

// Each of `slots` of the captured features [k, T, H] holds the golden output of decoder `layer` (1e-5).
inline void expect_slots_match_golden(const std::vector<float>& features, const std::vector<int>& slots, int layer,
                                      const std::string& case_dir, int64_t T, int64_t H) {
  SafetensorsFile g(case_dir + "/golden.safetensors");
  const std::vector<float> want = layer_rows(read_f32(g, "target.hidden"), layer, T, H);
  for (int slot : slots)
    EXPECT_LT(rel_err(layer_rows(features, slot, T, H), want), 1e-5) << "slot " << slot << ", layer " << layer;
}

// Packing does not leak between sequences: each sequence of `batch` run alone gives the rows it has in the
// packed run, for every captured layer and the final norm (1e-6).
inline void expect_packed_equals_each_alone(TargetModel& model, const PackedBatch& batch) {
  const int64_t T = batch.num_tokens(), H = model.config().hidden_size;
  const std::vector<int>& layers = model.capture_layers();
  const int64_t k = static_cast<int64_t>(layers.size());
  RunResult packed = run_target(model, batch);
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int32_t b = batch.cu_seqlens[s], e = batch.cu_seqlens[s + 1], S = e - b;
    PackedBatch one;
    one.tokens.assign(batch.tokens.begin() + b, batch.tokens.begin() + e);
    one.cu_seqlens = {0, S};
    RunResult alone = run_target(model, one);
    for (int64_t i = 0; i < k; ++i) {
      std::vector<float> got(packed.features.begin() + (i * T + b) * H, packed.features.begin() + (i * T + e) * H);
      EXPECT_LT(rel_err(got, layer_rows(alone.features, i, S, H)), 1e-6)
          << "sequence " << s << ", layer " << layers[i];
    }
    std::vector<float> got(packed.final_norm.begin() + b * H, packed.final_norm.begin() + e * H);
    std::vector<float> want(alone.final_norm.begin(), alone.final_norm.begin() + S * H);
    EXPECT_LT(rel_err(got, want), 1e-6) << "sequence " << s;
  }
}

}  // namespace dflash::test
