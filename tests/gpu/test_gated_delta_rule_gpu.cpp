// The chunked CUDA gated delta rule (kernels/gated_delta_rule*.cu) against the CPU recurrence
// (ops::gated_delta_rule_forward on the CPU, float32) on random data, plus a timing of the Qwen3.6-27B
// shape (nk = 16, dk = 128, nv = 48, dv = 128; 8 x 4096 tokens). Every case runs both chunk-scan kernels
// where the device has both (the pipelined one needs 107 KB of shared memory per block: sm_90 / sm_100).
//
// Tolerance: qkv is bf16 on both sides (rounded first), the GPU multiplies bf16 operands (raw q/k, the
// bf16 copy of the state, the inverse X, R, v_new, the masked Q K^T) with fp32 accumulation and writes bf16,
// so we ask max |gpu - cpu| <= 2e-2 max|cpu| and mean |gpu - cpu| <= 1e-2 mean|cpu| (tol::kDeltaRuleMax,
// kDeltaRuleMean), for the output and for the final state; the measured errors are printed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "gated_delta_rule.cuh"
#include "gpu_test_util.h"
#include "ops/gated_delta.h"
#include "random_fill.cuh"

namespace dflash {
namespace {

using test::gpu;
using test::to_host;
const Ctx kCpu = cpu_ctx();


struct Err {
  double max_err = 0, mean_err = 0, max_ref = 0, mean_ref = 0;
  size_t worst = 0;  // flat index of the largest error
  bool finite = true;
};
Err compare(const std::vector<float>& got, const std::vector<float>& want) {
  Err e;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) e.finite = false;
    const double d = std::fabs(double(got[i]) - want[i]);
    if (d > e.max_err) e.worst = i;
    e.max_err = std::max(e.max_err, d);
    e.mean_err += d;
    e.max_ref = std::max(e.max_ref, std::fabs(double(want[i])));
    e.mean_ref += std::fabs(double(want[i]));
  }
  e.mean_err /= std::max<size_t>(1, want.size());
  e.mean_ref /= std::max<size_t>(1, want.size());
  return e;
}
// row: elements per row of the printed location of the worst error (a token's outputs, a state row).
void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& want, size_t row) {
  const Err e = compare(got, want);
  std::printf("  %-6s max|err| %.3e (%.2e of max|ref| %.3e) at [%zu, %zu]  mean|err| %.3e (%.2e of mean|ref| %.3e)\n",
              what, e.max_err, e.max_err / std::max(e.max_ref, 1e-30), e.max_ref, e.worst / row, e.worst % row,
              e.mean_err, e.mean_err / std::max(e.mean_ref, 1e-30), e.mean_ref);
  EXPECT_TRUE(e.finite) << what << ": non-finite values (an element left unwritten?)";
  EXPECT_LE(e.max_err, test::tol::kDeltaRuleMax * e.max_ref) << what;
  EXPECT_LE(e.mean_err, test::tol::kDeltaRuleMean * e.mean_ref) << what;
}

float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Inputs shaped like the hybrid's: qkv = silu(conv output) (positive-leaning, so keys of nearby tokens are
// correlated and K K^T is far from diagonal), g = -exp(A_log) softplus(a + dt_bias) with per-head A_log in
// [-2.5, 2.5] (decays from ~0.99 to ~1e-5 per token), beta = sigmoid(b).
struct Inputs {
  std::vector<float> qkv, g, beta;
};
Inputs make_inputs(int64_t T, const ops::GdnHeads& hd, uint32_t seed, bool bf16_gates) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  Inputs in;
  in.qkv.resize(static_cast<size_t>(T) * hd.qkv_dim());
  for (auto& x : in.qkv) {
    const float r = 1.5f * nd(rng);
    x = bf16_round(r / (1.f + std::exp(-r)));
  }
  std::vector<float> A_log(hd.nv), dt_bias(hd.nv);
  for (int64_t h = 0; h < hd.nv; ++h) {
    A_log[h] = 2.5f * (2.f * ud(rng) - 1.f);
    dt_bias[h] = -3.f + 4.f * ud(rng);
  }
  in.g.resize(static_cast<size_t>(T) * hd.nv);
  in.beta.resize(in.g.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < hd.nv; ++h) {
      const float a = nd(rng) + dt_bias[h], sp = a > 20.f ? a : std::log1p(std::exp(a));
      float g = -std::exp(A_log[h]) * sp, b = 1.f / (1.f + std::exp(-1.5f * nd(rng)));
      if (bf16_gates) {
        g = bf16_round(g);
        b = bf16_round(b);
      }
      in.g[t * hd.nv + h] = g;
      in.beta[t * hd.nv + h] = b;
    }
  return in;
}

Buffer to_device_dtype(const Ctx& ctx, const std::vector<float>& host, DType dt, std::initializer_list<int64_t> dims) {
  Buffer b(Device::CUDA, dt, dims);
  copy_tensor(ctx, b, cpu_view(host.data(), dims));
  return b;
}

struct GdrCase {
  std::vector<int32_t> seqlens;
  int64_t nk, dk, nv, dv;
  bool bf16_gates;
};
void PrintTo(const GdrCase& c, std::ostream* os) {
  *os << "nk=" << c.nk << " dk=" << c.dk << " nv=" << c.nv << " dv=" << c.dv << " seqs=" << c.seqlens.size()
      << (c.bf16_gates ? " bf16 gates" : "");
}

class GpuGatedDeltaRule : public testing::TestWithParam<GdrCase> {};
TEST_P(GpuGatedDeltaRule, MatchesCpuRecurrence) {
  SKIP_WITHOUT_GPU();
  Ctx gctx = gpu();
  const GdrCase c = GetParam();
  const ops::GdnHeads hd{c.nk, c.dk, c.nv, c.dv};
  std::vector<int32_t> cu(1, 0);
  for (int32_t len : c.seqlens) cu.push_back(cu.back() + len);
  const int64_t T = cu.back(), nseq = static_cast<int64_t>(c.seqlens.size());
  const Inputs in = make_inputs(T, hd, static_cast<uint32_t>(T * 7 + c.nv), c.bf16_gates);

  std::vector<float> out(static_cast<size_t>(T) * hd.value_dim()), state(static_cast<size_t>(hd.nv) * hd.dk * hd.dv);
  ops::gated_delta_rule_forward(kCpu, cpu_view(out.data(), {T, hd.value_dim()}), cpu_view(state.data(), {hd.nv, hd.dk, hd.dv}),
                                cpu_view(in.qkv.data(), {T, hd.qkv_dim()}), cpu_view(in.g.data(), {T, hd.nv}),
                                cpu_view(in.beta.data(), {T, hd.nv}), cpu_view(cu.data(), {nseq + 1}), hd);

  const DType gdt = c.bf16_gates ? DType::BF16 : DType::F32;
  Buffer d_qkv = test::to_device(gctx, in.qkv, {T, hd.qkv_dim()});
  Buffer d_g = to_device_dtype(gctx, in.g, gdt, {T, hd.nv}), d_beta = to_device_dtype(gctx, in.beta, gdt, {T, hd.nv});
  Buffer d_cu = test::to_device_i32(gctx, cu);
  for (cuda::GdrScan scan : {cuda::GdrScan::kSync, cuda::GdrScan::kAuto}) {
    cuda::set_gated_delta_rule_scan(scan);
    const bool pipelined = cuda::gated_delta_rule_scan_is_pipelined(gctx, hd);
    if (scan == cuda::GdrScan::kAuto && !pipelined) continue;  // the device runs the synchronous scan only
    Buffer d_out = test::to_device(gctx, {}, {T, hd.value_dim()});
    Buffer d_state(Device::CUDA, DType::F32, {hd.nv, hd.dk, hd.dv});
    cudaMemset(d_out.t().data, 0xff, d_out.t().nbytes());      // NaN: every output must be written
    cudaMemset(d_state.t().data, 0xff, d_state.t().nbytes());  // NaN: the final state must be written
    Buffer d_ws(Device::CUDA, DType::BF16, {std::max<int64_t>(1, ops::gated_delta_rule_workspace_elems(T, hd))});
    ops::gated_delta_rule_forward(gctx, d_out, d_state, d_qkv, d_g, d_beta, d_cu, hd, d_ws);
    synchronize(gctx);
    std::printf("[gdr] T=%lld nseq=%lld nk=%lld dk=%lld nv=%lld dv=%lld gates %s, %s scan\n", static_cast<long long>(T),
                static_cast<long long>(nseq), static_cast<long long>(c.nk), static_cast<long long>(c.dk),
                static_cast<long long>(c.nv), static_cast<long long>(c.dv), c.bf16_gates ? "BF16" : "F32",
                pipelined ? "pipelined" : "synchronous");
    expect_close("out", to_host(gctx, d_out), out, static_cast<size_t>(hd.value_dim()));
    expect_close("state", to_host(gctx, d_state), state, static_cast<size_t>(hd.dv));
  }
  cuda::set_gated_delta_rule_scan(cuda::GdrScan::kAuto);
}
INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuGatedDeltaRule,
    testing::Values(
        // Qwen3.6-27B heads (nv = 3 nk); chunk edges, a 1-token sequence, a long one.
        GdrCase{{1, 63, 64, 65, 200, 1000}, 16, 128, 48, 128, false},
        // the golden tiny model's heads (16, padded to 64 in shared memory)
        GdrCase{{37, 29, 53}, 2, 16, 4, 16, false},
        // nv = nk, dk = dv = 32, bf16 gates
        GdrCase{{130, 1, 64, 300}, 4, 32, 4, 32, true},
        // dk != dv both ways (dv < 64 with dk = 128; dk = 64 with two dv slices)
        GdrCase{{700}, 2, 128, 6, 40, false}, GdrCase{{100, 129}, 1, 64, 3, 128, false},
        // many short sequences, and empty ones (the last one empty: the final state is zero)
        GdrCase{std::vector<int32_t>(70, 9), 2, 128, 4, 128, false}, GdrCase{{3, 0, 66, 0}, 2, 128, 4, 128, false}));

// Head dims the kernels do not take are refused, as is a missing workspace.
void run_unsupported(int64_t dk, bool with_workspace) {
  Ctx gctx = gpu();
  const ops::GdnHeads hd{1, dk, 1, 128};
  const int64_t T = 4;
  Buffer qkv(Device::CUDA, DType::BF16, {T, hd.qkv_dim()}), out(Device::CUDA, DType::BF16, {T, hd.value_dim()});
  Buffer g(Device::CUDA, DType::F32, {T, 1}), beta(Device::CUDA, DType::F32, {T, 1});
  Buffer state(Device::CUDA, DType::F32, {1, dk, 128}), ws(Device::CUDA, DType::BF16, {T * 64});
  Buffer cu = test::to_device_i32(gctx, {0, static_cast<int32_t>(T)});
  ops::gated_delta_rule_forward(gctx, out, state, qkv, g, beta, cu, hd, with_workspace ? ws.t() : Tensor());
}
TEST(GpuGatedDeltaRuleRefusal, HeadDimAndWorkspace) {
  SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a forked child cannot use the parent's CUDA context
  EXPECT_EXIT(run_unsupported(256, true), testing::ExitedWithCode(static_cast<int>(ExitCode::Internal)),
              "multiples of 8 up to 128");
  EXPECT_EXIT(run_unsupported(128, false), testing::ExitedWithCode(static_cast<int>(ExitCode::Internal)),
              "workspace");
}

// The real shape: times the op (CUDA events, 3 warm-ups, median of 20) for three packings of 32768 tokens,
// and checks the first 512 tokens of the first sequence against the CPU (a sequence is independent of the
// others in the batch).
TEST(GpuGatedDeltaRuleTiming, Qwen36_27B_T32768) {
  SKIP_WITHOUT_GPU();
  Ctx gctx = gpu();
  const ops::GdnHeads hd{16, 128, 48, 128};
  const int64_t T = 32768;
  Buffer qkv(Device::CUDA, DType::BF16, {T, hd.qkv_dim()}), out(Device::CUDA, DType::BF16, {T, hd.value_dim()});
  Buffer g(Device::CUDA, DType::F32, {T, hd.nv}), beta(Device::CUDA, DType::F32, {T, hd.nv});
  Buffer state(Device::CUDA, DType::F32, {hd.nv, hd.dk, hd.dv});
  Buffer ws(Device::CUDA, DType::BF16, {ops::gated_delta_rule_workspace_elems(T, hd)});
  cuda::fill_random(gctx, qkv, 1, 0.3f, 1.f);   // post-SiLU-like activations
  cuda::fill_random(gctx, g, 2, -0.6f, 0.3f);   // decays in ~[e^-1.1, e^-0.08] per token
  cuda::fill_random(gctx, beta, 3, 0.5f, 0.2f);  // in ~[0.15, 0.85]
  using cuda::GdrScan;
  const std::pair<int, GdrScan> runs[] = {{8, GdrScan::kSync}, {8, GdrScan::kAuto}, {1, GdrScan::kSync},
                                          {1, GdrScan::kAuto}, {32, GdrScan::kSync}, {32, GdrScan::kAuto}};
  for (const auto& [nseq, scan] : runs) {
    cuda::set_gated_delta_rule_scan(scan);
    const bool pipelined = cuda::gated_delta_rule_scan_is_pipelined(gctx, hd);
    if (scan == cuda::GdrScan::kAuto && !pipelined) continue;
    std::vector<int32_t> cu(nseq + 1);
    for (int s = 0; s <= nseq; ++s) cu[s] = static_cast<int32_t>(T / nseq * s);
    Buffer d_cu = test::to_device_i32(gctx, cu);
    const test::Timing t =
        test::time_calls(gctx, [&] { ops::gated_delta_rule_forward(gctx, out, state, qkv, g, beta, d_cu, hd, ws); });
    std::printf("[gdr timing] T=%lld as %d x %lld tokens, nk=16 dk=128 nv=48 dv=128, %s scan: median %.3f ms "
                "(min %.3f, max %.3f)\n",
                static_cast<long long>(T), nseq, static_cast<long long>(T / nseq),
                pipelined ? "pipelined" : "synchronous", t.median, t.min, t.max);
    if (nseq == 8) {  // check the head of sequence 0 against the CPU
      const int64_t Tc = 512;
      std::vector<float> h_qkv = to_host(gctx, qkv.t().slice_rows(0, Tc)), h_g = to_host(gctx, g.t().slice_rows(0, Tc)),
                         h_beta = to_host(gctx, beta.t().slice_rows(0, Tc)), h_out = to_host(gctx, out.t().slice_rows(0, Tc));
      std::vector<float> want(h_out.size()), st_cpu(static_cast<size_t>(hd.nv) * hd.dk * hd.dv);
      std::vector<int32_t> cu_c = {0, static_cast<int32_t>(Tc)};
      ops::gated_delta_rule_forward(kCpu, cpu_view(want.data(), {Tc, hd.value_dim()}),
                                    cpu_view(st_cpu.data(), {hd.nv, hd.dk, hd.dv}), cpu_view(h_qkv.data(), {Tc, hd.qkv_dim()}),
                                    cpu_view(h_g.data(), {Tc, hd.nv}), cpu_view(h_beta.data(), {Tc, hd.nv}),
                                    cpu_view(cu_c.data(), {2}), hd);
      std::printf("[gdr] real shape, first %lld tokens of sequence 0 (%s scan):\n", static_cast<long long>(Tc),
                  pipelined ? "pipelined" : "synchronous");
      expect_close("out", h_out, want, static_cast<size_t>(hd.value_dim()));
    }
  }
  cuda::set_gated_delta_rule_scan(cuda::GdrScan::kAuto);
}

}  // namespace
}  // namespace dflash
