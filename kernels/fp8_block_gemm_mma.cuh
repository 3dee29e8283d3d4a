// A hand-written block-scaled FP8 GEMM on the sm_89+ FP8 mma.sync (m16n8k32 e4m3, fp32 accumulators): the
// Block128 format's GEMM where cuBLASLt has none (its VEC128_32F scale modes are sm_90 only; sm_100 / sm_120
// offer MXFP8's power-of-two scales instead: docs/fp8.md "Which FP8 GEMM"). The scales are applied in the
// main loop, DeepGEMM's way: each 128-deep partial sum (one scale block) is accumulated on its own in fp32,
// then added to the output's accumulator times the activation row's and the weight row's scale of that block.
//
// Not chosen by default anywhere: on sm_90 cuBLASLt runs this format; on the RTX PRO 6000 (sm_120), where
// mma.sync is the tensor cores' only form, whether it beats the dequantized bf16 GEMM is to be measured
// (bench/README.md "What still waits for a GPU"). DFLASH_FP8_BLOCK_GEMM=mma selects it on any GPU of compute
// capability 8.9 or later (kernels/fp8_linear.cu), which is how an H100 tests it.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// out [N, O] BF16 (+)= sum over kb of (act_codes [N, 128 kb : 128 kb + 128] . w_codes [O, same]^T)
//                       * act_scales [kb, n] * w_scales [kb, o]
// act_codes [N, K], w_codes [O, K] F8E4M3 (K % 128 == 0, rows 16-byte aligned); act_scales [K/128, N],
// w_scales [K/128, O] F32 (kb-major: ops::fp8_gemm_forward's Block128 layout). acc = Yes adds to out;
// residual (acc No) is read as C: out = residual + the product (residual may be out itself). Any N, O >= 1.
void fp8_block_gemm_mma(const Ctx& ctx, const Tensor& out, const Tensor& act_codes, const Tensor& act_scales,
                        const Tensor& w_codes, const Tensor& w_scales, ops::Accumulate acc, const Tensor& residual);

// The dynamic shared memory one block of it takes (two stages of a 128 x 128-byte tile of each operand).
size_t fp8_block_gemm_mma_smem_bytes();

}  // namespace dflash::cuda
