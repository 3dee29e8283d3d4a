// The FP8 hidden-state wire's row quantizer on CUDA against its CPU twin (docs/fp8.md "The FP8 wire") on
// random BF16 data (the CPU twin sees the same bf16 values as float32): the codes bit for bit and the scales
// exactly (IEEE division on both sides, the hardware's saturating RNE conversion = the host's), and the
// dequantized values exactly: the GPU's bf16 output is the CPU twin's float32 product rounded once to bf16.
// Rows of the 8B and 27B widths, a width not a multiple of 32, an all-zero row, rows of very different
// magnitudes; then HsCodec's encode -> decode through an fp8 HsBatch on the device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "dflash/hs_batch.h"
#include "dflash/hs_wire.h"
#include "dflash/ops.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::gpu;
using test::random_bf16;
using test::to_device;
using test::to_host;
const Ctx kCpu = cpu_ctx();

std::vector<float> test_rows(int64_t N, int64_t H, uint32_t seed) {
  std::vector<float> x = random_bf16(static_cast<size_t>(N * H), seed, 2.f);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < H; ++c) x[r * H + c] = bf16_to_f32(f32_to_bf16(x[r * H + c] * std::exp2(float(r % 11) - 5.f)));
  for (int64_t c = 0; c < H; ++c) x[c] = 0.f;  // row 0: all zero (scale 0, codes 0, no NaN)
  return x;
}

float bf16_round(float v) { return bf16_to_f32(f32_to_bf16(v)); }

TEST(GpuFp8Rows, QuantizeAndDequantizeMatchCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  for (const auto& [N, H] : {std::pair<int64_t, int64_t>{9, 100}, {257, 4096}, {64, 5120}}) {
    SCOPED_TRACE(testing::Message() << N << " rows x " << H);
    const std::vector<float> x = test_rows(N, H, static_cast<uint32_t>(N + H));
    std::vector<uint8_t> codes_cpu(static_cast<size_t>(N * H));
    std::vector<float> scales_cpu(static_cast<size_t>(N)), back_cpu(x.size());
    const Tensor c_cpu(codes_cpu.data(), DType::F8E4M3, Device::CPU, {N, H});
    ops::fp8_rows_quantize(kCpu, c_cpu, cpu_view(scales_cpu.data(), {N}), cpu_view(const_cast<float*>(x.data()), {N, H}));
    ops::fp8_rows_dequantize(kCpu, cpu_view(back_cpu.data(), {N, H}), c_cpu, cpu_view(scales_cpu.data(), {N}));

    Buffer in = to_device(g, x, {N, H}), out = to_device(g, {}, {N, H});
    Buffer codes(Device::CUDA, DType::F8E4M3, {N, H}), scales(Device::CUDA, DType::F32, {N});
    ops::fp8_rows_quantize(g, codes, scales, in);
    ops::fp8_rows_dequantize(g, out, codes, scales);
    std::vector<uint8_t> got_codes(codes_cpu.size());
    std::vector<float> got_scales(scales_cpu.size());
    cudaDeviceSynchronize();
    cudaMemcpy(got_codes.data(), codes.t().data, got_codes.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_scales.data(), scales.t().data, got_scales.size() * 4, cudaMemcpyDeviceToHost);
    EXPECT_EQ(got_scales, scales_cpu);
    EXPECT_EQ(got_codes, codes_cpu);
    EXPECT_EQ(got_scales[0], 0.f);
    const std::vector<float> back = to_host(g, out);
    for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], bf16_round(back_cpu[i])) << i;
  }
}

TEST(GpuFp8Rows, CodecRoundTripsAnFp8BatchOnTheDevice) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  SlotShape sh;
  sh.max_tokens = 64;
  sh.num_layers = 3;
  sh.hidden = 4096;
  sh.final_norm = true;
  sh.device = Device::CUDA;
  sh.dtype = DType::BF16;
  sh.wire = HsDType::Fp8;
  HsBatch b(sh);
  PackedBatch pb;
  const int64_t T = 50;
  pb.tokens.assign(T, 1);
  pb.loss_mask.assign(T, 1);
  pb.cu_seqlens = {0, static_cast<int32_t>(T)};
  b.fill_from(pb);
  HsCodec target(sh), drafter(sh);
  const HsValues into = target.forward_into(b);
  const std::vector<float> x = test_rows(3 * T, 4096, 1), n = test_rows(T, 4096, 2);
  copy_tensor(g, into.features, cpu_view(const_cast<float*>(x.data()), {3, T, 4096}));
  copy_tensor(g, into.final_norm, cpu_view(const_cast<float*>(n.data()), {T, 4096}));
  target.encode(g, b);
  const HsValues got = drafter.decode(g, b);  // the same batch: the planes move its bytes unchanged
  for (const auto& [values, ref, rows] : {std::tuple<Tensor, const std::vector<float>*, int64_t>{got.features, &x, 3 * T},
                                          {got.final_norm, &n, T}}) {
    std::vector<uint8_t> codes(ref->size());
    std::vector<float> scales(static_cast<size_t>(rows)), want(ref->size());
    const Tensor c(codes.data(), DType::F8E4M3, Device::CPU, {rows, 4096});
    ops::fp8_rows_quantize(kCpu, c, cpu_view(scales.data(), {rows}), cpu_view(const_cast<float*>(ref->data()), {rows, 4096}));
    ops::fp8_rows_dequantize(kCpu, cpu_view(want.data(), {rows, 4096}), c, cpu_view(scales.data(), {rows}));
    const std::vector<float> h = to_host(g, values);
    ASSERT_EQ(h.size(), want.size());
    for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(h[i], bf16_round(want[i])) << i;
  }
}

}  // namespace
}  // namespace dflash
