// The target's fused-projection ops on CUDA against their float32 CPU twins on random data (relative L2
// error <= 1e-2: tol::kOp), at every kernel path:
//   qkv_norm_rope_forward: the warp kernel (hd = rotary_dim = 64, 128, 256, 16-byte aligned: jobs of one
//     token's slots, several jobs a token, uneven ones, T of 1, 3, 17 (part-filled blocks), a slot holding a
//     query and a key head or a key and a value head, value-only slots, a slot past the row's last head),
//     the block kernel's register paths (forced, and hd 128 8-byte aligned), its shared-memory path (partial
//     RoPE, hd 24 and 80, misaligned views). Every case runs under every cuda::QkvNormRopeKernel variant, and
//     each variant's outputs must equal the block kernel's bit for bit (the warp kernel replaced it and
//     computes its arithmetic exactly). At the Qwen3 shape it must also agree with the unfused CUDA path it
//     replaced in the target (head_norm_rope_forward on the q and k slices) to one bf16 rounding step per
//     element: the two kernels compute the same math but sum the squares in different orders.
//   swiglu_fused_forward: 16-byte vectors (I % 8 == 0), the scalar path (I odd; a misaligned view), and
//     the 8B shape's I = 12288 (several blocks per row).
// Outputs start as NaN (to_device with no data), so an element the kernel skips fails the comparison.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <vector>

#include "dflash/ops.h"
#include "gpu_test_util.h"
#include "qkv_norm_rope.cuh"
#include "random_fill.cuh"

namespace dflash {
namespace {

using test::gpu;
using test::random_bf16;
using test::rel_err;
using test::to_device;
using test::to_host;
const Ctx kCpu = cpu_ctx();

// A view of `dims` starting `offset` elements into b (b holds at least offset + the view's elements).
Tensor view_at(const Buffer& b, int64_t offset, std::initializer_list<int64_t> dims) {
  return Tensor(static_cast<char*>(b.t().data) + offset * dtype_size(b.t().dtype), b.t().dtype, Device::CUDA, dims);
}

struct QkvCase {
  int64_t T, nh, nkv, hd;
  int rotary_dim;  // 0 = hd
  int64_t offset;  // elements every device tensor is shifted by (1: misaligned; 4: 8 bytes, not 16)
};
void PrintTo(const QkvCase& c, std::ostream* os) {
  *os << "T" << c.T << "_h" << c.nh << "kv" << c.nkv << "_hd" << c.hd << "_rot" << c.rotary_dim << "_off" << c.offset;
}
struct QkvOut {
  std::vector<float> q, k, v;
};
class GpuQkvNormRope : public testing::TestWithParam<QkvCase> {};
TEST_P(GpuQkvNormRope, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const QkvCase c = GetParam();
  const int64_t T = c.T, nh = c.nh, nkv = c.nkv, hd = c.hd, width = (nh + 2 * nkv) * hd, off = c.offset;
  const ops::RopeSpec rope{1e6f, c.rotary_dim};
  const float eps = 1e-6f;
  auto qkv = random_bf16(T * width, 31, 2.f), q_norm = random_bf16(hd, 32), k_norm = random_bf16(hd, 33);
  std::vector<int32_t> pos(T);
  for (int64_t i = 0; i < T; ++i) pos[i] = static_cast<int32_t>((i * 53) % 4096);  // large angles too
  std::vector<float> q(T * nh * hd), k(T * nkv * hd), v(T * nkv * hd);
  ops::qkv_norm_rope_forward(kCpu, cpu_view(q.data(), {T, nh, hd}), cpu_view(k.data(), {T, nkv, hd}),
                             cpu_view(v.data(), {T, nkv, hd}), cpu_view(qkv.data(), {T, width}),
                             cpu_view(q_norm.data(), {hd}), cpu_view(k_norm.data(), {hd}), cpu_view(pos.data(), {T}),
                             rope, eps);

  // Device copies, each `off` elements into its buffer.
  auto shifted = [&](const std::vector<float>& host, int64_t n) {
    std::vector<float> h(off + n, 0.f);
    if (host.empty()) {
      for (float& x : h) x = NAN;
    } else {
      std::memcpy(h.data() + off, host.data(), n * sizeof(float));
    }
    return to_device(g, h, {off + n});
  };
  Buffer b_qkv = shifted(qkv, T * width), b_qn = shifted(q_norm, hd), b_kn = shifted(k_norm, hd);
  Buffer d_pos = test::to_device_i32(g, pos);
  const Tensor d_qkv = view_at(b_qkv, off, {T, width});
  // One run under `kernel`, into fresh NaN outputs.
  auto run = [&](cuda::QkvNormRopeKernel kernel) {
    Buffer b_q = shifted({}, T * nh * hd), b_k = shifted({}, T * nkv * hd), b_v = shifted({}, T * nkv * hd);
    const Tensor d_q = view_at(b_q, off, {T, nh, hd}), d_k = view_at(b_k, off, {T, nkv, hd}),
                 d_v = view_at(b_v, off, {T, nkv, hd});
    cuda::set_qkv_norm_rope_kernel(kernel);
    ops::qkv_norm_rope_forward(g, d_q, d_k, d_v, d_qkv, view_at(b_qn, off, {hd}), view_at(b_kn, off, {hd}), d_pos,
                               rope, eps);
    cuda::set_qkv_norm_rope_kernel(cuda::QkvNormRopeKernel::Default);
    return QkvOut{to_host(g, d_q), to_host(g, d_k), to_host(g, d_v)};
  };
  // Elements whose bits differ (a NaN anywhere counts).
  auto differing = [](const std::vector<float>& a, const std::vector<float>& b) {
    size_t bad = 0;
    for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0 || std::isnan(a[i]);
    return bad;
  };
  const QkvOut block = run(cuda::QkvNormRopeKernel::Block);
  for (cuda::QkvNormRopeKernel kernel :
       {cuda::QkvNormRopeKernel::Block, cuda::QkvNormRopeKernel::Default, cuda::QkvNormRopeKernel::Warp6,
        cuda::QkvNormRopeKernel::Warp12, cuda::QkvNormRopeKernel::Warp24}) {
    SCOPED_TRACE(testing::Message() << "kernel variant " << static_cast<int>(kernel));
    const QkvOut got = kernel == cuda::QkvNormRopeKernel::Block ? block : run(kernel);
    EXPECT_LT(rel_err(got.q, q), test::tol::kOp);
    EXPECT_LT(rel_err(got.k, k), test::tol::kOp);
    EXPECT_EQ(rel_err(got.v, v), 0.0);  // a copy is exact
    EXPECT_EQ(differing(got.q, block.q), 0u);
    EXPECT_EQ(differing(got.k, block.k), 0u);
    EXPECT_EQ(differing(got.v, block.v), 0u);
  }

  if (hd == 128 && (c.rotary_dim == 0 || c.rotary_dim == 128) && off == 0) {
    // The unfused path of the target before: q and k GEMM outputs (here: the same slices of qkv) normed and
    // rotated in place by head_norm_rope_forward.
    const QkvOut got = run(cuda::QkvNormRopeKernel::Default);
    std::vector<float> q_in(T * nh * hd), k_in(T * nkv * hd);
    for (int64_t n = 0; n < T; ++n) {
      std::memcpy(&q_in[n * nh * hd], &qkv[n * width], nh * hd * sizeof(float));
      std::memcpy(&k_in[n * nkv * hd], &qkv[n * width + nh * hd], nkv * hd * sizeof(float));
    }
    Buffer u_q = to_device(g, q_in, {T, nh, hd}), u_k = to_device(g, k_in, {T, nkv, hd});
    ops::head_norm_rope_forward(g, u_q, Tensor(), u_q, view_at(b_qn, 0, {hd}), d_pos, rope, eps);
    ops::head_norm_rope_forward(g, u_k, Tensor(), u_k, view_at(b_kn, 0, {hd}), d_pos, rope, eps);
    // One bf16 rounding step: |a - b| <= 2^-8 (|a| + |b|) covers a flip of the last bit of either result.
    auto within_one_rounding = [](const std::vector<float>& a, const std::vector<float>& b) {
      size_t bad = 0;
      for (size_t i = 0; i < a.size(); ++i)
        bad += !(std::fabs(a[i] - b[i]) <= std::ldexp(std::fabs(a[i]) + std::fabs(b[i]), -8));
      return bad;
    };
    EXPECT_EQ(within_one_rounding(to_host(g, u_q), got.q), 0u);
    EXPECT_EQ(within_one_rounding(to_host(g, u_k), got.k), 0u);
    EXPECT_LT(rel_err(to_host(g, u_q), got.q), 1e-3);
    EXPECT_LT(rel_err(to_host(g, u_k), got.k), 1e-3);
  }
}
// Slots hold 32 / (hd / 8) heads: 2 at hd 128, 4 at 64, 1 at 256. The warp kernel's jobs at hd 128 take up to
// 12 slots (Warp6: 6, Warp24: 24), at 64 and 256 up to 8, a token's slots split evenly.
INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuQkvNormRope,
    testing::Values(QkvCase{77, 32, 8, 128, 0, 0},  // Qwen3-8B: 24 slots, 2 jobs a token (Warp6 4, Warp24 1)
                    QkvCase{1, 32, 8, 128, 0, 0},   // one token: 2 jobs, a block of 4 warps part-filled
                    QkvCase{3, 40, 8, 128, 0, 0},   // Qwen3-14B heads: 28 slots, jobs of 10, 10, 8
                    QkvCase{3, 64, 8, 128, 0, 0},   // Qwen3-32B heads: 40 slots, 4 jobs of 10
                    QkvCase{17, 5, 2, 128, 0, 0},   // q|k and k|v slots, a value-only slot half past the row
                    QkvCase{17, 3, 3, 64, 0, 0},    // hd 64: q|k, k|v and value-only slots, 4 heads a slot
                    QkvCase{77, 8, 2, 64, 0, 0},    // hd 64
                    QkvCase{77, 6, 1, 256, 0, 0},   // hd 256: 8 slots, one job
                    QkvCase{3, 16, 4, 256, 0, 0},   // hd 256: 24 slots, 3 jobs
                    QkvCase{77, 32, 8, 128, 0, 4},  // 8-byte aligned: the block kernel's register path
                    QkvCase{77, 32, 8, 128, 0, 1},  // misaligned: shared-memory path
                    QkvCase{77, 6, 1, 256, 64, 0},  // Qwen3.5 partial RoPE
                    QkvCase{77, 4, 4, 80, 0, 0},    // hd 80 (attention pads it to 128)
                    QkvCase{3, 3, 1, 24, 8, 1}));   // small, partial, misaligned

struct SwigluCase {
  int64_t N, I, offset;
};
void PrintTo(const SwigluCase& c, std::ostream* os) { *os << "N" << c.N << "_I" << c.I << "_off" << c.offset; }
class GpuSwigluFused : public testing::TestWithParam<SwigluCase> {};
TEST_P(GpuSwigluFused, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const auto [N, I, off] = GetParam();
  auto gate_up = random_bf16(N * 2 * I, 34, 3.f);
  std::vector<float> out(N * I);
  ops::swiglu_fused_forward(kCpu, cpu_view(out.data(), {N, I}), cpu_view(gate_up.data(), {N, 2 * I}));
  std::vector<float> shifted(off + N * 2 * I, 0.f);
  std::memcpy(shifted.data() + off, gate_up.data(), gate_up.size() * sizeof(float));
  Buffer b_in = to_device(g, shifted, {off + N * 2 * I}), b_out = to_device(g, {}, {off + N * I});
  const Tensor d_out = view_at(b_out, off, {N, I});
  ops::swiglu_fused_forward(g, d_out, view_at(b_in, off, {N, 2 * I}));
  EXPECT_LT(rel_err(to_host(g, d_out), out), test::tol::kOp);
}
INSTANTIATE_TEST_SUITE_P(Shapes, GpuSwigluFused,
                         testing::Values(SwigluCase{37, 1000, 0}, SwigluCase{37, 1001, 0}, SwigluCase{19, 1000, 1},
                                         SwigluCase{5, 12288, 0}, SwigluCase{1, 8, 0}, SwigluCase{2, 16, 0},
                                         SwigluCase{3, 16, 0}));

// The 27B target's MLP (bench_hybrid_forward --model 27b: 64 calls a forward): times the op (test::time_calls)
// on gate_up [32768, 2 x 17408] and checks the first 256 rows against the CPU twin.
TEST(GpuSwigluFusedTiming, Qwen36_27B_T32768) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const int64_t N = 32768, I = 17408;
  Buffer gu(Device::CUDA, DType::BF16, {N, 2 * I}), out(Device::CUDA, DType::BF16, {N, I});
  cuda::fill_random(g, gu, 51, 0.f, 2.f);
  const test::Timing t = test::time_calls(g, [&] { ops::swiglu_fused_forward(g, out, gu); });
  const double bytes = 3.0 * N * I * 2;  // gate + up read, out written, bf16
  std::printf("[swiglu_fused timing] N=%lld I=%lld: median %.4f ms (min %.4f, max %.4f), %.0f GB/s\n",
              (long long)N, (long long)I, t.median, t.min, t.max, bytes / 1e9 / (t.median * 1e-3));
  const int64_t Nc = 256;
  const std::vector<float> h_gu = to_host(g, gu.t().slice_rows(0, Nc)), got = to_host(g, out.t().slice_rows(0, Nc));
  std::vector<float> want(static_cast<size_t>(Nc * I));
  ops::swiglu_fused_forward(kCpu, cpu_view(want.data(), {Nc, I}), cpu_view(h_gu.data(), {Nc, 2 * I}));
  EXPECT_LT(rel_err(got, want), test::tol::kOp);
}

}  // namespace
}  // namespace dflash
