// The op layer: plain forward/backward functions over Tensor views, dispatched on ctx.device.
//
// CPU (float32) implementations live in src/ops/<op>.cpp and are the reference; CUDA twins live in
// kernels/<op>.cu(h) and are compared against them in tests/gpu. Shapes are given per argument.
// Conventions:
//   - Linear layers use the torch layout: W [out, in], y = x W^T.
//   - "_backward" functions ACCUMULATE into weight gradients (dW += ...) and OVERWRITE input
//     gradients (dx = ...) unless the argument says otherwise.
//   - Shape products are size_t; counts are int64_t.
#pragma once
#include "dflash/tensor.h"

namespace dflash::ops {

// ---- linear algebra ---------------------------------------------------------------------------
// out [N, O] = in [N, I] · W[O, I]^T  (+ out when accumulate == Accumulate::Yes)
enum class Accumulate : uint8_t { No, Yes };
void matmul_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& W,
                    Accumulate acc = Accumulate::No);
// out [N, O] = residual [N, O] + in [N, I] · W[O, I]^T, residual either out itself or not overlapping it.
// A decoder layer's output projection: on CUDA the add happens in the GEMM's fp32 epilogue (one bf16
// rounding, no separate pass over the residual stream).
void matmul_residual_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& W,
                             const Tensor& residual);
// din [N, I] = dout [N, O] · W [O, I]      (overwritten; skipped when din is empty)
// dW  [O, I] += dout^T [O, N] · in [N, I]  (accumulated; skipped when dW is empty)
void matmul_backward(const Ctx& ctx, const Tensor& din, const Tensor& dW, const Tensor& dout, const Tensor& in,
                     const Tensor& W);

// ---- FP8 linears (docs/fp8.md, the host arithmetic in dflash/fp8.h) -----------------------------------
// out [N, K] = dequantize(quantize(in [N, K])): each row's groups of `group` input channels (the last one
// may be partial) scaled by amax / 448 and rounded to e4m3 (round to nearest even), then multiplied back:
// the input an FP8 linear's GEMM sees. group = 128 for the fine-grained format, K for one scale per token.
// out may alias in.
void fp8_activation_qdq(const Ctx& ctx, const Tensor& out, const Tensor& in, int64_t group);
// The FP8 linear: out [N, O] (+)= fp8(in [N, K]) · w^T with
//   w = w_codes [O, K] (F8E4M3) * w_scales [KB, O] (F32, KB = ceil(K/128); scale of output row o for input
//       channels [128 kb, 128 kb + 128), stored kb-major: a 128x128 block scale repeated over its rows, or a
//       channel scale repeated over the groups -- cuBLASLt's VEC128_32F layout),
//   in quantized per token in groups of 128 into act_codes [N, K] (F8E4M3) and act_scales [KB, N] (F32),
//   both written (scratch the caller owns). CPU: fp32 in/out, the host arithmetic, act_* bit-exact with
//   CUDA's. CUDA: BF16 in/out, the activation quantization kernel + cuBLASLt's block-scaled FP8 GEMM (sm_90
//   only: VEC128_32F x VEC128_32F; K % 128 == 0, O % 16 == 0, N % 16 == 0 there; elsewhere DeviceFailure), or
//   with DFLASH_FP8_BLOCK_GEMM=mma the project's mma.sync kernel (sm_89 and later; K % 128 == 0).
// residual (optional, [N, O], acc must be No): out = residual + the product, residual either out itself or
// not overlapping it (a decoder layer's output projection; on CUDA the GEMM's C operand, beta = 1).
// scaling = TokenChannel (compressed-tensors FP8-Dynamic: one scale per output channel, one per token):
// w_scales [1, O] (a channel scale each), in quantized per token (one group of K) into act_codes [N, K] and
// act_scales [1, N]; on CUDA cuBLASLt's FP8 GEMM with OUTER_VEC_32F scales on both operands (where
// fp8_token_gemm_available; K % 16 == 0 there), the scales applied to the fp32 sums once.
enum class Fp8Scaling : uint8_t { Block128, TokenChannel };
void fp8_linear_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& w_codes,
                        const Tensor& w_scales, const Tensor& act_codes, const Tensor& act_scales,
                        Accumulate acc = Accumulate::No, const Tensor& residual = Tensor(),
                        Fp8Scaling scaling = Fp8Scaling::Block128);
// fp8_linear_forward's GEMM alone, over activations already quantized: out [N, O] (+)= dequant(act_codes
// [N, K], act_scales [KB, N]) · w^T, every other operand and the devices as fp8_linear_forward (which is
// this after quantizing `in` into act_codes / act_scales). Lets linears that share an input quantize it
// once (fp8_rows_quantize: a TokenChannel GEMM's act_scales [1, N] are its scales [N]), or take it from a
// fused producer (rmsnorm_fp8_forward, swiglu_fp8_forward). CPU: out F32.
void fp8_gemm_forward(const Ctx& ctx, const Tensor& out, const Tensor& act_codes, const Tensor& act_scales,
                      const Tensor& w_codes, const Tensor& w_scales, Accumulate acc = Accumulate::No,
                      const Tensor& residual = Tensor(), Fp8Scaling scaling = Fp8Scaling::Block128);
// An FP8 linear's weight, dequantized for an ordinary GEMM (LinearMode::Fp8Dequant, docs/fp8.md): out [O, K]
// = e4m3_to_f32(codes [O, K] (F8E4M3)) * scales [KB, O] (F32, kb-major, KB = ceil(K/128): the layout of
// fp8_linear_forward's w_scales), one fp32 multiply rounded once to out's dtype: the values the loader's
// host dequantization (fp8::dequantize_weight_blocks / _channels) gives, bit for bit. CPU: out F32. CUDA:
// out BF16 or F32.
void fp8_weight_dequantize(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales);
// Whether ctx's device runs fp8_linear_forward: a CUDA device of compute capability 9.0 whose cuBLASLt
// offers the VEC128_32F block-scaled FP8 GEMM (asked once per device, then remembered), or with
// DFLASH_FP8_BLOCK_GEMM=mma any of compute capability 8.9 or later (the project's mma.sync kernel,
// docs/fp8.md "Which FP8 GEMM"). False on the CPU backend (it runs the op as the host twin, a reference, not
// a fast path) and on every other GPU.
bool fp8_block_gemm_available(const Ctx& ctx);
// Whether ctx's device runs fp8_linear_forward with Fp8Scaling::TokenChannel: a CUDA device of compute
// capability 8.9 or later whose cuBLASLt offers an FP8 GEMM with OUTER_VEC_32F scales (asked once per
// device, then remembered). False on the CPU backend.
bool fp8_token_gemm_available(const Ctx& ctx);

// The FP8 hidden-state wire (--hs-dtype fp8, docs/fp8.md "The FP8 wire"): one float32 scale per row, as
// speculators' FP8 connector. fp8_rows_quantize: codes [N, H] (F8E4M3) = e4m3(in / s) and scales [N] (F32)
// = s = amax(|in row|) / 448 (0 and codes 0 for an all-zero row), in [N, H] of the backend's dtype; the host
// arithmetic is fp8::quantize_activation_groups with one group per row, bit-exact on CUDA.
// fp8_rows_dequantize: out [N, H] (the backend's dtype) = e4m3_to_f32(codes) * scales[row], computed in
// fp32 and rounded once to out's dtype (fp8::dequantize_weight_channels on the host).
void fp8_rows_quantize(const Ctx& ctx, const Tensor& codes, const Tensor& scales, const Tensor& in);
void fp8_rows_dequantize(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales);

// ---- embedding --------------------------------------------------------------------------------
// out [T, H] = table [V, H] rows at tokens [T] (I32). An id outside [0, V) is a BadInput error.
void embedding_forward(const Ctx& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table);

// ---- RMSNorm ----------------------------------------------------------------------------------
// out [N, C] = in * rstd * w,  rstd [N] = 1/sqrt(mean(in^2) + eps)  (rstd saved for backward)
void rmsnorm_forward(const Ctx& ctx, const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& w,
                     float eps);
// rmsnorm_forward and fp8_rows_quantize of its output in one pass (forward only, no rstd): out [N, C] as
// rmsnorm_forward's (may be empty: not written), codes [N, C] (F8E4M3) and scales [N] (F32) the per-token
// quantization of that output, bit for bit what fp8_rows_quantize(rmsnorm_forward(in)) writes (on CUDA: of
// the bf16-rounded output). The input of per-token FP8 GEMMs (fp8_gemm_forward) after a layer norm.
// out may be empty only for C <= kRmsNormFp8CodesOnlyWidth (CUDA runs wider rows as the norm into out, then
// the row quantizer).
constexpr int64_t kRmsNormFp8CodesOnlyWidth = 8192;
void rmsnorm_fp8_forward(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales,
                         const Tensor& in, const Tensor& w, float eps);
// din [N, C] (overwritten), dw [C] (accumulated). [CPU only]
void rmsnorm_backward(const Ctx& ctx, const Tensor& din, const Tensor& dw, const Tensor& dout, const Tensor& in,
                      const Tensor& w, const Tensor& rstd);

// ---- per-head norm + rotary embedding -----------------------------------------------------------
// Qwen3 QK-norm then neox RoPE, per head:
//   y = rmsnorm(x[n, h, :]) * w;  out[n, h, :] = rope(y, pos[n])
// out/in [N, nh, hd] (out may alias in), rstd [N, nh] (saved for backward; may be empty), w [hd], pos [N] (I32).
// rotary_dim <= hd (partial RoPE rotates the first rotary_dim dims, pairs (i, i + rotary_dim/2)),
// inv_freq[i] = theta^(-2i/rotary_dim).
struct RopeSpec {
  float theta = 1e6f;
  int rotary_dim = 0;  // 0 = head_dim
};
void head_norm_rope_forward(const Ctx& ctx, const Tensor& out, const Tensor& rstd, const Tensor& in,
                            const Tensor& w, const Tensor& pos, RopeSpec rope, float eps);
// din [N, nh, hd] (overwritten), dw [hd] (accumulated); in/rstd are the forward's input and rstd. [CPU only]
void head_norm_rope_backward(const Ctx& ctx, const Tensor& din, const Tensor& dw, const Tensor& dout,
                             const Tensor& in, const Tensor& w, const Tensor& rstd, const Tensor& pos,
                             RopeSpec rope, float eps);
// The target's attention input in one pass over one fused q|k|v GEMM's output (forward only):
//   qkv [T, (nh + 2 nkv) * hd], per token nh query heads, then nkv key heads, then nkv value heads;
//   q [T, nh, hd]  = head_norm_rope(query heads, q_norm [hd]);   k [T, nkv, hd] = head_norm_rope(key heads, k_norm [hd]);
//   v [T, nkv, hd] = the value heads, copied.
// nh, nkv, hd are read from q and k; pos [T] (I32), rope and eps as head_norm_rope_forward, which computes
// the same values (on the CPU bit for bit). q, k, v are contiguous and must not overlap qkv.
void qkv_norm_rope_forward(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qkv,
                           const Tensor& q_norm, const Tensor& k_norm, const Tensor& pos, RopeSpec rope, float eps);

// ---- SwiGLU ------------------------------------------------------------------------------------
// out [N, I] = silu(gate [N, I]) * up [N, I]  (out may alias gate or up)
void swiglu_forward(const Ctx& ctx, const Tensor& out, const Tensor& gate, const Tensor& up);
// The same over one fused gate|up GEMM's output: out [N, I] = silu(gate_up[:, :I]) * gate_up[:, I:],
// gate_up [N, 2I] (per row the I gate values, then the I up values). out must not overlap gate_up.
void swiglu_fused_forward(const Ctx& ctx, const Tensor& out, const Tensor& gate_up);
// swiglu_fused_forward and fp8_rows_quantize of its output in one pass: out [N, I] as swiglu_fused_forward's
// (may be empty: not written), codes [N, I] (F8E4M3) and scales [N] (F32) bit for bit what
// fp8_rows_quantize(swiglu_fused_forward(gate_up)) writes. The down projection's input when it runs as a
// per-token FP8 GEMM. CUDA: I % 8 == 0 and 16-byte aligned tensors (codes 8-byte aligned).
void swiglu_fp8_forward(const Ctx& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales,
                        const Tensor& gate_up);
// dgate, dup [N, I] (overwritten). [CPU only]
void swiglu_backward(const Ctx& ctx, const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                     const Tensor& gate, const Tensor& up);

// ---- attention (target): causal within each packed sequence, GQA ---------------------------------
// out [T, nh, hd]; q [T, nh, hd]; k, v [T, nkv, hd]; cu_seqlens [nseq + 1] (I32, host memory on CPU,
// device memory on CUDA); scale usually hd^-0.5. nh must be a multiple of nkv.
void attention_varlen_causal_forward(const Ctx& ctx, const Tensor& out, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& cu_seqlens, float scale);

}  // namespace dflash::ops

// [CPU only], on a declaration above: a backward op without a CUDA twin behind the op layer. On the CUDA
// backend it is fatal (BadOptions, exit 2: detail::cuda_op_missing in src/ops/op_checks.h); the CUDA drafter
// step calls its kernels (cuda::rmsnorm_backward etc., src/drafter/cuda/drafter_backward.cuh) directly instead.
// Today: rmsnorm_backward, head_norm_rope_backward, swiglu_backward.
