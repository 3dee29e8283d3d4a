// The small ops of the Qwen3.5 hybrid (src/ops/gated_delta.h) on CUDA against their float32 CPU twins:
// causal conv1d + SiLU over packed sequences, the delta rule's gates, the gated RMSNorm, the sigmoid gate.
// Inputs are rounded to bf16 first so both backends see the same numbers.
//
// Tolerances, per element (so one wrong row, e.g. a missed sequence start, cannot hide in a norm):
//   bf16 outputs: |gpu - cpu| <= 1e-2 |cpu| + 1e-3. The GPU rounds its fp32 result to bf16 once (at most
//     2^-8 relative), so 1e-2 leaves 2.5x headroom; 1e-3 absolute covers results near zero. The whole
//     tensor must also meet the suite's ||gpu - cpu|| / ||cpu|| <= 1e-2 (tol::kOp).
//   F32 gates (g, beta): |gpu - cpu| <= 1e-5 |cpu| + 1e-7 (fp32 on both sides, a few ulp of exp/log1p).
// (tests/gpu/tolerances.h: kBf16ElementRtol/Atol, kF32ElementRtol/Atol.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <ostream>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dflash/backend.h"
#include "dflash/ops.h"
#include "gpu_test_util.h"
#include "ops/gated_delta.h"
#include "random_fill.cuh"

namespace dflash {
namespace {

using test::gpu;
using test::random_bf16;
using test::rel_err;
using test::time_calls;
using test::Timing;
using test::to_device;
using test::to_host;
const Ctx kCpu = cpu_ctx();

constexpr double kBf16Rtol = test::tol::kBf16ElementRtol, kBf16Atol = test::tol::kBf16ElementAtol;
constexpr double kF32Rtol = test::tol::kF32ElementRtol, kF32Atol = test::tol::kF32ElementAtol;

// Empty when every |got - want| <= rtol |want| + atol, else the first offending element (NaN fails).
std::string elementwise_mismatch(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                                 double atol, int64_t row_len) {
  if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (!(d <= rtol * std::fabs(double(want[i])) + atol))
      return "element " + std::to_string(i) + " (row " + std::to_string(i / row_len) + ", col " +
             std::to_string(i % row_len) + "): gpu " + std::to_string(got[i]) + " cpu " + std::to_string(want[i]);
  }
  return "";
}

// A device buffer of `dtype` holding host (F32 values, converted on the way).
Buffer to_device_as(const Ctx& g, const std::vector<float>& host, DType dtype, std::initializer_list<int64_t> dims) {
  if (dtype == DType::BF16) return to_device(g, host, dims);
  Buffer b(Device::CUDA, dtype, dims);
  copy_tensor(g, b, cpu_view(host.data(), dims));
  return b;
}

std::vector<int32_t> cu_of(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu{0};
  for (int32_t l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// ---- causal_conv1d_silu_forward -------------------------------------------------------------------

struct ConvCase {
  int64_t C, K;
  std::vector<int32_t> lens;  // packed sequence lengths (0 = an empty sequence)
};
void PrintTo(const ConvCase& c, std::ostream* os) { *os << "C" << c.C << "_K" << c.K << "_seqs" << c.lens.size(); }
class GpuGdnConv : public testing::TestWithParam<ConvCase> {};

TEST_P(GpuGdnConv, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const ConvCase& p = GetParam();
  const std::vector<int32_t> cu = cu_of(p.lens);
  const int64_t T = cu.back(), C = p.C, K = p.K, n = static_cast<int64_t>(cu.size());
  auto in = random_bf16(T * C, 21), w = random_bf16(C * K, 22, 0.5f);
  std::vector<float> want(T * C);
  ops::causal_conv1d_silu_forward(kCpu, cpu_view(want.data(), {T, C}), cpu_view(in.data(), {T, C}),
                                  cpu_view(w.data(), {C, K}), cpu_view(cu.data(), {n}));
  Buffer d_in = to_device(g, in, {T, C}), d_w = to_device(g, w, {C, K}), d_out = to_device(g, {}, {T, C});
  Buffer d_cu = test::to_device_i32(g, cu);
  ops::causal_conv1d_silu_forward(g, d_out, d_in, d_w, d_cu);
  const auto got = to_host(g, d_out);
  EXPECT_EQ(elementwise_mismatch(got, want, kBf16Rtol, kBf16Atol, C), "");
  EXPECT_LT(rel_err(got, want), test::tol::kOp);
  if (C % 8 != 0) return;  // the scalar path already
  // The same tensors viewed 2 bytes into buffers one element longer take the scalar path, which sums the
  // taps with the same fma chain and the same SiLU: bit for bit the vector path's output.
  Buffer b_in = to_device(g, {}, {T * C + 1}), b_out = to_device(g, {}, {T * C + 1});
  auto view = [&](const Buffer& b) {
    return Tensor(static_cast<uint16_t*>(b.t().data) + 1, DType::BF16, Device::CUDA, {T, C});
  };
  copy_tensor(g, view(b_in), cpu_view(in.data(), {T, C}));
  ops::causal_conv1d_silu_forward(g, view(b_out), view(b_in), d_w, d_cu);
  const auto got_scalar = to_host(g, view(b_out));
  EXPECT_TRUE(std::equal(got.begin(), got.end(), got_scalar.begin(),
                         [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }))
      << "the scalar path differs from the vector path";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuGdnConv,
    testing::Values(
        // vector path; sequences shorter than the kernel (1, 2), an empty one
        ConvCase{64, 4, {5, 1, 0, 17, 2, 9}},
        // the width of a 27B-class layer (2*16*128 + 48*128), uneven lengths
        ConvCase{10240, 4, {1, 130, 3, 61}},
        // C % 8 != 0: the scalar path
        ConvCase{37, 3, {1, 1, 4, 23}},
        // kernel sizes at the ends of the supported range
        ConvCase{48, 1, {3, 12, 1}}, ConvCase{200, 8, {11, 1, 7, 40}},
        // one sequence, one token
        ConvCase{16, 4, {1}},
        // the 27B target's batch: 8 x 4096 tokens at the full width
        ConvCase{10240, 4, {4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096}},
        // many short sequences and empty ones inside one block's token run, every K
        ConvCase{1024, 2, {7, 0, 0, 1, 65, 3, 130, 1, 1, 200}}, ConvCase{1024, 3, {7, 0, 0, 1, 65, 3, 130, 1, 1, 200}},
        ConvCase{1024, 5, {7, 0, 0, 1, 65, 3, 130, 1, 1, 200}}, ConvCase{1024, 6, {7, 0, 0, 1, 65, 3, 130, 1, 1, 200}},
        ConvCase{1024, 7, {7, 0, 0, 1, 65, 3, 130, 1, 1, 200}}, ConvCase{1032, 8, {7, 0, 0, 1, 65, 3, 130, 1, 1, 200}},
        ConvCase{24, 1, {1, 2, 3, 300}}),
    [](const testing::TestParamInfo<ConvCase>& i) {
      return "C" + std::to_string(i.param.C) + "_K" + std::to_string(i.param.K) + "_S" +
             std::to_string(i.param.lens.size());
    });

// The 27B target's shape (bench_hybrid_forward --model 27b): times the op (CUDA events, 3 warm-ups, median
// of 20) on [32768, 10240], K = 4, as 8 x 4096 tokens, and checks the first two sequences against the CPU.
TEST(GpuCausalConv1dTiming, Qwen36_27B_T32768) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t T = 32768, C = 10240, K = 4, nseq = 8;
  Buffer in(Device::CUDA, DType::BF16, {T, C}), out(Device::CUDA, DType::BF16, {T, C});
  Buffer w(Device::CUDA, DType::BF16, {C, K});
  cuda::fill_random(g, in, 41, 0.f, 1.f);
  cuda::fill_random(g, w, 42, 0.f, 0.5f);
  std::vector<int32_t> cu(nseq + 1);
  for (int64_t s = 0; s <= nseq; ++s) cu[s] = static_cast<int32_t>(T / nseq * s);
  Buffer d_cu = test::to_device_i32(g, cu);
  const Timing t = time_calls(g, [&] { ops::causal_conv1d_silu_forward(g, out, in, w, d_cu); });
  const double gb = 2.0 * T * C * 2 / 1e9;  // in + out, bf16
  std::printf("[conv timing] T=%lld as %lld x %lld tokens, C=%lld K=%lld: median %.3f ms (min %.3f, max %.3f), "
              "%.0f GB/s\n",
              (long long)T, (long long)nseq, (long long)(T / nseq), (long long)C, (long long)K, t.median, t.min,
              t.max, gb / (t.median * 1e-3));
  const int64_t Tc = 2 * T / nseq;  // sequences 0 and 1: the CPU sees the same packing up to token Tc
  const std::vector<float> h_in = to_host(g, in.t().slice_rows(0, Tc)), h_w = to_host(g, w),
                           got = to_host(g, out.t().slice_rows(0, Tc));
  std::vector<float> want(static_cast<size_t>(Tc * C));
  const std::vector<int32_t> cu_c(cu.begin(), cu.begin() + 3);
  ops::causal_conv1d_silu_forward(kCpu, cpu_view(want.data(), {Tc, C}), cpu_view(h_in.data(), {Tc, C}),
                                  cpu_view(h_w.data(), {C, K}), cpu_view(cu_c.data(), {3}));
  EXPECT_EQ(elementwise_mismatch(got, want, kBf16Rtol, kBf16Atol, C), "");
  EXPECT_LT(rel_err(got, want), test::tol::kOp);
}

// ---- gdn_gates_forward ----------------------------------------------------------------------------

struct GatesCase {
  int64_t T, nv;
  DType ab, params;  // dtype of a/b, of A_log/dt_bias on the device
};
void PrintTo(const GatesCase& c, std::ostream* os) {
  *os << "T" << c.T << "_nv" << c.nv << "_ab" << dtype_name(c.ab) << "_params" << dtype_name(c.params);
}
class GpuGdnGates : public testing::TestWithParam<GatesCase> {};

TEST_P(GpuGdnGates, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const GatesCase& p = GetParam();
  const int64_t T = p.T, nv = p.nv;
  auto a = random_bf16(T * nv, 31, 4.f), b = random_bf16(T * nv, 32, 4.f), dt = random_bf16(nv, 33);
  // Both sides of the softplus threshold (20) and deep into the sigmoid's tails.
  a[0] = 30.f;
  if (a.size() > 2) a[2] = -40.f;
  b[0] = -30.f;
  if (b.size() > 1) b[1] = 25.f;
  std::vector<float> A_log(nv);
  std::mt19937 rng(34);
  std::uniform_real_distribution<float> u(1.f, 16.f);
  for (auto& x : A_log) x = bf16_to_f32(f32_to_bf16(std::log(u(rng))));  // HF initialises A in [1, 16]
  std::vector<float> g_want(T * nv), beta_want(T * nv);
  ops::gdn_gates_forward(kCpu, cpu_view(g_want.data(), {T, nv}), cpu_view(beta_want.data(), {T, nv}),
                         cpu_view(a.data(), {T, nv}), cpu_view(b.data(), {T, nv}), cpu_view(A_log.data(), {nv}),
                         cpu_view(dt.data(), {nv}));
  Buffer d_a = to_device_as(g, a, p.ab, {T, nv}), d_b = to_device_as(g, b, p.ab, {T, nv});
  Buffer d_A = to_device_as(g, A_log, p.params, {nv}), d_dt = to_device_as(g, dt, p.params, {nv});
  Buffer d_g(Device::CUDA, DType::F32, {T, nv}), d_beta(Device::CUDA, DType::F32, {T, nv});
  cudaMemset(d_g.t().data, 0xff, d_g.t().nbytes());  // NaN: an unwritten element fails
  cudaMemset(d_beta.t().data, 0xff, d_beta.t().nbytes());
  ops::gdn_gates_forward(g, d_g, d_beta, d_a, d_b, d_A, d_dt);
  EXPECT_EQ(elementwise_mismatch(to_host(g, d_g), g_want, kF32Rtol, kF32Atol, nv), "") << "g";
  EXPECT_EQ(elementwise_mismatch(to_host(g, d_beta), beta_want, kF32Rtol, kF32Atol, nv), "") << "beta";
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGdnGates,
                         testing::Values(GatesCase{301, 48, DType::BF16, DType::F32},  // as the CUDA target runs
                                         GatesCase{301, 48, DType::BF16, DType::BF16},
                                         GatesCase{17, 5, DType::F32, DType::F32}, GatesCase{1, 3, DType::F32, DType::BF16}),
                         [](const testing::TestParamInfo<GatesCase>& i) {
                           return "T" + std::to_string(i.param.T) + "_nv" + std::to_string(i.param.nv) + "_" +
                                  dtype_name(i.param.ab) + "_" + dtype_name(i.param.params);
                         });

// ---- gated_rmsnorm_forward ------------------------------------------------------------------------

struct NormCase {
  int64_t N, C;
  DType w;
  bool in_place;  // out aliases in, as the target calls it
};
void PrintTo(const NormCase& c, std::ostream* os) {
  *os << c.N << "x" << c.C << "_w" << dtype_name(c.w) << (c.in_place ? "_in_place" : "");
}
class GpuGatedRmsNorm : public testing::TestWithParam<NormCase> {};

TEST_P(GpuGatedRmsNorm, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const NormCase& p = GetParam();
  const int64_t N = p.N, C = p.C;
  const float eps = 1e-6f;
  auto in = random_bf16(N * C, 41, 3.f), z = random_bf16(N * C, 42, 2.f), w = random_bf16(C, 43);
  std::vector<float> want(N * C);
  ops::gated_rmsnorm_forward(kCpu, cpu_view(want.data(), {N, C}), cpu_view(in.data(), {N, C}),
                             cpu_view(z.data(), {N, C}), cpu_view(w.data(), {C}), eps);
  Buffer d_in = to_device(g, in, {N, C}), d_z = to_device(g, z, {N, C}), d_w = to_device_as(g, w, p.w, {C});
  Buffer d_out = to_device(g, {}, {N, C});
  const Tensor& out = p.in_place ? d_in.t() : d_out.t();
  ops::gated_rmsnorm_forward(g, out, d_in, d_z, d_w, eps);
  const auto got = to_host(g, out);
  EXPECT_EQ(elementwise_mismatch(got, want, kBf16Rtol, kBf16Atol, C), "");
  EXPECT_LT(rel_err(got, want), test::tol::kOp);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGatedRmsNorm,
                         testing::Values(NormCase{331, 128, DType::BF16, true},    // head dim 128, in place
                                         NormCase{331, 128, DType::F32, false},
                                         NormCase{97, 64, DType::BF16, false},
                                         NormCase{45, 256, DType::BF16, true},     // a whole warp per row
                                         NormCase{67, 96, DType::F32, true},       // 12 chunks over 16 lanes
                                         NormCase{33, 1024, DType::BF16, true},    // the widest supported row
                                         NormCase{41, 1000, DType::F32, false},    // 125 chunks: 4 per lane, ragged
                                         NormCase{59, 37, DType::BF16, false},     // scalar path
                                         NormCase{23, 1023, DType::F32, true},     // scalar path, 32 per lane
                                         NormCase{5, 8, DType::BF16, false},
                                         NormCase{7, 3, DType::BF16, true},
                                         NormCase{1, 1, DType::BF16, false}),
                         [](const testing::TestParamInfo<NormCase>& i) {
                           return "N" + std::to_string(i.param.N) + "_C" + std::to_string(i.param.C) + "_w" +
                                  dtype_name(i.param.w) + (i.param.in_place ? "_inplace" : "");
                         });

// ---- sigmoid_gate_forward -------------------------------------------------------------------------

struct GateCase {
  int64_t N, C;
  bool in_place;
  bool misaligned;  // views 2 bytes into their buffers: the scalar path
};
void PrintTo(const GateCase& c, std::ostream* os) {
  *os << c.N << "x" << c.C << (c.in_place ? "_in_place" : "") << (c.misaligned ? "_misaligned" : "");
}
class GpuSigmoidGate : public testing::TestWithParam<GateCase> {};

TEST_P(GpuSigmoidGate, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const GateCase& p = GetParam();
  const int64_t N = p.N, C = p.C, off = p.misaligned ? 1 : 0;
  auto x = random_bf16(N * C, 51, 2.f), gate = random_bf16(N * C, 52, 4.f);
  std::vector<float> want(N * C);
  ops::sigmoid_gate_forward(kCpu, cpu_view(want.data(), {N, C}), cpu_view(x.data(), {N, C}),
                            cpu_view(gate.data(), {N, C}));
  // Buffers one element longer than the tensor, viewed from element `off`.
  Buffer bx = to_device(g, {}, {N * C + 1}), bg = to_device(g, {}, {N * C + 1}), bo = to_device(g, {}, {N * C + 1});
  auto view = [&](const Buffer& b) {
    return Tensor(static_cast<uint16_t*>(b.t().data) + off, DType::BF16, Device::CUDA, {N, C});
  };
  const Tensor vx = view(bx), vg = view(bg), vo = p.in_place ? vx : view(bo);
  copy_tensor(g, vx, cpu_view(x.data(), {N, C}));
  copy_tensor(g, vg, cpu_view(gate.data(), {N, C}));
  ops::sigmoid_gate_forward(g, vo, vx, vg);
  const auto got = to_host(g, vo);
  EXPECT_EQ(elementwise_mismatch(got, want, kBf16Rtol, kBf16Atol, C), "");
  EXPECT_LT(rel_err(got, want), test::tol::kOp);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuSigmoidGate,
                         testing::Values(GateCase{301, 4096, true, false},  // as the target calls it
                                         GateCase{301, 4096, false, false},
                                         GateCase{7, 13, false, false},     // 91 elements: vector + tail
                                         GateCase{7, 13, true, true},       // scalar path
                                         GateCase{1, 1, false, true}),
                         [](const testing::TestParamInfo<GateCase>& i) {
                           return "N" + std::to_string(i.param.N) + "_C" + std::to_string(i.param.C) +
                                  (i.param.in_place ? "_inplace" : "") + (i.param.misaligned ? "_misaligned" : "");
                         });

// ---- the 27B forward's norm kernels at its shapes (T = 32768 = 8 x 4096): timing + a check ----------------
// Each test times the op as the target calls it (CUDA events around each call after 3 warm-ups, median of
// 20; bytes = what the op must read and write once) and checks a slice of its output against the CPU twin.

void print_timing(const char* what, const Timing& t, double bytes) {
  std::printf("[%s timing] median %.4f ms (min %.4f, max %.4f), %.0f GB/s\n", what, t.median, t.min, t.max,
              bytes / 1e9 / (t.median * 1e-3));
}

// rmsnorm_forward [32768, 5120] (input_layernorm / post_attention_layernorm; 128 calls per forward), without
// rstd as the target calls it; then with rstd (the drafter step's use) for the check of rows 0..1023.
TEST(GpuRmsNormTiming, Qwen36_27B_T32768) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t T = 32768, C = 5120, R = 1024;
  const float eps = 1e-6f;
  Buffer in(Device::CUDA, DType::BF16, {T, C}), out(Device::CUDA, DType::BF16, {T, C});
  Buffer w(Device::CUDA, DType::BF16, {C});
  Buffer rstd(Device::CUDA, DType::F32, {T});
  cuda::fill_random(g, in, 61, 0.f, 1.f);
  cuda::fill_random(g, w, 62, 1.f, 0.05f);
  const std::vector<float> h_in = to_host(g, in.t().slice_rows(0, R)), h_w = to_host(g, w);
  std::vector<float> want(R * C), want_rstd(R);
  ops::rmsnorm_forward(kCpu, cpu_view(want.data(), {R, C}), cpu_view(want_rstd.data(), {R}),
                       cpu_view(h_in.data(), {R, C}), cpu_view(h_w.data(), {C}), eps);
  const Timing t = time_calls(g, [&] { ops::rmsnorm_forward(g, out, Tensor(), in, w, eps); });
  print_timing("rmsnorm", t, 2.0 * T * C * 2);
  const auto got = to_host(g, out.t().slice_rows(0, R));
  EXPECT_EQ(elementwise_mismatch(got, want, kBf16Rtol, kBf16Atol, C), "");
  EXPECT_LT(rel_err(got, want), test::tol::kOp);
  cudaMemset(out.t().data, 0, out.t().nbytes());
  ops::rmsnorm_forward(g, out, rstd, in, w, eps);
  const auto got2 = to_host(g, out.t().slice_rows(0, R)), got_rstd = to_host(g, rstd.t().slice_rows(0, R));
  EXPECT_EQ(elementwise_mismatch(got2, want, kBf16Rtol, kBf16Atol, C), "") << "with rstd";
  EXPECT_LT(rel_err(got_rstd, want_rstd), test::tol::kF32Output);
}

// gated_rmsnorm_forward in place on [32768 * 48, 128] (the GDN output norm; 48 calls per forward); rows
// 0..4095 checked.
TEST(GpuGatedRmsNormTiming, Qwen36_27B_T32768) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t T = 32768, nv = 48, dv = 128, N = T * nv, R = 4096;
  const float eps = 1e-6f;
  Buffer o(Device::CUDA, DType::BF16, {N, dv}), z(Device::CUDA, DType::BF16, {N, dv});
  Buffer w(Device::CUDA, DType::BF16, {dv});
  cuda::fill_random(g, z, 72, 0.f, 2.f);
  cuda::fill_random(g, w, 73, 1.f, 0.05f);
  cuda::fill_random(g, o, 71, 0.f, 1.f);
  const std::vector<float> h_o = to_host(g, o.t().slice_rows(0, R)), h_z = to_host(g, z.t().slice_rows(0, R)),
                           h_w = to_host(g, w);
  std::vector<float> want(R * dv);
  ops::gated_rmsnorm_forward(kCpu, cpu_view(want.data(), {R, dv}), cpu_view(h_o.data(), {R, dv}),
                             cpu_view(h_z.data(), {R, dv}), cpu_view(h_w.data(), {dv}), eps);
  ops::gated_rmsnorm_forward(g, o, o, z, w, eps);
  const auto got = to_host(g, o.t().slice_rows(0, R));
  EXPECT_EQ(elementwise_mismatch(got, want, kBf16Rtol, kBf16Atol, dv), "");
  EXPECT_LT(rel_err(got, want), test::tol::kOp);
  const Timing t = time_calls(g, [&] { ops::gated_rmsnorm_forward(g, o, o, z, w, eps); });
  print_timing("gated_rmsnorm", t, 3.0 * N * dv * 2);
}

// head_norm_rope_forward in place on q [32768, 24, 256] and k [32768, 4, 256] (partial rotary 64, theta 1e7;
// 16 calls each per forward), positions 0..4095 per sequence; tokens 3584..4607 (across a sequence start)
// checked.
TEST(GpuHeadNormRopeTiming, Qwen36_27B_T32768) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t T = 32768, nq = 24, nk = 4, hd = 256, t0 = 3584, R = 1024;
  const ops::RopeSpec rope{1e7f, 64};
  const float eps = 1e-6f;
  Buffer q(Device::CUDA, DType::BF16, {T, nq, hd}), k(Device::CUDA, DType::BF16, {T, nk, hd});
  Buffer qw(Device::CUDA, DType::BF16, {hd}), kw(Device::CUDA, DType::BF16, {hd});
  cuda::fill_random(g, qw, 83, 1.f, 0.05f);
  cuda::fill_random(g, kw, 84, 1.f, 0.05f);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t % 4096);
  Buffer d_pos = test::to_device_i32(g, pos);
  struct Side {
    const char* name;
    Buffer* x;
    Buffer* w;
    int64_t nh;
    uint64_t seed;
  };
  for (const Side& side : {Side{"head_norm_rope q", &q, &qw, nq, 81}, Side{"head_norm_rope k", &k, &kw, nk, 82}}) {
    const Tensor x = side.x->t();
    cuda::fill_random(g, x, side.seed, 0.f, 1.f);
    const std::vector<float> h_x = to_host(g, x.slice_rows(t0, t0 + R)), h_w = to_host(g, side.w->t());
    const std::vector<int32_t> h_pos(pos.begin() + t0, pos.begin() + t0 + R);
    std::vector<float> want(R * side.nh * hd), want_rstd(R * side.nh);
    ops::head_norm_rope_forward(kCpu, cpu_view(want.data(), {R, side.nh, hd}),
                                cpu_view(want_rstd.data(), {R, side.nh}), cpu_view(h_x.data(), {R, side.nh, hd}),
                                cpu_view(h_w.data(), {hd}), cpu_view(h_pos.data(), {R}), rope, eps);
    Buffer rstd(Device::CUDA, DType::F32, {T, side.nh});
    ops::head_norm_rope_forward(g, x, rstd, x, side.w->t(), d_pos, rope, eps);
    const auto got = to_host(g, x.slice_rows(t0, t0 + R));
    const auto got_rstd = to_host(g, rstd.t().slice_rows(t0, t0 + R));
    std::printf("[%s] rel %.2e, rstd rel %.2e\n", side.name, rel_err(got, want), rel_err(got_rstd, want_rstd));
    EXPECT_LT(rel_err(got, want), test::tol::kOp) << side.name;
    EXPECT_LT(rel_err(got_rstd, want_rstd), test::tol::kF32Output) << side.name;
    const Timing t =
        time_calls(g, [&] { ops::head_norm_rope_forward(g, x, Tensor(), x, side.w->t(), d_pos, rope, eps); });
    print_timing(side.name, t, 2.0 * T * side.nh * hd * 2);
  }
}

// sigmoid_gate_forward in place on [32768, 6144] (the attention output gate; 16 calls per forward); rows
// 0..1023 checked. The 23 calls in place drive a toward zero where sigmoid(gate) is small (denormals after
// a few): the kernel's ex2/rcp sigmoid and multiply take them at full speed, while the previous kernel's IEEE
// divide measured a 0.90 ms median here (0.30 ms for the first calls) against 0.31 ms a call in the forward.
TEST(GpuSigmoidGateTiming, Qwen36_27B_T32768) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t T = 32768, C = 24 * 256, R = 1024;
  Buffer a(Device::CUDA, DType::BF16, {T, C}), gate(Device::CUDA, DType::BF16, {T, C});
  cuda::fill_random(g, gate, 92, 0.f, 4.f);
  cuda::fill_random(g, a, 91, 0.f, 2.f);
  const std::vector<float> h_a = to_host(g, a.t().slice_rows(0, R)), h_g = to_host(g, gate.t().slice_rows(0, R));
  std::vector<float> want(R * C);
  ops::sigmoid_gate_forward(kCpu, cpu_view(want.data(), {R, C}), cpu_view(h_a.data(), {R, C}),
                            cpu_view(h_g.data(), {R, C}));
  ops::sigmoid_gate_forward(g, a, a, gate);
  const auto got = to_host(g, a.t().slice_rows(0, R));
  EXPECT_EQ(elementwise_mismatch(got, want, kBf16Rtol, kBf16Atol, C), "");
  EXPECT_LT(rel_err(got, want), test::tol::kOp);
  const Timing t = time_calls(g, [&] { ops::sigmoid_gate_forward(g, a, a, gate); });
  print_timing("sigmoid_gate", t, 3.0 * T * C * 2);
}

// ---- bandwidth at a 27B-class layer's shapes (by hand: --gtest_also_run_disabled_tests) --------------

// Milliseconds per call of fn, averaged over 20 calls after a warm-up.
template <class Fn>
float time_ms(const Ctx& g, Fn fn) {
  fn();
  synchronize(g);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, static_cast<cudaStream_t>(g.stream));
  for (int i = 0; i < 20; ++i) fn();
  cudaEventRecord(b, static_cast<cudaStream_t>(g.stream));
  cudaEventSynchronize(b);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / 20.f;
}

// A BF16 device buffer of 0x3f3f (0.746) everywhere: cheap inputs for timing.
Buffer filled(std::initializer_list<int64_t> dims) {
  Buffer b(Device::CUDA, DType::BF16, dims);
  cudaMemset(b.t().data, 0x3f, b.t().nbytes());
  return b;
}

TEST(DISABLED_GpuGdnOpsPerf, Bandwidth) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t T = 16384, C = 10240, K = 4, nv = 48, dv = 128, q = 24 * 256;
  std::vector<int32_t> lens;
  for (int64_t left = T; left > 0; left -= std::min<int64_t>(left, 3000)) lens.push_back(std::min<int64_t>(left, 3000));
  Buffer in = filled({T, C}), out = filled({T, C}), w = filled({C, K}), cu = test::to_device_i32(g, cu_of(lens));
  const double conv_gb = 2.0 * T * C * 2 / 1e9;
  const float conv = time_ms(g, [&] { ops::causal_conv1d_silu_forward(g, out, in, w, cu); });
  Buffer core = filled({T * nv, dv}), z = filled({T * nv, dv}), nw = filled({dv});
  const double norm_gb = 3.0 * T * nv * dv * 2 / 1e9;
  const float norm = time_ms(g, [&] { ops::gated_rmsnorm_forward(g, core, core, z, nw, 1e-6f); });
  Buffer x = filled({T, q}), gate_in = filled({T, q});
  const double gate_gb = 3.0 * T * q * 2 / 1e9;
  const float gate = time_ms(g, [&] { ops::sigmoid_gate_forward(g, x, x, gate_in); });
  std::printf("T=%lld: conv1d+silu C=%lld %.1f us (%.0f GB/s); gated_rmsnorm %lldx%lld %.1f us (%.0f GB/s); "
              "sigmoid_gate %lldx%lld %.1f us (%.0f GB/s)\n",
              (long long)T, (long long)C, conv * 1e3, conv_gb / (conv * 1e-3), (long long)(T * nv), (long long)dv,
              norm * 1e3, norm_gb / (norm * 1e-3), (long long)T, (long long)q, gate * 1e3, gate_gb / (gate * 1e-3));
}

}  // namespace
}  // namespace dflash
