// The forward benches' FP8 linears (--fp8): random e4m3 weights with per-(row, 128 input channels) scales on
// the device, and the one scratch every linear of a forward reuses, so a bench's linear runs as
// src/model/decoder_stack.cpp runs an FP8 one: LinearMode::Fp8Gemm, ops::fp8_linear_forward (the activation
// quantization kernel + cuBLASLt's block-scaled FP8 GEMM, sm_90 only), or LinearMode::Fp8Dequant, the weight
// dequantized into one bf16 scratch + the activation qdq + the bf16 GEMM (every other GPU; docs/fp8.md).
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/fp8.h"
#include "dflash/ops.h"
#include "matmul_plans.cuh"         // cuda::fp8_plan_count
#include "model/decoder_weights.h"  // fp8_linear_choice

namespace dflash::bench {

// Which of the two an FP8 target would run on this GPU: the GEMM where the GPU has it, else dequantize;
// DFLASH_FP8_LINEAR as the target reads it (fp8_linear_choice: dequant forces Dequant, gemm refuses a GPU
// without the GEMM, emulate has no --fp8 of its own: the bf16 run is its speed). ctx null (--dry-run): from
// the variable alone.
enum class Fp8Path : uint8_t { Gemm, Dequant };

// --fp8-token-quant (per-token GEMMs on the GEMM path): Fused, as DecoderStackTarget runs them (the norms write
// x's codes beside x, the SwiGLU only down_proj's codes; docs/fp8.md "Per-token activations, quantized once");
// PerLinear, each linear quantizing its own input (the earlier sequence, for the A/B on one machine).
enum class TokenQuant : uint8_t { Fused, PerLinear };

// Takes `--fp8-token-quant fused|per-linear` at argv[i] (advancing i); false if argv[i] is another option.
inline bool parse_token_quant_option(int argc, char** argv, int& i, TokenQuant& q) {
  if (std::string(argv[i]) != "--fp8-token-quant" || i + 1 >= argc) return false;
  const std::string v = argv[++i];
  DF_CHECK(v == "fused" || v == "per-linear", BadOptions, "--fp8-token-quant must be fused or per-linear, got '" << v << "'");
  q = v == "fused" ? TokenQuant::Fused : TokenQuant::PerLinear;
  return true;
}
inline Fp8Path fp8_path(const Ctx* ctx, ops::Fp8Scaling scaling = ops::Fp8Scaling::Block128) {
  const Fp8LinearChoice c = fp8_linear_choice();
  DF_CHECK_HINT(c != Fp8LinearChoice::Emulate, BadOptions, "--fp8 with DFLASH_FP8_LINEAR=emulate",
                "the emulation runs at the bf16 run's speed: drop --fp8, or set DFLASH_FP8_LINEAR=gemm|dequant");
  if (c == Fp8LinearChoice::Dequant) return Fp8Path::Dequant;
  const bool token = scaling == ops::Fp8Scaling::TokenChannel;
  const bool gemm =
      ctx == nullptr || (token ? ops::fp8_token_gemm_available(*ctx) : ops::fp8_block_gemm_available(*ctx));
  DF_CHECK_HINT(gemm || c != Fp8LinearChoice::Gemm, DeviceFailure,
                "--fp8 with DFLASH_FP8_LINEAR=gemm: this GPU has no "
                    << (token ? "per-token x per-channel FP8 GEMM (cuBLASLt's OUTER_VEC_32F)"
                              : "block-scaled FP8 GEMM (cuBLASLt's VEC128_32F scales: sm_90 only)"),
                "unset DFLASH_FP8_LINEAR: this GPU runs FP8 linears as dequantize + bf16 GEMM (docs/fp8.md)");
  return gemm ? Fp8Path::Gemm : Fp8Path::Dequant;
}
inline const char* fp8_path_name(Fp8Path p, ops::Fp8Scaling scaling = ops::Fp8Scaling::Block128) {
  if (p == Fp8Path::Dequant) return "dequantized per GEMM into one bf16 scratch";
  return scaling == ops::Fp8Scaling::TokenChannel ? "per-token x per-channel FP8 GEMMs" : "block-scaled FP8 GEMMs";
}

// The `# fp8 gemm plans:` metadata line of a forward bench on the GEMM path, after its timed forwards: how
// many FP8 GEMM plans the backend holds (kernels/fp8_linear.cu, one per token-count class x K x O x C read or
// not x operand alignments), each autotuned at its first call: in the warm-up forwards, or in the first timed
// one under --warmup 0.
inline std::string fp8_plans_meta(const Ctx& ctx, int warmup) {
  return std::to_string(cuda::fp8_plan_count(ctx)) + " (planned and autotuned at each class's first call: " +
         (warmup > 0 ? "in the warm-up" : "in the first timed forward, --warmup 0") +
         "; DFLASH_GEMM_AUTOTUNE=0 keeps cuBLASLt's first choice)";
}

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

// Gemm: the activation codes and scales of the widest linear input, for max_tokens tokens (a multiple of 16).
// Dequant: the widest input's quantized -> dequantized values, and the largest weight (out x in) in bf16.
class Fp8Scratch {
 public:
  Fp8Scratch() = default;
  Fp8Scratch(const Ctx& ctx, Fp8Path path, int64_t max_tokens, int64_t widest_in, int64_t largest_weight,
             ops::Fp8Scaling scaling = ops::Fp8Scaling::Block128)
      : path_(path), scaling_(scaling) {
    if (path == Fp8Path::Gemm) {
      codes_ = Buffer(ctx.device, DType::F8E4M3, {max_tokens * widest_in});
      scales_ = Buffer(ctx.device, DType::F32, {max_tokens * (widest_in / fp8::kBlock)});
    } else {
      qdq_ = Buffer(ctx.device, DType::BF16, {max_tokens * widest_in});
      weight_ = Buffer(ctx.device, DType::BF16, {largest_weight});
    }
  }
  // The bytes such a scratch takes.
  static size_t bytes(Fp8Path path, int64_t max_tokens, int64_t widest_in, int64_t largest_weight) {
    return static_cast<size_t>(path == Fp8Path::Gemm ? max_tokens * widest_in + 4 * max_tokens * (widest_in / fp8::kBlock)
                                                     : 2 * max_tokens * widest_in + 2 * largest_weight);
  }
  // out [T, O] = (residual or, with acc, out) + in [T, K] W^T.
  void linear(const Ctx& ctx, const Tensor& out, const Tensor& in, const Fp8Linear& w,
              ops::Accumulate acc = ops::Accumulate::No, const Tensor& residual = Tensor()) const {
    linear(ctx, out, in, w.codes, w.scales, acc, residual);
  }
  void linear(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& w_codes, const Tensor& w_scales,
              ops::Accumulate acc = ops::Accumulate::No, const Tensor& residual = Tensor()) const {
    const int64_t T = in.size(0), K = in.size(1);
    // TokenChannel: one activation scale per token, and the weights' first scale row (a channel's scale
    // repeated over the groups, as Fp8Weights makes them and the loader stores channel scales)
    const bool token = scaling_ == ops::Fp8Scaling::TokenChannel;
    if (path_ == Fp8Path::Dequant) {  // DecoderStackTarget::linear_weight_values + linear_input
      const int64_t O = w_codes.size(0);
      const Tensor w = weight_.t().slice_rows(0, O * K).reshape({O, K}), x = qdq_.t().slice_rows(0, T * K).reshape({T, K});
      ops::fp8_weight_dequantize(ctx, w, w_codes, w_scales);
      ops::fp8_activation_qdq(ctx, x, in, token ? K : fp8::kBlock);
      if (!residual.empty()) return ops::matmul_residual_forward(ctx, out, x, w, residual);
      return ops::matmul_forward(ctx, out, x, w, acc);
    }
    DF_CHECK_HINT(T % 16 == 0, BadOptions, "--fp8: T = " << T << " tokens; the FP8 GEMM takes multiples of 16",
                  "use --seqlens that sum to a multiple of 16");
    const int64_t KB = token ? 1 : K / fp8::kBlock;
    const Tensor c = codes_.t().slice_rows(0, T * K).reshape({T, K});
    const Tensor s = scales_.t().slice_rows(0, T * KB).reshape({KB, T});
    ops::fp8_linear_forward(ctx, out, in, w_codes, w_scales.slice_rows(0, KB), c, s, acc, residual, scaling_);
  }
  // The Gemm path's codes [T, K] and per-token scales [T], for a producer that quantizes an input once (the
  // SwiGLU's codes for down_proj live here, as DecoderStackTarget keeps them in its one FP8 activation scratch).
  Tensor token_codes(int64_t T, int64_t K) const { return codes_.t().slice_rows(0, T * K).reshape({T, K}); }
  Tensor token_scales(int64_t T) const { return scales_.t().slice_rows(0, T); }
  // out [T, O] = (residual or, with acc, out) + dequant(codes [T, K], scales [T]) W^T: a per-token GEMM over an
  // input quantized once by its producer (ops::fp8_gemm_forward, as DecoderStackTarget::fp8_token_gemm runs
  // it). The weights' first scale row is the channels'.
  void token_gemm(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales, const Fp8Linear& w,
                  ops::Accumulate acc = ops::Accumulate::No, const Tensor& residual = Tensor()) const {
    token_gemm(ctx, out, codes, scales, w.codes, w.scales, acc, residual);
  }
  void token_gemm(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales, const Tensor& w_codes,
                  const Tensor& w_scales, ops::Accumulate acc = ops::Accumulate::No,
                  const Tensor& residual = Tensor()) const {
    const int64_t T = codes.size(0);
    DF_CHECK_HINT(T % 16 == 0, BadOptions, "--fp8: T = " << T << " tokens; the FP8 GEMM takes multiples of 16",
                  "use --seqlens that sum to a multiple of 16");
    ops::fp8_gemm_forward(ctx, out, codes, scales.reshape({1, T}), w_codes, w_scales.slice_rows(0, 1), acc, residual,
                          ops::Fp8Scaling::TokenChannel);
  }

 private:
  Fp8Path path_ = Fp8Path::Gemm;
  ops::Fp8Scaling scaling_ = ops::Fp8Scaling::Block128;
  Buffer codes_, scales_, qdq_, weight_;
};

}  // namespace dflash::bench
