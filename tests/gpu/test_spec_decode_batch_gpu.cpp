// Batched speculative decoding on CUDA (SpecDecoder::generate_batch, include/dflash/spec_decode.h) against
// one prompt at a time: on the CPU the two are equal bit for bit (tests/unit/test_spec_decode_batch.cpp); in
// bf16 a row may round differently with another packed row count, so the greedy outputs may part, but only at
// a near-tie of the target's own logits (tol::kBatchedNearTie). Sampled decoding: the same accounting, and a
// prompt decoded alone with its stream equals itself among the others only up to the same near-ties, so it is
// held to the accounting. Golden DFlash (qwen3-tiny-a) and DFlash2 (dflash2-tiny-a) drafters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "dflash/backend.h"
#include "dflash/drafter.h"
#include "dflash/spec_decode.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::gpu;

std::string data_dir() {  // DFLASH_TEST_DATA in the environment wins (the binary may run in another checkout)
  const char* env = std::getenv("DFLASH_TEST_DATA");
  return env ? env : DFLASH_TEST_DATA;
}

std::vector<std::vector<int32_t>> mixed_prompts() {  // 1 to 20 tokens: the prompts finish at different steps
  std::vector<std::vector<int32_t>> p;
  for (int len : {6, 1, 13, 4, 20, 9, 2, 15}) {
    std::vector<int32_t> s;
    for (int i = 0; i < len; ++i) s.push_back(static_cast<int32_t>((len * 31 + i * 17) % 200 + 3));
    p.push_back(s);
  }
  return p;
}

// The target's logits after `seq`, run on it alone (host float copy of the bf16 row).
std::vector<float> next_logits(TargetModel& t, const Ctx& ctx, const std::vector<int32_t>& seq) {
  const int64_t T = static_cast<int64_t>(seq.size()), H = t.config().hidden_size, V = t.config().vocab_size;
  const int64_t k = static_cast<int64_t>(t.capture_layers().size());
  PackedBatch b;
  b.tokens = seq;
  b.cu_seqlens = {0, static_cast<int32_t>(T)};
  b.loss_mask.assign(static_cast<size_t>(T), 0);
  Buffer feat(Device::CUDA, t.activation_dtype(), {k, T, H}), fn(Device::CUDA, t.activation_dtype(), {T, H});
  Buffer lg(Device::CUDA, t.activation_dtype(), {1, V});
  CaptureOut out;
  out.features = feat.t();
  out.final_norm = fn.t();
  t.forward(b, out);
  t.lm_head_forward(lg.t(), fn.t().slice_rows(T - 1, T));
  std::vector<float> host(static_cast<size_t>(V));
  copy_tensor(ctx, cpu_view(host.data(), {1, V}), lg.t());
  return host;
}

TEST(GpuSpecDecodeBatch, BatchedPartsFromSequentialOnlyAtNearTies) {
  SKIP_WITHOUT_GPU();
  const Ctx g = gpu();
  const std::vector<std::vector<int32_t>> prompts = mixed_prompts();
  const int max_new = 24;
  std::vector<DecodePrompt> todo;
  for (size_t i = 0; i < prompts.size(); ++i) todo.push_back({&prompts[i], i});
  for (const std::string& name : {std::string("qwen3-tiny-a"), std::string("dflash2-tiny-a")}) {
    SCOPED_TRACE(name);
    const std::string dir = data_dir() + "/golden/" + name;
    TrainOptions opt;
    opt.max_anchors = 8;  // the batched decoder's greedy blocks go through one drafter forward
    DrafterTrainer drafter(dir + "/target", dir + "/drafter_init", 1, opt, g, 1024);
    const int B = drafter.config().block_size;
    std::vector<size_t> lengths;
    for (const auto& p : prompts) lengths.push_back(p.size());
    const int64_t packed = packed_tokens_for(lengths, max_new, 16, 1 << 20, "test");
    auto target = make_target_model(load_target_config(dir + "/target"), dir + "/target", g,
                                    drafter.config().target_layer_ids, packed);
    const int64_t max_tokens = 20 + max_new + B;
    SpecDecoder seq(*target, drafter, g, max_tokens, 0, 1), bat(*target, drafter, g, max_tokens, packed, 8);
    const std::vector<SpecDecodeResult> want = seq.generate_batch(todo, max_new, {});
    const std::vector<SpecDecodeResult> got = bat.generate_batch(todo, max_new, {});
    ASSERT_EQ(got.size(), want.size());
    int parted = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].tokens.size(), static_cast<size_t>(max_new)) << i;
      ASSERT_EQ(want[i].tokens.size(), static_cast<size_t>(max_new)) << i;
      // the official count: every new token but the prefill's is a step's
      EXPECT_EQ(std::accumulate(got[i].acceptance.begin(), got[i].acceptance.end(), 0), max_new - 1) << i;
      const auto diff = std::mismatch(got[i].tokens.begin(), got[i].tokens.end(), want[i].tokens.begin());
      // (the same tokens may come in other steps: the drafter reads the packed forward's bf16 features)
      if (diff.first == got[i].tokens.end()) continue;
      ++parted;
      const size_t j = static_cast<size_t>(diff.first - got[i].tokens.begin());
      std::vector<int32_t> prefix = prompts[i];
      prefix.insert(prefix.end(), want[i].tokens.begin(), want[i].tokens.begin() + static_cast<std::ptrdiff_t>(j));
      const std::vector<float> lg = next_logits(*target, g, prefix);
      float scale = 0;
      for (float v : lg) scale = std::max(scale, std::fabs(v));
      const double gap = std::fabs(lg[static_cast<size_t>(*diff.first)] - lg[static_cast<size_t>(*diff.second)]);
      EXPECT_LE(gap, test::tol::kBatchedNearTie * scale)
          << "prompt " << i << " parts at new token " << j << " (" << *diff.second << " alone, " << *diff.first
          << " batched) without a near-tie";
    }
    double tau_seq = 0, tau_bat = 0;
    for (size_t i = 0; i < want.size(); ++i) tau_seq += want[i].tau() / want.size(), tau_bat += got[i].tau() / want.size();
    std::printf("%s: %d of %zu prompts part from their sequential decoding (at near-ties); tau %.3f alone, %.3f batched\n",
                name.c_str(), parted, want.size(), tau_seq, tau_bat);
    // Sampled: the same accounting with every prompt's stream.
    SamplingSpec s;
    s.temperature = 0.8f;
    s.top_k = 6;
    s.seed = 11;
    bat.set_sampling(s);
    for (const SpecDecodeResult& r : bat.generate_batch(todo, max_new, {})) {
      ASSERT_EQ(r.tokens.size(), static_cast<size_t>(max_new));
      EXPECT_EQ(std::accumulate(r.acceptance.begin(), r.acceptance.end(), 0), max_new - 1);
    }
  }
}

}  // namespace
}  // namespace dflash
