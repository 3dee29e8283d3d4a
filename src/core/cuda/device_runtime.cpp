#include "device_memory.cuh"

#include "cuda_check.cuh"

namespace dflash::cuda {
void* device_alloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess)
    DF_FAIL(DeviceFailure, "cudaMalloc of " << bytes << " bytes failed: " << cudaGetErrorString(e),
            "the GPU is out of memory: lower --token-budget or use a smaller model/topology");
  return p;
}
void device_free(void* p) { cudaFree(p); }
void device_zero(void* p, size_t bytes) { DF_CUDA(cudaMemset(p, 0, bytes)); }
}  // namespace dflash::cuda
