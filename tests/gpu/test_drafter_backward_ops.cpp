// The drafter step's CUDA backward ops (src/drafter/cuda/drafter_backward.cu) against the float32 CPU twins in
// src/ops/: RMSNorm, QK-norm + RoPE (full and partial rotary), SwiGLU. Weight gradients accumulate onto a
// random prior, as the trainer's gradient buffer does.
#include <gtest/gtest.h>

#include <random>

#include "dflash/ops.h"
#include "drafter/cuda/drafter_backward.cuh"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::gpu;
using test::random_bf16;
using test::rel_err;
using test::to_device;
using test::to_host;

Buffer f32_device(const Ctx& g, const std::vector<float>& h) {
  Buffer b(Device::CUDA, DType::F32, {static_cast<int64_t>(h.size())});
  copy_tensor(g, b, cpu_view(h.data(), {static_cast<int64_t>(h.size())}));
  return b;
}

TEST(GpuDrafterBackwardOps, RmsNorm) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const Ctx cpu = cpu_ctx();
  for (int64_t C : {int64_t(192), int64_t(5120)}) {
    const int64_t N = 37;
    auto in = random_bf16(N * C, 1), w = random_bf16(C, 2), dout = random_bf16(N * C, 3);
    for (auto& x : w) x += 1.f;
    std::vector<float> out(N * C), rstd(N), din(N * C), dw = random_bf16(C, 4);
    auto dw0 = dw;
    ops::rmsnorm_forward(cpu, cpu_view(out.data(), {N, C}), cpu_view(rstd.data(), {N}), cpu_view(in.data(), {N, C}),
                         cpu_view(w.data(), {C}), 1e-6f);
    ops::rmsnorm_backward(cpu, cpu_view(din.data(), {N, C}), cpu_view(dw.data(), {C}), cpu_view(dout.data(), {N, C}),
                          cpu_view(in.data(), {N, C}), cpu_view(w.data(), {C}), cpu_view(rstd.data(), {N}));
    Buffer d_in = to_device(g, in, {N, C}), d_w = to_device(g, w, {C}), d_dout = to_device(g, dout, {N, C});
    Buffer d_din = to_device(g, {}, {N, C}), d_dw = f32_device(g, dw0), d_rstd = f32_device(g, rstd);
    cuda::rmsnorm_backward(g, d_din, d_dw, d_dout, d_in, d_w, d_rstd);
    EXPECT_LT(rel_err(to_host(g, d_din), din), test::tol::kOp) << "C=" << C;
    EXPECT_LT(rel_err(to_host(g, d_dw), dw), test::tol::kF32Output) << "C=" << C;
  }
}

TEST(GpuDrafterBackwardOps, HeadNormRope) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const Ctx cpu = cpu_ctx();
  const int64_t N = 29, nh = 6, hd = 128;
  for (int rot : {0, 32}) {
    ops::RopeSpec rope;
    rope.theta = 1e6f;
    rope.rotary_dim = rot;
    auto in = random_bf16(N * nh * hd, 5), w = random_bf16(hd, 6), dout = random_bf16(N * nh * hd, 7);
    std::vector<int32_t> pos(N);
    for (int64_t n = 0; n < N; ++n) pos[n] = static_cast<int32_t>(n * 97 % 3000);
    std::vector<float> out(in.size()), rstd(N * nh), din(in.size()), dw = random_bf16(hd, 8);
    auto dw0 = dw;
    ops::head_norm_rope_forward(cpu, cpu_view(out.data(), {N, nh, hd}), cpu_view(rstd.data(), {N, nh}),
                                cpu_view(in.data(), {N, nh, hd}), cpu_view(w.data(), {hd}), cpu_view(pos.data(), {N}),
                                rope, 1e-6f);
    ops::head_norm_rope_backward(cpu, cpu_view(din.data(), {N, nh, hd}), cpu_view(dw.data(), {hd}),
                                 cpu_view(dout.data(), {N, nh, hd}), cpu_view(in.data(), {N, nh, hd}),
                                 cpu_view(w.data(), {hd}), cpu_view(rstd.data(), {N, nh}), cpu_view(pos.data(), {N}),
                                 rope, 1e-6f);
    Buffer d_in = to_device(g, in, {N, nh, hd}), d_w = to_device(g, w, {hd}), d_dout = to_device(g, dout, {N, nh, hd});
    Buffer d_din = to_device(g, {}, {N, nh, hd}), d_dw = f32_device(g, dw0), d_pos = test::to_device_i32(g, pos);
    Buffer d_rstd(Device::CUDA, DType::F32, {N, nh});
    copy_tensor(g, d_rstd, cpu_view(rstd.data(), {N, nh}));
    cuda::head_norm_rope_backward(g, d_din, d_dw, d_dout, d_in, d_w, d_rstd, d_pos, rope, 1e-6f);
    EXPECT_LT(rel_err(to_host(g, d_din), din), test::tol::kOp) << "rotary_dim=" << rot;
    EXPECT_LT(rel_err(to_host(g, d_dw), dw), test::tol::kF32Output) << "rotary_dim=" << rot;
  }
}

TEST(GpuDrafterBackwardOps, SwiGlu) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const Ctx cpu = cpu_ctx();
  const int64_t N = 13, I = 301;  // numel not a multiple of 8: vector body + tail
  auto gate = random_bf16(N * I, 9), up = random_bf16(N * I, 10), dout = random_bf16(N * I, 11);
  std::vector<float> dg(N * I), du(N * I);
  ops::swiglu_backward(cpu, cpu_view(dg.data(), {N, I}), cpu_view(du.data(), {N, I}), cpu_view(dout.data(), {N, I}),
                       cpu_view(gate.data(), {N, I}), cpu_view(up.data(), {N, I}));
  // 16-byte aligned buffers of numel 3913: the vector path covers 3912, the tail kernel the last element.
  Buffer d_gate = to_device(g, gate, {N, I}), d_up = to_device(g, up, {N, I}), d_dout = to_device(g, dout, {N, I});
  Buffer d_dg = to_device(g, {}, {N, I}), d_du = to_device(g, {}, {N, I});
  cuda::swiglu_backward(g, d_dg, d_du, d_dout, d_gate, d_up);
  EXPECT_LT(rel_err(to_host(g, d_dg), dg), test::tol::kOp);
  EXPECT_LT(rel_err(to_host(g, d_du), du), test::tol::kOp);
}

}  // namespace
}  // namespace dflash
