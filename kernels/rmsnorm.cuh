// RMSNorm over rows.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// out [N, C] (BF16) = in [N, C] (BF16) * rstd * w [C] (BF16); rstd [N] (F32) may be empty.
decltype(ops::rmsnorm_forward) rmsnorm_forward;

// rmsnorm_forward (no rstd) + the per-token e4m3 quantization of its bf16 output in one pass (C <= 8192;
// wider rows run the two kernels, out required there).
decltype(ops::rmsnorm_fp8_forward) rmsnorm_fp8_forward;

}  // namespace dflash::cuda
