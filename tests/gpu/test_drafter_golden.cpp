// The whole CUDA drafter step (src/drafter/cuda/drafter_step*.cu) against the golden reference case
// tests/data/golden/qwen3-tiny-a (official DFlashDraftModel in float64): the case's anchors, target hidden
// states and final_norm, the drafter_init weights. CE and KL losses to 1e-2 relative, the gradients to 3e-2
// relative over all parameters and 6e-2 per parameter tensor (tol::kStepLoss, kStepGrads, kStepGradsPerTensor:
// bf16 activations and weights, the same budget as GpuDrafterStep against the float32 CPU path).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "dflash/drafter.h"
#include "dflash/safetensors.h"
#include "dflash/target.h"
#include "block_attention.cuh"
#include "drafter/cuda/drafter_step.cuh"
#include "gpu_test_util.h"
#include "drafter/drafter_golden.h"
#include "drafter/objective.h"

namespace dflash {
namespace {

using test::gpu;
using test::rel_err;
using test::to_host;

std::vector<float> golden_f32(SafetensorsFile& f, const std::string& name) {
  const TensorInfo& t = f.get(name);
  std::vector<float> out(t.numel());
  tensor_to_f32(t, out.data(), f.path());
  return out;
}

TEST(GpuDrafterGolden, QwenTinyA_LossesAndGradients) {
  SKIP_WITHOUT_GPU();
  // DFLASH_TEST_DATA in the environment wins over the build's path (the binary may run in another checkout).
  const char* env_data = std::getenv("DFLASH_TEST_DATA");
  const std::string dir = std::string(env_data ? env_data : DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a";
  std::ifstream cf(dir + "/case.json");
  ASSERT_TRUE(cf.good());
  const nlohmann::json cj = nlohmann::json::parse(cf);
  const train::GoldenInputs in = train::load_golden_inputs(dir);
  const PackedBatch& batch = in.batch;
  const int64_t T = batch.num_tokens(), H = in.hidden, K = static_cast<int64_t>(in.layer_ids.size());
  const int64_t N = static_cast<int64_t>(in.anchors.size());

  // Config, layout and initial weights as the CPU trainer loads them; the frozen tables from the target.
  DrafterTrainer tr(in.target_dir, in.drafter_dir, 0, in.opt, cpu_ctx(), T);
  const DrafterConfig& c = tr.config();
  const std::vector<ParamSpec>& layout = tr.param_layout();
  const int64_t B = c.block_size, V = c.layers.vocab_size;
  ASSERT_EQ(c.layers.hidden_size, H);
  const std::unique_ptr<TargetModel> target =
      make_target_model(load_target_config(in.target_dir), in.target_dir, cpu_ctx(), in.layer_ids, T);
  const Tensor embed = target->embed_tokens(), lm_head = target->lm_head();

  // Blocks and loss rows as the trainer builds them.
  std::vector<int32_t> anchors, seq_begin, seq_end;
  for (int64_t a : in.anchors) {
    int s = 0;
    while (batch.cu_seqlens[s + 1] <= a) ++s;
    anchors.push_back(static_cast<int32_t>(a));
    seq_begin.push_back(batch.cu_seqlens[s]);
    seq_end.push_back(batch.cu_seqlens[s + 1]);
  }
  train::LossRows rows;
  train::build_loss_rows(batch, anchors, seq_end, static_cast<int>(B), in.opt.gamma, rows);
  ASSERT_GT(rows.size(), 0u);

  Ctx g = gpu();
  cuda::DrafterStepCuda step(c, layout, g, T, N, 16);
  const Tensor w0 = tr.master_weights();
  copy_tensor(g, step.params(), w0);
  step.reset_from_params();
  Buffer d_embed(Device::CUDA, DType::BF16, {V, H}), d_head(Device::CUDA, DType::BF16, {V, H});
  Buffer d_feat(Device::CUDA, DType::BF16, {K, T, H}), d_fnorm(Device::CUDA, DType::BF16, {T, H});
  copy_tensor(g, d_embed, embed);
  copy_tensor(g, d_head, lm_head);
  copy_tensor(g, d_feat, cpu_view(in.features.data(), {K, T, H}));
  copy_tensor(g, d_fnorm, cpu_view(in.final_norm.data(), {T, H}));
  step.set_frozen(d_embed, d_head);
  FeatureBatch fbatch;  // the batch as the trainer hands it to the step (views: nothing copied)
  fbatch.batch = &batch;
  fbatch.features = d_feat;
  fbatch.final_norm = d_fnorm;
  DrafterStepInput step_in;
  step_in.tokens = batch.tokens.data();
  step_in.anchors = anchors;
  step_in.seq_begin = seq_begin;
  step_in.ctx_pos.resize(T);
  for (int s = 0; s < batch.num_seqs(); ++s)
    for (int32_t t = batch.cu_seqlens[s]; t < batch.cu_seqlens[s + 1]; ++t) step_in.ctx_pos[t] = t - batch.cu_seqlens[s];
  train::DrafterBatch b;
  b.fb = &fbatch;
  b.in = &step_in;
  b.rows = &rows;

  SafetensorsFile gold(dir + "/golden.safetensors");
  for (cuda::BlockAttentionImpl impl : {cuda::BlockAttentionImpl::Fused, cuda::BlockAttentionImpl::Chunked})
  for (ops::LossObjective obj : {ops::LossObjective::CE, ops::LossObjective::KL}) {
    SCOPED_TRACE(impl == cuda::BlockAttentionImpl::Fused ? "fused attention" : "chunked attention");
    const std::string name = obj == ops::LossObjective::CE ? "ce" : "kl";
    cuda::set_block_attention_impl(impl);
    const cuda::DrafterStepResult res = step.forward_backward(b, obj);
    cuda::set_block_attention_impl(cuda::BlockAttentionImpl::Default);
    const double ref_loss = cj.at("loss_" + name).get<double>();
    EXPECT_NEAR(res.loss, ref_loss, test::tol::kStepLoss * std::fabs(ref_loss)) << "loss_" << name;
    const std::vector<float> grads = to_host(g, step.grads());
    std::vector<float> ref_all(grads.size(), 0.f);
    for (const ParamSpec& p : layout) {
      const std::vector<float> ref = golden_f32(gold, "grad." + name + "." + p.name);
      ASSERT_EQ(ref.size(), p.numel()) << p.name;
      std::copy(ref.begin(), ref.end(), ref_all.begin() + static_cast<std::ptrdiff_t>(p.offset));
      const std::vector<float> got(grads.begin() + p.offset, grads.begin() + p.offset + p.numel());
      EXPECT_LT(rel_err(got, ref), test::tol::kStepGradsPerTensor) << "grad." << name << "." << p.name;
    }
    EXPECT_LT(rel_err(grads, ref_all), test::tol::kStepGrads) << "all gradients, " << name;
  }
}

}  // namespace
}  // namespace dflash

namespace dflash {
namespace {

// DFlash2 on CUDA (tests/data/golden/dflash2-tiny-{a,b,strict}): the whole trainer with the CUDA step against
// the float64 reference, by run_drafter_golden's CUDA budget (drafter_golden.h: losses 1e-2, 3e-2 after
// optimizer steps, gradient norms and all gradients together 3e-2, each gradient tensor 6e-2, metrics 0.1;
// after-AdamW weights not compared).
TEST(GpuDrafterGolden, DFlash2TinyAB_ObjectivesAndGradients) {
  SKIP_WITHOUT_GPU();
  const char* env_data = std::getenv("DFLASH_TEST_DATA");
  for (const char* name : {"dflash2-tiny-a", "dflash2-tiny-b", "dflash2-tiny-strict"}) {
    const auto rep = train::run_drafter_golden(std::string(env_data ? env_data : DFLASH_TEST_DATA) + "/golden/" + name,
                                               test::gpu());
    EXPECT_GT(rep.checks.size(), 100u);
    for (const auto& c : rep.checks) EXPECT_LE(c.err, c.tol) << name << ": " << c.name << " max_abs " << c.max_abs;
  }
}

}  // namespace
}  // namespace dflash
