#include "drafter_blas.cuh"

#include <mutex>
#include <vector>

#include "backend.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

struct DrafterDeviceState {
  cublasHandle_t blas = nullptr;
  void* slot_ptr[static_cast<int>(ScratchSlot::Count)] = {};
  size_t slot_bytes[static_cast<int>(ScratchSlot::Count)] = {};
};

// One state per device, created on first use and kept for the process's lifetime (like the Backend).
DrafterDeviceState& state_of(const Ctx& ctx) {
  static std::mutex mu;
  static std::vector<DrafterDeviceState*> states;
  const int dev = backend_of(ctx).device;
  std::lock_guard<std::mutex> lock(mu);
  if (states.size() <= static_cast<size_t>(dev)) states.resize(dev + 1, nullptr);
  if (!states[dev]) {
    auto* s = new DrafterDeviceState();
    DF_CUBLAS(cublasCreate(&s->blas));
    states[dev] = s;
  }
  return *states[dev];
}

}  // namespace

cublasHandle_t blas_of(const Ctx& ctx) {
  DrafterDeviceState& s = state_of(ctx);
  DF_CUBLAS(cublasSetStream(s.blas, stream_of(ctx)));
  return s.blas;
}

void gemm_bf16(const Ctx& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               GemmOperand A, GemmOperand B, float beta, void* C, bool c_f32, int64_t ldc, int64_t sc,
               int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  DF_CHECK(m < (int64_t(1) << 31) && n < (int64_t(1) << 31) && k < (int64_t(1) << 31), Internal,
           "gemm_bf16: m=" << m << " n=" << n << " k=" << k << " out of int range");
  cublasHandle_t h = blas_of(ctx);
  const cudaDataType ct = c_f32 ? CUDA_R_32F : CUDA_R_16BF;
  DF_CUBLAS(cublasGemmStridedBatchedEx(h, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       int(m), int(n), int(k), &alpha, A.ptr, CUDA_R_16BF, int(A.ld), A.stride,
                                       B.ptr, CUDA_R_16BF, int(B.ld), B.stride, &beta, C, ct, int(ldc), sc,
                                       int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void* scratch(const Ctx& ctx, ScratchSlot slot, size_t bytes) {
  DrafterDeviceState& s = state_of(ctx);
  const int i = static_cast<int>(slot);
  if (bytes > s.slot_bytes[i]) {
    if (s.slot_ptr[i]) DF_CUDA(cudaFree(s.slot_ptr[i]));  // synchronizes: kernels still using it are done
    s.slot_ptr[i] = nullptr;
    s.slot_bytes[i] = 0;
    cudaError_t e = cudaMalloc(&s.slot_ptr[i], bytes);
    if (e != cudaSuccess)
      DF_FAIL(DeviceFailure, "cudaMalloc of " << bytes << " bytes of drafter scratch failed: " << cudaGetErrorString(e),
              "the GPU is out of memory: lower --token-budget or --max-anchors");
    s.slot_bytes[i] = bytes;
  }
  return s.slot_ptr[i];
}

size_t scratch_bytes(const Ctx& ctx) {
  DrafterDeviceState& s = state_of(ctx);
  size_t total = 0;
  for (size_t b : s.slot_bytes) total += b;
  return total;
}

}  // namespace dflash::cuda
