// ops::fp8_weight_dequantize on CUDA (LinearMode::Fp8Dequant, docs/fp8.md "How a target's FP8 linears run")
// against its CPU twin on random codes and scales. Tolerance: none, bit for bit. Each value is one IEEE
// fp32 multiply of an e4m3 code's exact value by its float32 scale (__fmul_rn on the device, the host's
// float multiply), so the F32 output equals the CPU twin's exactly, and the BF16 output is that product
// rounded once to nearest even (__float2bfloat16_rn = the host's f32_to_bf16). Shapes: one whose K divides
// neither 128 nor 8 (the one-code-per-thread kernel), the 8B and 27B MLP widths (the 8-code vector kernel),
// and codes at an address not 8-byte aligned (back to the scalar kernel).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dflash/fp8.h"
#include "dflash/ops.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::gpu;
using test::to_host;

struct Case {
  int64_t O, K;
  size_t code_offset;  // bytes the codes start past an aligned allocation
};

TEST(GpuFp8WeightDequantize, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const Ctx g = gpu();
  for (const Case& c : {Case{300, 201, 0}, Case{2 * 12288, 4096, 0}, Case{5120, 17408, 0}, Case{512, 1024, 3}}) {
    SCOPED_TRACE(testing::Message() << c.O << " x " << c.K << ", codes offset " << c.code_offset);
    const int64_t O = c.O, K = c.K, KB = fp8::blocks(K, fp8::kBlock);
    std::mt19937 rng(static_cast<uint32_t>(O + K));
    std::vector<uint8_t> codes(static_cast<size_t>(O * K));
    for (uint8_t& q : codes) {
      q = static_cast<uint8_t>(rng());
      if ((q & 0x7F) == 0x7F) q ^= 1;  // no NaN code (the loader refuses them)
    }
    std::uniform_real_distribution<float> log2s(-14.f, 1.f);
    std::vector<float> scales(static_cast<size_t>(KB * O));
    for (float& s : scales) s = std::exp2(log2s(rng)) * 1.29f;
    std::vector<float> want(codes.size());
    ops::fp8_weight_dequantize(cpu_ctx(), cpu_view(want.data(), {O, K}),
                               Tensor(codes.data(), DType::F8E4M3, Device::CPU, {O, K}),
                               cpu_view(scales.data(), {KB, O}));

    Buffer code_buf(Device::CUDA, DType::U8, {O * K + 8}), scale_buf(Device::CUDA, DType::F32, {KB, O});
    const Tensor d_codes(static_cast<uint8_t*>(code_buf.t().data) + c.code_offset, DType::F8E4M3, Device::CUDA, {O, K});
    cudaMemcpy(d_codes.data, codes.data(), codes.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(scale_buf.t().data, scales.data(), scales.size() * 4, cudaMemcpyHostToDevice);
    for (DType out_dtype : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(dtype_name(out_dtype));
      Buffer out(Device::CUDA, out_dtype, {O, K});
      cudaMemset(out.t().data, 0xff, out.t().nbytes());  // NaN: every element must be written
      ops::fp8_weight_dequantize(g, out, d_codes, scale_buf);
      synchronize(g);
      const std::vector<float> got = to_host(g, out);
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const float w = out_dtype == DType::F32 ? want[i] : bf16_to_f32(f32_to_bf16(want[i]));
        if (!(got[i] == w) && bad++ == 0) first = i;
      }
      EXPECT_EQ(bad, 0u) << "first at " << first << ": " << got[first] << " vs " << want[first];
    }
  }
}

}  // namespace
}  // namespace dflash
