// The FP8 hidden-state wire's row quantizer on CUDA (docs/fp8.md "The FP8 wire"), also the per-token FP8
// GEMM's activation quantizer.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// in/out [N, H] BF16 (core/cuda_entry.h says why the signature is the op's own).
decltype(ops::fp8_rows_quantize) fp8_rows_quantize;
decltype(ops::fp8_rows_dequantize) fp8_rows_dequantize;

// The per-token quantization itself on ctx's stream, for the other kernels that quantize rows
// (kernels/fp8_linear.cu, kernels/rmsnorm.cu's wide rows): codes [N, H] (e4m3), scales [N] (F32), in [N, H]
// (BF16), all device pointers. Launches and checks the launch.
void launch_rows_quantize(const Ctx& ctx, void* codes, float* scales, const void* in, int64_t N, int64_t H);

}  // namespace dflash::cuda
