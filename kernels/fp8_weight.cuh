// An FP8 linear's weight dequantized for an ordinary GEMM on CUDA (LinearMode::Fp8Dequant, docs/fp8.md).
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// out [O, K] BF16 or F32 (core/cuda_entry.h says why the signature is the op's own).
decltype(ops::fp8_weight_dequantize) fp8_weight_dequantize;

}  // namespace dflash::cuda
