// FP8 linears on CUDA (docs/fp8.md): the activation quantization and the block-scaled FP8 GEMM.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// in/out [N, K] BF16 (core/cuda_entry.h says why the signature is the op's own).
decltype(ops::fp8_activation_qdq) fp8_activation_qdq;

// in/out [N, K]/[N, O] BF16; sm_90 only (cuBLASLt's VEC128_32F scale mode), DeviceFailure elsewhere, unless
// DFLASH_FP8_BLOCK_GEMM=mma (fp8_block_gemm_mma.cuh: sm_89 and later).
decltype(ops::fp8_linear_forward) fp8_linear_forward;

// fp8_linear_forward's GEMM over already-quantized activations (out BF16).
decltype(ops::fp8_gemm_forward) fp8_gemm_forward;

// sm_90 and cuBLASLt has a VEC128_32F FP8 algorithm (asked once per device); with DFLASH_FP8_BLOCK_GEMM=mma,
// compute capability 8.9 or later.
decltype(ops::fp8_block_gemm_available) fp8_block_gemm_available;

// compute capability >= 8.9 and cuBLASLt has an OUTER_VEC_32F FP8 algorithm (asked once per device).
decltype(ops::fp8_token_gemm_available) fp8_token_gemm_available;

}  // namespace dflash::cuda
