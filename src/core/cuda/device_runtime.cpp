// The CUDA runtime's calls behind the base library's device types (base/device_runtime.h): device memory
// for Buffer (device_memory.cuh, also used by the CUDA library itself), events, the side stream, pinned
// host memory. install_device_runtime() hands the table to the base library.
#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "backend.cuh"
#include "base/device_runtime.h"
#include "cuda_check.cuh"
#include "device_memory.cuh"

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

namespace {

cudaEvent_t ev(void* p) { return static_cast<cudaEvent_t>(p); }

void* event_create(const Ctx& ctx, bool timing) {
  cudaEvent_t e;
  DF_CUDA(cudaSetDevice(backend_of(ctx).device));
  DF_CUDA(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}
void event_destroy(void* e) { cudaEventDestroy(ev(e)); }
void event_record(void* e, const Ctx& ctx) { DF_CUDA(cudaEventRecord(ev(e), stream_of(ctx))); }
bool event_done(void* e) {
  const cudaError_t r = cudaEventQuery(ev(e));
  if (r == cudaErrorNotReady) return false;
  DF_CUDA(r);  // a device error surfaces here
  return true;
}
void event_order_before(void* e, const Ctx& ctx) { DF_CUDA(cudaStreamWaitEvent(stream_of(ctx), ev(e), 0)); }
double event_elapsed_ms(void* from, void* to) {
  float ms = 0;
  DF_CUDA(cudaEventElapsedTime(&ms, ev(from), ev(to)));
  return ms;
}

Ctx side_ctx(const Ctx& ctx) {
  static std::mutex mu;
  static std::map<int, cudaStream_t> streams;  // one per device, for the process's lifetime
  Backend& b = backend_of(ctx);
  std::lock_guard<std::mutex> lock(mu);
  cudaStream_t& s = streams[b.device];
  if (!s) {
    DF_CUDA(cudaSetDevice(b.device));
    DF_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  Ctx side = ctx;
  side.stream = s;
  return side;
}

void copy_async(const Ctx& ctx, void* dst, const void* src, size_t bytes) {
  DF_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(ctx)));
}

void* host_alloc_pinned(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  DF_CHECK_HINT(e == cudaSuccess, DeviceFailure,
                "cudaHostAlloc of " << bytes << " bytes of page-locked memory failed: " << cudaGetErrorString(e),
                "lower --hs-queue-depth or --token-budget (each slot holds one batch), or raise the memlock limit");
  return p;
}
void host_free_pinned(void* p) { cudaFreeHost(p); }

const DeviceRuntime kRuntime = {device_alloc,       device_free,        device_zero,     event_create,
                                event_destroy,      event_record,       event_done,      event_order_before,
                                event_elapsed_ms,   side_ctx,           copy_async,      host_alloc_pinned,
                                host_free_pinned};

}  // namespace

void install_device_runtime() { set_device_runtime(&kRuntime); }

}  // namespace dflash::cuda
