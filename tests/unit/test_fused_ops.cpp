// The target's fused-projection ops against the unfused ops they replace (CPU backend):
//   qkv_norm_rope_forward = head_norm_rope_forward on the q and k heads of a fused q|k|v row + a copy of v,
//   swiglu_fused_forward  = swiglu_forward on the two column halves of a fused gate|up row.
// Both share their arithmetic with the unfused op, so the results must be equal bit for bit; a layout
// mistake (a head read from the wrong offset, gate and up swapped, a row stride of I instead of 2I)
// changes them. The unfused ops are checked against double-precision references in test_ops_forward.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>

#include "dflash/ops.h"
#include "ops_test_util.h"

namespace dflash {
namespace {

using test::random_vec;

const Ctx kCpu = cpu_ctx();

struct QkvCase {
  int64_t nh, nkv, hd;
  int rot;  // 0 = hd
  float theta;
};
void PrintTo(const QkvCase& c, std::ostream* os) {
  *os << "h" << c.nh << "kv" << c.nkv << "_hd" << c.hd << "_rot" << c.rot;
}
class FusedQkvNormRope : public ::testing::TestWithParam<QkvCase> {};

TEST_P(FusedQkvNormRope, EqualsHeadNormRopeOnSlicesAndACopy) {
  const auto [nh, nkv, hd, rot, theta] = GetParam();
  const int64_t T = 11, width = (nh + 2 * nkv) * hd;
  auto qkv = random_vec(T * width, 21, 2.0f);
  auto q_norm = random_vec(hd, 22, 0.2f, 1.0f), k_norm = random_vec(hd, 23, 0.2f, 1.0f);
  std::vector<int32_t> pos(T);
  for (int64_t n = 0; n < T; ++n) pos[n] = static_cast<int32_t>((n * 37) % 3000);  // packed: positions restart
  const ops::RopeSpec rope{theta, rot};

  // The unfused path: gather each part into its own contiguous tensor, then the per-part ops.
  std::vector<float> q_in(T * nh * hd), k_in(T * nkv * hd), v_want(T * nkv * hd);
  for (int64_t n = 0; n < T; ++n) {
    const float* row = qkv.data() + n * width;
    std::memcpy(&q_in[n * nh * hd], row, nh * hd * sizeof(float));
    std::memcpy(&k_in[n * nkv * hd], row + nh * hd, nkv * hd * sizeof(float));
    std::memcpy(&v_want[n * nkv * hd], row + (nh + nkv) * hd, nkv * hd * sizeof(float));
  }
  std::vector<float> q_want(q_in.size()), k_want(k_in.size());
  ops::head_norm_rope_forward(kCpu, cpu_view(q_want.data(), {T, nh, hd}), Tensor(), cpu_view(q_in.data(), {T, nh, hd}),
                              cpu_view(q_norm.data(), {hd}), cpu_view(pos.data(), {T}), rope, 1e-6f);
  ops::head_norm_rope_forward(kCpu, cpu_view(k_want.data(), {T, nkv, hd}), Tensor(),
                              cpu_view(k_in.data(), {T, nkv, hd}), cpu_view(k_norm.data(), {hd}),
                              cpu_view(pos.data(), {T}), rope, 1e-6f);

  std::vector<float> q(q_want.size(), 123.f), k(k_want.size(), 123.f), v(v_want.size(), 123.f);  // all overwritten
  ops::qkv_norm_rope_forward(kCpu, cpu_view(q.data(), {T, nh, hd}), cpu_view(k.data(), {T, nkv, hd}),
                             cpu_view(v.data(), {T, nkv, hd}), cpu_view(qkv.data(), {T, width}),
                             cpu_view(q_norm.data(), {hd}), cpu_view(k_norm.data(), {hd}), cpu_view(pos.data(), {T}),
                             rope, 1e-6f);
  EXPECT_EQ(q, q_want);
  EXPECT_EQ(k, k_want);
  EXPECT_EQ(v, v_want);
}

// The Qwen3 shape (GQA 4:1, hd 128), no GQA, several kv heads, partial RoPE, odd widths, the CPU's widest.
INSTANTIATE_TEST_SUITE_P(Ops, FusedQkvNormRope,
                         ::testing::Values(QkvCase{8, 2, 128, 0, 1e6f}, QkvCase{2, 2, 16, 0, 1e4f},
                                           QkvCase{6, 3, 24, 8, 1e7f}, QkvCase{3, 1, 10, 6, 1e4f},
                                           QkvCase{2, 1, 256, 64, 1e7f}, QkvCase{1, 1, 1024, 0, 1e6f}));

TEST(FusedQkvNormRopeDeath, MisshapedFusedInputIsAnInternalError) {
  const int64_t T = 3, nh = 4, nkv = 2, hd = 8;
  std::vector<float> qkv(T * (nh + 2 * nkv) * hd + hd), q(T * nh * hd), k(T * nkv * hd), v(T * nkv * hd), w(hd, 1.f);
  std::vector<int32_t> pos(T, 0);
  // One head too wide: a fused row that is not q|k|v of these shapes.
  EXPECT_EXIT(ops::qkv_norm_rope_forward(kCpu, cpu_view(q.data(), {T, nh, hd}), cpu_view(k.data(), {T, nkv, hd}),
                                         cpu_view(v.data(), {T, nkv, hd}),
                                         cpu_view(qkv.data(), {T, (nh + 2 * nkv) * hd + hd / T}),
                                         cpu_view(w.data(), {hd}), cpu_view(w.data(), {hd}), cpu_view(pos.data(), {T}),
                                         ops::RopeSpec{}, 1e-6f),
              testing::ExitedWithCode(9), "qkv_norm_rope_forward: argument 'qkv' has shape");
  // An output inside the input: the op would overwrite heads it has not read yet.
  EXPECT_EXIT(ops::qkv_norm_rope_forward(kCpu, cpu_view(qkv.data(), {T, nh, hd}), cpu_view(k.data(), {T, nkv, hd}),
                                         cpu_view(v.data(), {T, nkv, hd}), cpu_view(qkv.data(), {T, (nh + 2 * nkv) * hd}),
                                         cpu_view(w.data(), {hd}), cpu_view(w.data(), {hd}), cpu_view(pos.data(), {T}),
                                         ops::RopeSpec{}, 1e-6f),
              testing::ExitedWithCode(9), "must not overlap qkv");
}

TEST(FusedSwiglu, EqualsSwigluOnTheTwoHalves) {
  for (const int64_t I : {int64_t(1), int64_t(19), int64_t(64)}) {
    const int64_t N = 7;
    auto gate_up = random_vec(N * 2 * I, 24, 3.0f);
    std::vector<float> gate(N * I), up(N * I);
    for (int64_t n = 0; n < N; ++n) {
      std::memcpy(&gate[n * I], &gate_up[n * 2 * I], I * sizeof(float));
      std::memcpy(&up[n * I], &gate_up[n * 2 * I + I], I * sizeof(float));
    }
    std::vector<float> want(N * I), out(N * I, 123.f);
    ops::swiglu_forward(kCpu, cpu_view(want.data(), {N, I}), cpu_view(gate.data(), {N, I}), cpu_view(up.data(), {N, I}));
    ops::swiglu_fused_forward(kCpu, cpu_view(out.data(), {N, I}), cpu_view(gate_up.data(), {N, 2 * I}));
    EXPECT_EQ(out, want) << "I=" << I;
  }
}

TEST(FusedSwigluDeath, WrongWidthOrOverlapIsAnInternalError) {
  const int64_t N = 4, I = 6;
  std::vector<float> gate_up(N * 2 * I + 8), out(N * I);
  EXPECT_EXIT(ops::swiglu_fused_forward(kCpu, cpu_view(out.data(), {N, I}), cpu_view(gate_up.data(), {N, 2 * I + 2})),
              testing::ExitedWithCode(9), "swiglu_fused_forward: argument 'gate_up' has shape");
  EXPECT_EXIT(ops::swiglu_fused_forward(kCpu, cpu_view(gate_up.data() + 8, {N, I}), cpu_view(gate_up.data(), {N, 2 * I})),
              testing::ExitedWithCode(9), "must not overlap gate_up");
}

}  // namespace
}  // namespace dflash
