// The FP8 hidden-state wire's row quantizer on CUDA (docs/fp8.md "The FP8 wire").
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// in/out [N, H] BF16 (core/cuda_entry.h says why the signature is the op's own).
decltype(ops::fp8_rows_quantize) fp8_rows_quantize;
decltype(ops::fp8_rows_dequantize) fp8_rows_dequantize;

}  // namespace dflash::cuda
