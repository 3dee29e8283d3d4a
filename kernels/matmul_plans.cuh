// What kernels/matmul.cu and kernels/fp8_linear.cu keep per tuning class (kernels/lt_plan.cuh), for tests
// (tests/gpu/test_ops_gpu.cpp, tests/gpu/test_fp8_linear_gpu.cpp) and the benches' metadata.
#pragma once
#include "dflash/backend.h"

namespace dflash::cuda {

// The bf16 GEMM plans ctx's backend holds: one per tuning class (lt_plan.cuh, tuning_class) a GEMM was run in.
int matmul_plan_count(const Ctx& ctx);

// The FP8 GEMM plans ctx's backend holds: one per token-count class, K, O, C read or not, operand alignments
// and scaling (fp8_linear.cu, Fp8Plan) an ops::fp8_linear_forward was run in.
int fp8_plan_count(const Ctx& ctx);

}  // namespace dflash::cuda
