// The CUDA backend behind a Ctx: device, stream, cuBLASLt handle and workspace, and a mapped flag
// through which kernels report bad input (a token id out of range) without a host sync.
// The CUDA library's own header (src/core/cuda/backend.cpp defines it); kernels/*.cu reach the backend
// through backend_of(ctx). Its entry points (backend_entry.cuh) reach code outside the library through the
// CUDA library's table (core/cuda_entry.h).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <tuple>

#include "backend_entry.cuh"
#include "core/cuda_entry.h"  // the ops' twins (kernels/<op>.cuh), which kernels/*.cu reach through here
#include "dflash/tensor.h"

namespace dflash::cuda {

// Kernel-reported errors, OR-ed into Backend::error_flags (host memory mapped into the device).
enum DeviceErrorBit : int { kBadTokenId = 1 };

struct MatmulPlan;  // cached cuBLASLt descriptors + algorithm for one tuning class of bf16 GEMMs (matmul.cu)
using MatmulKey = std::tuple<int, int, int, int, int, int, int, int, int, int>;
struct Fp8Plan;  // the same for the FP8 GEMMs (fp8_linear.cu: block-scaled and per-token x per-channel)
using Fp8Key = std::tuple<int, int, int, int, int, int>;

struct Backend {
  int device = 0;
  int sm_count = 0;  // multiprocessors of the device (queried: 132 on an H100/H200 SXM, 188 on an RTX PRO 6000)
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // cuBLASLt workspace, allocated once
  size_t workspace_bytes = 0;
  int* error_flags_host = nullptr;  // pinned, mapped
  int* error_flags_dev = nullptr;   // device alias of error_flags_host
  std::map<MatmulKey, MatmulPlan*> matmul_plans;
  std::map<Fp8Key, Fp8Plan*> fp8_plans;
  // Deterministic mode (set_deterministic): per-block partial sums, summed in block order afterwards.
  // Allocated with the backend when the mode is on: kDetScratchBlocksPerSm * sm_count * kDetScratchCols.
  float* det_scratch = nullptr;
  size_t det_scratch_floats = 0;
};
constexpr int kDetScratchBlocksPerSm = 4;  // the most partial-sum blocks a deterministic reduction uses, per SM
constexpr int kDetScratchCols = 8192;      // the widest row it reduces (RMSNorm C <= 8192)

// One backend per device, created on first use and kept for the process's lifetime.
Backend& backend_for_device(int gpu);
// The backend of a CUDA context (an Internal error if ctx is not a CUDA context).
Backend& backend_of(const Ctx& ctx);
inline cudaStream_t stream_of(const Ctx& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// Fatal (BadInput) if a kernel flagged an error since the last check; call after a stream sync.
void check_device_errors(const Backend& b);

// The grid of a grid-stride kernel over `units` units of work, `per_block` units per block: enough blocks
// to cover the work, at most `blocks_per_sm` per SM of ctx's device, and at least 1.
inline unsigned grid_stride_blocks(const Ctx& ctx, int64_t units, int64_t per_block, int blocks_per_sm) {
  const int64_t need = (units + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(backend_of(ctx).sm_count) * blocks_per_sm;
  return static_cast<unsigned>(need < 1 ? 1 : need < cap ? need : cap);
}

}  // namespace dflash::cuda
