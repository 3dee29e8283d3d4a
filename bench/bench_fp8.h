// The forward benches' FP8 linears (--fp8): random e4m3 weights with per-(row, 128 input channels) scales on
// the device, and the one activation scratch every linear of a forward reuses, so a bench's linear runs as
// src/model/decoder_stack.cpp runs an LinearMode::Fp8Gemm one: ops::fp8_linear_forward (the activation
// quantization kernel + cuBLASLt's block-scaled FP8 GEMM, sm_90 only; docs/fp8.md).
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/fp8.h"
#include "dflash/ops.h"

namespace dflash::bench {

// A linear W [out, in] as e4m3 codes and kb-major scales [in / 128, out].
struct Fp8Linear {
  Buffer codes, scales;
};

// Random weights of about N(0, sigma): codes of N(0, 64) (e4m3's normal range) times scale sigma / 64. The
// values do not change the GEMM's time; one host pattern of the largest size serves every weight.
class Fp8Weights {
 public:
  Fp8Linear make(const Ctx& ctx, int64_t out, int64_t in, float sigma, uint32_t seed) {
    DF_CHECK_HINT(in % fp8::kBlock == 0 && out % 16 == 0, BadOptions,
                  "--fp8: a linear [" << out << ", " << in << "] is not a shape the FP8 GEMM takes (in % 128, out % 16)",
                  "use a model whose linears are multiples of 128 wide");
    const size_t n = static_cast<size_t>(out * in);
    if (pattern_.size() < n) {
      std::mt19937 rng(seed);
      std::normal_distribution<float> nd(0.f, 64.f);
      pattern_.resize(n);
      for (uint8_t& c : pattern_) c = fp8::e4m3_from_f32_sat(nd(rng));
    }
    Fp8Linear w{Buffer(ctx.device, DType::F8E4M3, {out, in}), Buffer(ctx.device, DType::F32, {in / fp8::kBlock, out})};
    copy_tensor(ctx, w.codes, Tensor(pattern_.data(), DType::F8E4M3, Device::CPU, {out, in}));
    std::vector<float> scales(static_cast<size_t>(in / fp8::kBlock * out), sigma / 64.f);
    copy_tensor(ctx, w.scales, Tensor(scales.data(), DType::F32, Device::CPU, {in / fp8::kBlock, out}));
    synchronize(ctx);
    return w;
  }

 private:
  std::vector<uint8_t> pattern_;
};

// The activation codes and scales of the widest linear input, for max_tokens tokens (a multiple of 16).
class Fp8Scratch {
 public:
  Fp8Scratch() = default;
  Fp8Scratch(const Ctx& ctx, int64_t max_tokens, int64_t widest_in)
      : codes_(ctx.device, DType::F8E4M3, {max_tokens * widest_in}),
        scales_(ctx.device, DType::F32, {max_tokens * (widest_in / fp8::kBlock)}) {}
  // out [T, O] = (residual or, with acc, out) + in [T, K] W^T.
  void linear(const Ctx& ctx, const Tensor& out, const Tensor& in, const Fp8Linear& w,
              ops::Accumulate acc = ops::Accumulate::No, const Tensor& residual = Tensor()) const {
    linear(ctx, out, in, w.codes, w.scales, acc, residual);
  }
  void linear(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& w_codes, const Tensor& w_scales,
              ops::Accumulate acc = ops::Accumulate::No, const Tensor& residual = Tensor()) const {
    const int64_t T = in.size(0), K = in.size(1);
    DF_CHECK_HINT(T % 16 == 0, BadOptions, "--fp8: T = " << T << " tokens; the FP8 GEMM takes multiples of 16",
                  "use --seqlens that sum to a multiple of 16");
    const Tensor c = codes_.t().slice_rows(0, T * K).reshape({T, K});
    const Tensor s = scales_.t().slice_rows(0, T * (K / fp8::kBlock)).reshape({K / fp8::kBlock, T});
    ops::fp8_linear_forward(ctx, out, in, w_codes, w_scales, c, s, acc, residual);
  }

 private:
  Buffer codes_, scales_;
};

}  // namespace dflash::bench
