// Chunked lm_head + softmax + CE/KL loss on CUDA against its float32 CPU twin (src/ops/lm_loss.cpp):
// per-row CE and KL, argmaxes, the fused forward gradient and the recomputing backward, for both
// objectives, with several chunks and a partial last chunk.
#include <gtest/gtest.h>

#include <random>

#include "dflash/drafter_ops.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::gpu;
using test::random_bf16;
using test::rel_err;
using test::to_device;
using test::to_host;

std::vector<int32_t> to_host_i32(const Ctx& g, const Tensor& t) {
  std::vector<int32_t> h(t.numel());
  copy_tensor(g, cpu_view(h.data(), {static_cast<int64_t>(h.size())}), t);
  return h;
}

int mismatches(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

void run_case(int64_t R, int64_t H, int64_t V, int64_t chunk, uint32_t seed) {
  Ctx g = gpu();
  const Ctx cpu = cpu_ctx();
  auto h = random_bf16(R * H, seed), teacher = random_bf16(R * H, seed + 1), W = random_bf16(V * H, seed + 2, 0.15f);
  std::mt19937 rng(seed + 3);
  std::vector<int32_t> labels(R);
  std::vector<float> weight(R);
  for (int64_t r = 0; r < R; ++r) {
    labels[r] = static_cast<int32_t>(rng() % V);
    weight[r] = r % 7 == 3 ? 0.f : static_cast<float>(rng() % 1000) / 1000.f / R;
  }
  // CPU twin
  std::vector<float> ce(R), kl(R), ws(ops::lm_loss_workspace_floats(chunk, V, true));
  std::vector<int32_t> amq(R), amp(R);
  Tensor h_c = cpu_view(h.data(), {R, H}), t_c = cpu_view(teacher.data(), {R, H}), W_c = cpu_view(W.data(), {V, H});
  Tensor lab_c = cpu_view(labels.data(), {R}), w_c = cpu_view(weight.data(), {R}), ws_c = cpu_view(ws.data(), {(int64_t)ws.size()});
  ops::LmLossRowsOut out_c{cpu_view(ce.data(), {R}), cpu_view(kl.data(), {R}), cpu_view(amq.data(), {R}),
                           cpu_view(amp.data(), {R})};
  std::vector<float> dh_ce(R * H), dh_kl(R * H), dh_ce_b(R * H), dh_kl_b(R * H);
  ops::lm_loss_forward(cpu, out_c, h_c, W_c, lab_c, t_c, ws_c, chunk, cpu_view(dh_ce.data(), {R, H}), w_c,
                       ops::LossObjective::CE);
  ops::lm_loss_forward(cpu, out_c, h_c, W_c, lab_c, t_c, ws_c, chunk, cpu_view(dh_kl.data(), {R, H}), w_c,
                       ops::LossObjective::KL);
  ops::lm_loss_backward(cpu, cpu_view(dh_ce_b.data(), {R, H}), w_c, ops::LossObjective::CE, h_c, W_c, lab_c, Tensor(),
                        ws_c, chunk);
  ops::lm_loss_backward(cpu, cpu_view(dh_kl_b.data(), {R, H}), w_c, ops::LossObjective::KL, h_c, W_c, lab_c, t_c,
                        ws_c, chunk);

  // CUDA
  Buffer d_h = to_device(g, h, {R, H}), d_t = to_device(g, teacher, {R, H}), d_W = to_device(g, W, {V, H});
  Buffer d_lab = test::to_device_i32(g, labels);
  Buffer d_w(Device::CUDA, DType::F32, {R});
  copy_tensor(g, d_w, w_c);
  Buffer d_ws(Device::CUDA, DType::F32, {(int64_t)ws.size()});
  Buffer d_ce(Device::CUDA, DType::F32, {R}), d_kl(Device::CUDA, DType::F32, {R});
  Buffer d_amq(Device::CUDA, DType::I32, {R}), d_amp(Device::CUDA, DType::I32, {R});
  ops::LmLossRowsOut out_g{d_ce, d_kl, d_amq, d_amp};
  const std::string what = "R=" + std::to_string(R) + " V=" + std::to_string(V) + " chunk=" + std::to_string(chunk);
  struct Run {
    const char* name;
    bool fused;
    ops::LossObjective obj;
    const std::vector<float>* want;
  };
  for (const Run& run : {Run{"fused CE", true, ops::LossObjective::CE, &dh_ce},
                         Run{"fused KL", true, ops::LossObjective::KL, &dh_kl},
                         Run{"backward CE", false, ops::LossObjective::CE, &dh_ce_b},
                         Run{"backward KL", false, ops::LossObjective::KL, &dh_kl_b}}) {
    Buffer d_dh = to_device(g, {}, {R, H});
    if (run.fused) {
      cudaMemset(d_ce.t().data, 0xff, d_ce.t().nbytes());
      cudaMemset(d_kl.t().data, 0xff, d_kl.t().nbytes());
      ops::lm_loss_forward(g, out_g, d_h, d_W, d_lab, d_t, d_ws, chunk, d_dh, d_w, run.obj);
      EXPECT_LT(rel_err(to_host(g, d_ce), ce), test::tol::kF32Output) << "ce " << run.name << " " << what;
      EXPECT_LT(rel_err(to_host(g, d_kl), kl), test::tol::kKlRows) << "kl " << run.name << " " << what;
      EXPECT_LE(mismatches(to_host_i32(g, d_amq), amq), test::tol::kArgmaxMismatches) << "argmax q " << what;
      EXPECT_LE(mismatches(to_host_i32(g, d_amp), amp), test::tol::kArgmaxMismatches) << "argmax p " << what;
    } else {
      ops::lm_loss_backward(g, d_dh, d_w, run.obj, d_h, d_W, d_lab,
                            run.obj == ops::LossObjective::KL ? d_t.t() : Tensor(), d_ws, chunk);
    }
    EXPECT_LT(rel_err(to_host(g, d_dh), *run.want), test::tol::kOp) << "dh " << run.name << " " << what;
  }
  // Losses without a teacher or a gradient (evaluation path).
  ops::LmLossRowsOut ce_only{d_ce, Tensor(), d_amq, Tensor()};
  ops::lm_loss_forward(g, ce_only, d_h, d_W, d_lab, Tensor(), d_ws, chunk);
  EXPECT_LT(rel_err(to_host(g, d_ce), ce), test::tol::kF32Output) << "ce (no teacher) " << what;
}

TEST(GpuDrafterLoss, SeveralChunksPartialLast) {
  SKIP_WITHOUT_GPU();
  run_case(37, 64, 1000, 8, 21);
}
TEST(GpuDrafterLoss, OddVocabularyOneChunk) {
  SKIP_WITHOUT_GPU();
  run_case(19, 96, 3001, 32, 22);
}

}  // namespace
}  // namespace dflash
