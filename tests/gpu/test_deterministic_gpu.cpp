// Deterministic kernels (set_deterministic_kernels, --deterministic): with the mode on, the kernels whose
// sums used to depend on which block finished first give bit-identical results on identical inputs, and
// stay within the usual tolerance of the atomic (default) path:
//   RMSNorm and QK-norm + RoPE weight gradients (per-block partials summed in block order), on many rows
//   so that many blocks add to every column; the block attention's dK/dV (one dkv CTA per key tile; head
//   dims 128 and 256, full and sliding window);
//   and the CUDA DrafterTrainer: three steps from the same init on the same batches and anchors, twice,
//   give bit-identical master weights (this covers the GEMMs, whose timed algorithm choice is off too).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "block_attention.cuh"
#include "dflash/backend.h"
#include "dflash/drafter.h"
#include "dflash/ops.h"
#include "drafter/cuda/drafter_backward.cuh"
#include "gpu_test_util.h"
#include "drafter/drafter_golden.h"

namespace dflash {
namespace {

using test::gpu;
using test::random_bf16;
using test::rel_err;
using test::to_device;
using test::to_host;

// Turns the mode on for one test and back off after it (the test binary shares one process).
struct DeterministicScope {
  explicit DeterministicScope(bool on) : was_(deterministic_kernels()) { set_deterministic_kernels(on); }
  ~DeterministicScope() { set_deterministic_kernels(was_); }
  bool was_;
};

Buffer f32_device(const Ctx& g, const std::vector<float>& h) {
  Buffer b(Device::CUDA, DType::F32, {static_cast<int64_t>(h.size())});
  copy_tensor(g, b, cpu_view(h.data(), {static_cast<int64_t>(h.size())}));
  return b;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(GpuDeterministic, RmsNormWeightGradient) {
  SKIP_WITHOUT_GPU();
  const Ctx g = gpu();
  const int64_t N = 24576, C = 4096;  // 1536 blocks of 16 rows on the default path
  auto in = random_bf16(N * C, 11), w = random_bf16(C, 12), dout = random_bf16(N * C, 13), rstd = random_bf16(N, 14);
  for (auto& r : rstd) r = 0.5f + std::fabs(r);
  const std::vector<float> dw0 = random_bf16(C, 15);
  Buffer d_in = to_device(g, in, {N, C}), d_w = to_device(g, w, {C}), d_dout = to_device(g, dout, {N, C});
  Buffer d_din = to_device(g, {}, {N, C}), d_rstd = f32_device(g, rstd);
  auto run = [&](bool det) {
    DeterministicScope scope(det);
    Buffer d_dw = f32_device(g, dw0);
    cuda::rmsnorm_backward(g, d_din, d_dw, d_dout, d_in, d_w, d_rstd);
    return to_host(g, d_dw);
  };
  const std::vector<float> a = run(true), b = run(true), atomic = run(false);
  EXPECT_TRUE(bit_equal(a, b)) << "deterministic RMSNorm dw differs between two runs";
  EXPECT_LT(rel_err(a, atomic), test::tol::kF32SumOrder) << "deterministic and atomic sums disagree beyond rounding";
}

TEST(GpuDeterministic, HeadNormRopeWeightGradient) {
  SKIP_WITHOUT_GPU();
  const Ctx g = gpu();
  const int64_t N = 8192, nh = 8, hd = 128;
  ops::RopeSpec rope;
  rope.theta = 1e6f;
  auto in = random_bf16(N * nh * hd, 21), w = random_bf16(hd, 22), dout = random_bf16(N * nh * hd, 23),
       rstd = random_bf16(N * nh, 24);
  for (auto& r : rstd) r = 0.5f + std::fabs(r);
  std::vector<int32_t> pos(N);
  for (int64_t n = 0; n < N; ++n) pos[n] = static_cast<int32_t>(n % 4096);
  const std::vector<float> dw0 = random_bf16(hd, 25);
  Buffer d_in = to_device(g, in, {N, nh, hd}), d_w = to_device(g, w, {hd}), d_rstd = f32_device(g, rstd);
  Buffer d_pos = test::to_device_i32(g, pos);
  auto run = [&](bool det) {
    DeterministicScope scope(det);
    Buffer d_dout = to_device(g, dout, {N, nh, hd}), d_din = to_device(g, {}, {N, nh, hd}), d_dw = f32_device(g, dw0);
    cuda::head_norm_rope_backward(g, d_din, d_dw, d_dout, d_in, d_w, d_rstd, d_pos, rope, 1e-6f);
    return to_host(g, d_dw);
  };
  const std::vector<float> a = run(true), b = run(true), atomic = run(false);
  EXPECT_TRUE(bit_equal(a, b)) << "deterministic head-norm dw differs between two runs";
  EXPECT_LT(rel_err(a, atomic), test::tol::kF32SumOrder);
}

// 256 anchors x 16 (4 dkv splits of 64 blocks on the default path), 2048 context keys, nh/nkv heads of hd.
void check_block_attention_dkv(int64_t nh, int64_t nkv, int64_t hd, int window) {
  const Ctx g = gpu();
  const int64_t N = 256, B = 16, T = 2048, NB = N * B;
  std::mt19937 rng(7);
  std::vector<int32_t> all(T - 1);
  for (int64_t t = 0; t + 1 < T; ++t) all[t] = static_cast<int32_t>(t);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int32_t> an(all.begin(), all.begin() + N), sb(N, 0);
  std::sort(an.begin(), an.end());
  Buffer q = to_device(g, random_bf16(NB * nh * hd, 31), {NB, nh, hd}), kc = to_device(g, random_bf16(T * nkv * hd, 32), {T, nkv, hd}),
         vc = to_device(g, random_bf16(T * nkv * hd, 33), {T, nkv, hd}), kb = to_device(g, random_bf16(NB * nkv * hd, 34), {NB, nkv, hd}),
         vb = to_device(g, random_bf16(NB * nkv * hd, 35), {NB, nkv, hd}), dout = to_device(g, random_bf16(NB * nh * hd, 36), {NB, nh, hd});
  Buffer out = to_device(g, {}, {NB, nh, hd}), lse(Device::CUDA, DType::F32, {NB, nh});
  Buffer d_an = test::to_device_i32(g, an), d_sb = test::to_device_i32(g, sb);
  ops::BlockAttnSpec spec;
  spec.scale = 1.f / std::sqrt(float(hd));
  spec.window = window;
  cuda::block_attention_forward(g, out, lse, q, kc, vc, kb, vb, d_an, d_sb, an, sb, spec);
  auto run = [&](bool det) {
    DeterministicScope scope(det);
    Buffer dq = to_device(g, {}, {NB, nh, hd}), dkc = to_device(g, {}, {T, nkv, hd}), dvc = to_device(g, {}, {T, nkv, hd}),
           dkb = to_device(g, {}, {NB, nkv, hd}), dvb = to_device(g, {}, {NB, nkv, hd});
    cuda::block_attention_backward(g, dq, dkc, dvc, dkb, dvb, dout, out, lse, q, kc, vc, kb, vb, d_an, d_sb, an, sb, spec);
    std::vector<float> k = to_host(g, dkc), v = to_host(g, dvc);
    k.insert(k.end(), v.begin(), v.end());
    return k;
  };
  const std::vector<float> a = run(true), b = run(true), atomic = run(false);
  EXPECT_TRUE(bit_equal(a, b)) << "deterministic dK/dV differ between two runs (hd " << hd << ", window " << window << ")";
  EXPECT_LT(rel_err(a, atomic), test::tol::kOp) << "bf16 outputs of two summation orders (hd " << hd << ")";
}

TEST(GpuDeterministic, BlockAttentionKeyValueGradients) {
  SKIP_WITHOUT_GPU();
  check_block_attention_dkv(16, 4, 128, 0);
}
// The 27B drafter's heads (24/4 x 256: the fused paired dkv kernel where the device has the shared memory
// for it), full and sliding window.
TEST(GpuDeterministic, BlockAttentionKeyValueGradientsHd256) {
  SKIP_WITHOUT_GPU();
  check_block_attention_dkv(24, 4, 256, 0);
  check_block_attention_dkv(24, 4, 256, 700);
}

TEST(GpuDeterministic, TrainerStepsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  const Ctx g = gpu();
  const char* env_data = std::getenv("DFLASH_TEST_DATA");
  const train::GoldenInputs in =
      train::load_golden_inputs(std::string(env_data ? env_data : DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a");
  const FeatureBatch host_fb = in.feature_batch();
  const int64_t K = host_fb.features.shape[0], T = host_fb.features.shape[1], H = host_fb.features.shape[2];
  DeterministicScope scope(true);
  Buffer features(Device::CUDA, DType::BF16, {K, T, H}), final_norm(Device::CUDA, DType::BF16, {T, H});
  copy_tensor(g, features, host_fb.features);
  copy_tensor(g, final_norm, host_fb.final_norm);
  FeatureBatch fb;
  fb.batch = &in.batch;
  fb.features = features.t();
  fb.final_norm = final_norm.t();
  auto train3 = [&] {
    DrafterTrainer tr(in.target_dir, in.drafter_dir, 0, in.opt, g, T);
    for (int s = 0; s < 3; ++s) {
      tr.forward_backward(fb, in.anchors);
      tr.optimizer_step();
    }
    const Tensor w = tr.master_weights();
    const float* p = static_cast<const float*>(w.data);
    return std::vector<float>(p, p + w.numel());
  };
  const std::vector<float> a = train3(), b = train3();
  EXPECT_TRUE(bit_equal(a, b)) << "two deterministic trainings of 3 steps gave different weights";
}

}  // namespace
}  // namespace dflash
