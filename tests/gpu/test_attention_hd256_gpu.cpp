// The target's varlen causal attention on CUDA at every head-dim path (kernels/attention.cu) against its
// float32 CPU twin on random data, and the QK-norm + partial RoPE op at the Qwen3.5/3.6 shape.
//
//   attention: head dims 256 (Qwen3.5/3.6 full attention: 24 query heads, 4 KV heads, GQA 6), 128 (Qwen3,
//   regression), and the padded ones 64, 80, 96, 200, 8; packed sequences of uneven lengths incl. 1 and a
//   few hundred. Every kernel variant that can serve the head dim on this device runs, not only the one
//   the op picks. Tolerance: relative L2 error <= 1e-2 (tol::kOp: bf16 inputs/outputs and bf16
//   probabilities in the P V product) and max |error| <= 4e-2 (outputs are convex mixtures of N(0, 1)
//   values: |out| < 5, bf16 keeps 8 bits: tol::kAttentionMaxAbs).
//   head_norm_rope: hd 256 with rotary_dim 64 (the last 192 dims normalized and passed through), 24 and
//   4 heads, in place too; relative L2 error <= 1e-2, rstd <= 1e-3.
//
// DISABLED_ benchmark (--gtest_also_run_disabled_tests): the 27B attention shape (8 x 4096 tokens, 24 q
// heads, 4 kv heads, hd 256) per hd-256 variant and the Qwen3-8B shape (32 / 8 heads, hd 128): CUDA
// events, 3 warm-ups, median of 20 (test::time_calls); TFLOP/s counts the causal half: 2 * 2 * L^2 / 2 * hd * heads per sequence.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <ostream>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "attention.cuh"
#include "attention_cudnn.cuh"
#include "device_limits.cuh"
#include "dflash/ops.h"
#include "gpu_test_util.h"
#include "random_fill.cuh"

namespace dflash {
namespace {

using test::gpu;
using test::random_bf16;
using test::rel_err;
using test::to_device;
using test::to_host;
using cuda::AttentionKernel;
const Ctx kCpu = cpu_ctx();


double max_abs_err(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  }
  return m;
}

struct AttnCase {
  std::vector<int32_t> seqlens;
  int64_t nh, nkv, hd;
};
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << "seqs" << c.seqlens.size() << "_T";
  int64_t T = 0;
  for (int32_t l : c.seqlens) T += l;
  *os << T << "_h" << c.nh << "kv" << c.nkv << "_hd" << c.hd;
}

class GpuAttentionHeadDims : public testing::TestWithParam<AttnCase> {};

TEST_P(GpuAttentionHeadDims, EveryKernelMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const AttnCase c = GetParam();
  std::vector<int32_t> cu(1, 0);
  for (int32_t len : c.seqlens) cu.push_back(cu.back() + len);
  const int64_t T = cu.back();
  const uint32_t seed = static_cast<uint32_t>(c.hd * 1000 + c.nh);
  // q, k of std 2: scores of std ~4 after the scale, so the softmax is peaked in places, flat in others.
  auto q = random_bf16(T * c.nh * c.hd, seed, 2.f), k = random_bf16(T * c.nkv * c.hd, seed + 1, 2.f),
       v = random_bf16(T * c.nkv * c.hd, seed + 2);
  const float scale = 1.f / std::sqrt(static_cast<float>(c.hd));
  std::vector<float> want(q.size());
  ops::attention_varlen_causal_forward(kCpu, cpu_view(want.data(), {T, c.nh, c.hd}), cpu_view(q.data(), {T, c.nh, c.hd}),
                                       cpu_view(k.data(), {T, c.nkv, c.hd}), cpu_view(v.data(), {T, c.nkv, c.hd}),
                                       cpu_view(cu.data(), {static_cast<int64_t>(cu.size())}), scale);
  Buffer d_q = to_device(g, q, {T, c.nh, c.hd}), d_k = to_device(g, k, {T, c.nkv, c.hd}),
         d_v = to_device(g, v, {T, c.nkv, c.hd});
  Buffer d_cu = test::to_device_i32(g, cu);

  // The op (what the target runs), then each variant by name.
  std::vector<AttentionKernel> kernels = {AttentionKernel::Auto};
  if (c.hd <= 128) kernels.push_back(AttentionKernel::Hd128);
  for (AttentionKernel kn : {AttentionKernel::Hd256, AttentionKernel::Hd256Small})
    if (cuda::attention_kernel_fits(g, kn)) kernels.push_back(kn);
  // cuDNN, where this build has it and cuDNN serves the shape here (it says why on stderr when not; on the
  // H200 every case below runs), both with the S bound from T and with the longest sequence given.
  const int64_t longest = *std::max_element(c.seqlens.begin(), c.seqlens.end());
  for (AttentionKernel kn : kernels) {
    Buffer d_out = to_device(g, {}, {T, c.nh, c.hd});  // NaN: an unwritten element fails
    AttentionKernel ran = kn;
    if (kn == AttentionKernel::Auto) {
      ops::attention_varlen_causal_forward(g, d_out, d_q, d_k, d_v, d_cu, scale);
      ran = cuda::attention_varlen_causal_forward(g, d_out, d_q, d_k, d_v, d_cu, scale);  // same again: which ran
    } else {
      cuda::attention_varlen_causal_forward(g, d_out, d_q, d_k, d_v, d_cu, scale, kn);
    }
    const std::vector<float> got = to_host(g, d_out);
    const double rel = rel_err(got, want), mx = max_abs_err(got, want);
    std::printf("[attention] hd %3lld nh %2lld nkv %lld T %4lld kernel %-11s (%s): rel %.2e max|err| %.2e\n",
                static_cast<long long>(c.hd), static_cast<long long>(c.nh), static_cast<long long>(c.nkv),
                static_cast<long long>(T), cuda::attention_kernel_name(kn), cuda::attention_kernel_name(ran), rel, mx);
    EXPECT_LT(rel, test::tol::kOp) << cuda::attention_kernel_name(kn);
    EXPECT_LT(mx, test::tol::kAttentionMaxAbs) << cuda::attention_kernel_name(kn);
  }
  for (const int64_t max_seqlen : {int64_t(0), longest}) {
    if (!cuda::attention_cudnn_compiled()) break;
    Buffer d_out = to_device(g, {}, {T, c.nh, c.hd});
    if (!cuda::attention_cudnn_forward(g, d_out, d_q, d_k, d_v, d_cu, scale, max_seqlen)) {
      std::printf("[attention] hd %3lld: cuDNN does not serve this shape here (reason above)\n",
                  static_cast<long long>(c.hd));
      break;
    }
    const std::vector<float> got = to_host(g, d_out);
    const double rel = rel_err(got, want), mx = max_abs_err(got, want);
    std::printf("[attention] hd %3lld nh %2lld nkv %lld T %4lld kernel cudnn (max_seqlen %lld): rel %.2e max|err| %.2e\n",
                static_cast<long long>(c.hd), static_cast<long long>(c.nh), static_cast<long long>(c.nkv),
                static_cast<long long>(T), static_cast<long long>(max_seqlen), rel, mx);
    EXPECT_LT(rel, test::tol::kOp) << "cudnn";
    EXPECT_LT(mx, test::tol::kAttentionMaxAbs) << "cudnn";
  }
}

// Lengths around the tile edges (64 and 128 query rows, 32 and 64 keys), a 1-token sequence, a few hundred.
const std::vector<int32_t> kUneven = {1, 300, 77, 129, 64, 5, 33, 191};

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuAttentionHeadDims,
    testing::Values(AttnCase{kUneven, 24, 4, 256},                        // Qwen3.5/3.6-27B full attention, GQA 6
                    AttnCase{{1, 37, 128, 129, 300, 64, 5}, 32, 8, 128},  // Qwen3 (regression)
                    AttnCase{kUneven, 8, 2, 64},                          // padded to 128
                    AttnCase{{1, 129, 250}, 10, 2, 80},
                    AttnCase{{77, 1, 200}, 6, 6, 96},                     // MHA
                    AttnCase{{1, 130, 300}, 4, 1, 200},                   // padded to 256
                    AttnCase{{9, 1, 70}, 2, 1, 8},                        // the smallest
                    AttnCase{std::vector<int32_t>(40, 7), 6, 1, 256}),    // more sequences than a warp scans at once
    [](const testing::TestParamInfo<AttnCase>& info) {
      return "hd" + std::to_string(info.param.hd) + "_nh" + std::to_string(info.param.nh) + "_nkv" +
             std::to_string(info.param.nkv) + "_n" + std::to_string(info.param.seqlens.size());
    });

TEST(GpuAttentionHeadDimsAuto, PicksByHeadDimAndDevice) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  EXPECT_EQ(cuda::attention_kernel_for(g, 64), AttentionKernel::Hd128);
  EXPECT_EQ(cuda::attention_kernel_for(g, 128), AttentionKernel::Hd128);
  const AttentionKernel k256 = cuda::attention_kernel_for(g, 256);
  EXPECT_NE(k256, AttentionKernel::Hd128);
  EXPECT_TRUE(cuda::attention_kernel_fits(g, k256));
  EXPECT_TRUE(cuda::attention_kernel_fits(g, AttentionKernel::Hd256Small));  // fits every GPU this builds for
  std::printf("[attention] %s: hd 256 runs %s\n", cuda::describe(cuda::current_device_limits()).c_str(),
              cuda::attention_kernel_name(k256));
}

// What a new cuDNN graph costs (the first batch of a new sequence-count or length bucket builds one) and that
// a batch of the same buckets reuses it: host wall time of the op's first call for 3 sequences (bucket 4),
// then for 4 sequences of other lengths in the same buckets, each followed by a stream sync.
TEST(GpuAttentionCudnn, GraphBuiltOncePerBucket) {
  SKIP_WITHOUT_GPU();
  if (!cuda::attention_cudnn_compiled()) GTEST_SKIP() << "this build has no cuDNN path (tools/setup.sh fetches its headers)";
  Ctx g = gpu();
  const int64_t nh = 16, nkv = 4, hd = 128, T = 900;
  Buffer q(Device::CUDA, DType::BF16, {T, nh, hd}), k(Device::CUDA, DType::BF16, {T, nkv, hd}),
      v(Device::CUDA, DType::BF16, {T, nkv, hd}), out(Device::CUDA, DType::BF16, {T, nh, hd});
  cuda::fill_random(g, q, 1, 0.f, 1.f);
  cuda::fill_random(g, k, 2, 0.f, 1.f);
  cuda::fill_random(g, v, 3, 0.f, 1.f);
  auto timed = [&](const std::vector<int32_t>& cu) {
    Buffer d_cu = test::to_device_i32(g, cu);
    cudaStreamSynchronize(static_cast<cudaStream_t>(g.stream));
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = cuda::attention_cudnn_forward(g, out, q, k, v, d_cu, 0.088f, 0);
    cudaStreamSynchronize(static_cast<cudaStream_t>(g.stream));
    EXPECT_TRUE(ok);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  const double first = timed({0, 100, 600, 900}), again = timed({0, 300, 500, 700, 900}),
               same = timed({0, 100, 600, 900});
  std::printf("[attention] cuDNN graph: first call of a bucket %.1f ms (build), another batch in it %.2f ms, "
              "the first batch again %.2f ms\n", first, again, same);
  EXPECT_LT(again, first);
}

struct RopeCase {
  int64_t nh, hd;
  int rotary_dim;
};
void PrintTo(const RopeCase& c, std::ostream* os) { *os << "h" << c.nh << "_hd" << c.hd << "_rot" << c.rotary_dim; }
class GpuHeadNormRopeHd256 : public testing::TestWithParam<RopeCase> {};
TEST_P(GpuHeadNormRopeHd256, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const RopeCase c = GetParam();
  const int64_t N = 77;
  ops::RopeSpec rope{1e7f, c.rotary_dim};  // Qwen3.5/3.6: rope_theta 1e7, partial_rotary_factor 0.25
  auto in = random_bf16(N * c.nh * c.hd, 23, 2.f), w = random_bf16(c.hd, 24);
  std::vector<int32_t> pos(N);
  for (int64_t i = 0; i < N; ++i) pos[i] = static_cast<int32_t>((i * 211) % 40000);  // large angles too
  pos[0] = 0;
  std::vector<float> out(in.size()), rstd(N * c.nh);
  ops::head_norm_rope_forward(kCpu, cpu_view(out.data(), {N, c.nh, c.hd}), cpu_view(rstd.data(), {N, c.nh}),
                              cpu_view(in.data(), {N, c.nh, c.hd}), cpu_view(w.data(), {c.hd}),
                              cpu_view(pos.data(), {N}), rope, 1e-6f);
  Buffer d_in = to_device(g, in, {N, c.nh, c.hd}), d_w = to_device(g, w, {c.hd});
  Buffer d_out = to_device(g, {}, {N, c.nh, c.hd}), d_pos = test::to_device_i32(g, pos);
  Buffer d_rstd(Device::CUDA, DType::F32, {N, c.nh});
  ops::head_norm_rope_forward(g, d_out, d_rstd, d_in, d_w, d_pos, rope, 1e-6f);
  const std::vector<float> got = to_host(g, d_out);
  EXPECT_LT(rel_err(got, out), test::tol::kOp);
  EXPECT_LT(rel_err(to_host(g, d_rstd), rstd), test::tol::kF32Output);
  // The pass-through dims alone (past rotary_dim): normalized, not rotated.
  if (c.rotary_dim < c.hd) {
    std::vector<float> got_tail, want_tail;
    for (int64_t r = 0; r < N * c.nh; ++r)
      for (int64_t d = c.rotary_dim; d < c.hd; ++d) {
        got_tail.push_back(got[r * c.hd + d]);
        want_tail.push_back(out[r * c.hd + d]);
      }
    EXPECT_LT(rel_err(got_tail, want_tail), test::tol::kOp);
  }
  std::printf("[head_norm_rope] nh %lld hd %lld rotary %d: rel %.2e\n", static_cast<long long>(c.nh),
              static_cast<long long>(c.hd), c.rotary_dim, rel_err(got, out));
  ops::head_norm_rope_forward(g, d_in, Tensor(), d_in, d_w, d_pos, rope, 1e-6f);  // in place, as the target runs it
  EXPECT_LT(rel_err(to_host(g, d_in), out), test::tol::kOp);
}
INSTANTIATE_TEST_SUITE_P(Shapes, GpuHeadNormRopeHd256,
                         testing::Values(RopeCase{24, 256, 64}, RopeCase{4, 256, 64}, RopeCase{3, 256, 256},
                                         RopeCase{5, 256, 128}));

// ---- benchmark -------------------------------------------------------------------------------------------

struct BenchShape {
  const char* name;
  int nseq, len, nh, nkv, hd;
};

double time_attention(const Ctx& g, const BenchShape& s, AttentionKernel kn, int64_t max_seqlen, double* tflops) {
  const int64_t T = int64_t(s.nseq) * s.len;
  Buffer q(Device::CUDA, DType::BF16, {T, s.nh, s.hd}), k(Device::CUDA, DType::BF16, {T, s.nkv, s.hd}),
      v(Device::CUDA, DType::BF16, {T, s.nkv, s.hd}), out(Device::CUDA, DType::BF16, {T, s.nh, s.hd});
  cuda::fill_random(g, q, 1, 0.f, 1.f);
  cuda::fill_random(g, k, 2, 0.f, 1.f);
  cuda::fill_random(g, v, 3, 0.f, 1.f);
  std::vector<int32_t> cu(s.nseq + 1);
  for (int i = 0; i <= s.nseq; ++i) cu[i] = i * s.len;
  Buffer d_cu = test::to_device_i32(g, cu);
  const float scale = 1.f / std::sqrt(static_cast<float>(s.hd));
  const test::Timing t = test::time_calls(
      g, [&] { cuda::attention_varlen_causal_forward(g, out, q, k, v, d_cu, scale, kn, max_seqlen); });
  const double med = t.median;
  const double flop = double(s.nseq) * 2.0 * 2.0 * double(s.len) * double(s.len) / 2.0 * s.hd * s.nh;
  *tflops = flop / (med * 1e-3) / 1e12;
  return med;
}

TEST(GpuAttentionBench, DISABLED_TargetShapes) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const BenchShape qwen36{"qwen3.6-27b", 8, 4096, 24, 4, 256}, qwen3{"qwen3-8b", 8, 4096, 32, 8, 128};
  for (const auto& [shape, kn] : std::vector<std::pair<BenchShape, AttentionKernel>>{
           {qwen36, AttentionKernel::Hd256}, {qwen36, AttentionKernel::Hd256Small}, {qwen36, AttentionKernel::Cudnn},
           {qwen3, AttentionKernel::Hd128}, {qwen3, AttentionKernel::Hd256Small}, {qwen3, AttentionKernel::Cudnn}}) {
    if (!cuda::attention_kernel_fits(g, kn)) continue;
    // cuDNN twice: S bounded by T (what the op does without the longest length), and S = the length.
    for (const int64_t max_seqlen : kn == AttentionKernel::Cudnn ? std::vector<int64_t>{0, shape.len} : std::vector<int64_t>{0}) {
      double tf = 0;
      const double ms = time_attention(g, shape, kn, max_seqlen, &tf);
      std::printf("[bench] %-12s %d x %d tokens, %d/%d heads, hd %d, kernel %-11s max_seqlen %5lld: %8.3f ms  %6.1f TFLOP/s\n",
                  shape.name, shape.nseq, shape.len, shape.nh, shape.nkv, shape.hd, cuda::attention_kernel_name(kn),
                  static_cast<long long>(max_seqlen), ms, tf);
    }
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace dflash
