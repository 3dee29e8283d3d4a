// Shared plumbing of the drafter's CUDA kernels (block attention, lm_loss, AdamW): a cuBLAS handle per
// device for strided-batched GEMMs with explicit leading dimensions (what per-head attention products and
// in-place bf16 gradients inside an fp32 logits workspace need), and grow-only scratch buffers.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "dflash/tensor.h"

namespace dflash::cuda {

// The cuBLAS handle of ctx's device, bound to ctx's stream.
cublasHandle_t blas_of(const Ctx& ctx);

// Column-major C[m, n] (ldc) = alpha · op(A) · op(B) + beta · C, `batch` times with element strides
// sa/sb/sc between consecutive problems. A and B are bf16; C is bf16 or fp32 (c_f32); fp32 accumulation.
struct GemmOperand {
  const void* ptr;
  int64_t ld;
  int64_t stride;
};
void gemm_bf16(const Ctx& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               GemmOperand A, GemmOperand B, float beta, void* C, bool c_f32, int64_t ldc, int64_t sc,
               int64_t batch = 1);

// Scratch slots of the drafter kernels. Each slot grows to the largest size asked for and is never shrunk:
// after the first training step no allocation happens. Growing synchronizes the device (cudaFree).
enum class ScratchSlot : int { AttnScores, AttnProbs, AttnOut32, AttnDq32, AttnDkv32, AttnRowStats, LossStats,
                               OptimNorm, Count };
void* scratch(const Ctx& ctx, ScratchSlot slot, size_t bytes);
// Bytes currently held by all scratch slots of ctx's device (memory reports).
size_t scratch_bytes(const Ctx& ctx);

}  // namespace dflash::cuda
