// What kernels/matmul.cu keeps per tuning class (for tests: tests/gpu/test_ops_gpu.cpp).
#pragma once
#include "dflash/backend.h"

namespace dflash::cuda {

// The GEMM plans ctx's backend holds: one per tuning class (matmul.cu, tuning_class) a GEMM was run in.
int matmul_plan_count(const Ctx& ctx);

}  // namespace dflash::cuda
