// include/dflash/device_async.h. The one place outside kernels/ that names the CUDA runtime: each call
// is a thin checked wrapper, inert on the CPU backend.
#include "dflash/device_async.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "dflash/error.h"

#ifdef DFLASH_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend.cuh"
#include "cuda_check.cuh"  // DF_CUDA
#endif

namespace dflash {

namespace {
double host_now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

#ifdef DFLASH_HAVE_CUDA
namespace {
cudaEvent_t ev(void* p) { return static_cast<cudaEvent_t>(p); }
}  // namespace

Event::Event(const Ctx& ctx, bool timing) {
  if (ctx.device != Device::CUDA) return;
  cudaEvent_t e;
  DF_CUDA(cudaSetDevice(cuda::backend_of(ctx).device));
  DF_CUDA(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  ev_ = e;
}
Event::~Event() {
  if (ev_) cudaEventDestroy(ev(ev_));
}
void Event::record(const Ctx& ctx) {
  host_ms_ = host_now_ms();
  if (!ev_) return;
  DF_CUDA(cudaEventRecord(ev(ev_), cuda::stream_of(ctx)));
}
bool Event::done() const {
  if (!ev_) return true;
  const cudaError_t e = cudaEventQuery(ev(ev_));
  if (e == cudaErrorNotReady) return false;
  DF_CUDA(e);  // a device error surfaces here
  return true;
}
void Event::order_before(const Ctx& ctx) const {
  if (!ev_) return;
  DF_CUDA(cudaStreamWaitEvent(cuda::stream_of(ctx), ev(ev_), 0));
}
double Event::elapsed_ms(const Event& from, const Event& to) {
  if (!from.ev_ || !to.ev_) return to.host_ms_ - from.host_ms_;
  float ms = 0;
  DF_CUDA(cudaEventElapsedTime(&ms, ev(from.ev_), ev(to.ev_)));
  return ms;
}

Ctx side_ctx(const Ctx& ctx) {
  if (ctx.device != Device::CUDA) return ctx;
  static std::mutex mu;
  static std::map<int, cudaStream_t> streams;  // one per device, for the process's lifetime
  cuda::Backend& b = cuda::backend_of(ctx);
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

void copy_bytes_async(const Ctx& ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (ctx.device != Device::CUDA) {
    std::memcpy(dst, src, bytes);
    return;
  }
  DF_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda::stream_of(ctx)));
}

HostBuffer::HostBuffer(size_t bytes, HostMemory kind) : bytes_(bytes), kind_(kind) {
  if (bytes == 0) return;
  if (kind == HostMemory::Pinned) {
    const cudaError_t e = cudaHostAlloc(&p_, bytes, cudaHostAllocPortable);
    DF_CHECK_HINT(e == cudaSuccess, DeviceFailure,
                  "cudaHostAlloc of " << bytes << " bytes of page-locked memory failed: " << cudaGetErrorString(e),
                  "lower --hs-queue-depth or --token-budget (each slot holds one batch), or raise the memlock limit");
  } else {
    p_ = std::malloc(bytes);
    DF_CHECK(p_ != nullptr, SystemFailure, "out of host memory allocating " << bytes << " bytes");
  }
}
void HostBuffer::release() {
  if (!p_) return;
  if (kind_ == HostMemory::Pinned) cudaFreeHost(p_);
  else std::free(p_);
  p_ = nullptr;
}
#else   // a CPU-only build: events are always done, there is one stream, host memory is plain
Event::Event(const Ctx& ctx, bool) {
  DF_CHECK(ctx.device == Device::CPU, BadOptions, "a CUDA event in a build without CUDA");
}
Event::~Event() = default;
void Event::record(const Ctx&) { host_ms_ = host_now_ms(); }
bool Event::done() const { return true; }
void Event::order_before(const Ctx&) const {}
double Event::elapsed_ms(const Event& from, const Event& to) { return to.host_ms_ - from.host_ms_; }
Ctx side_ctx(const Ctx& ctx) { return ctx; }
void copy_bytes_async(const Ctx&, void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
HostBuffer::HostBuffer(size_t bytes, HostMemory kind) : bytes_(bytes), kind_(HostMemory::Pageable) {
  if (bytes == 0) return;
  p_ = std::malloc(bytes);
  DF_CHECK(p_ != nullptr, SystemFailure, "out of host memory allocating " << bytes << " bytes");
}
void HostBuffer::release() {
  std::free(p_);
  p_ = nullptr;
}
#endif

Event::Event(Event&& o) noexcept : ev_(std::exchange(o.ev_, nullptr)), host_ms_(o.host_ms_) {}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    this->~Event();
    ev_ = std::exchange(o.ev_, nullptr);
    host_ms_ = o.host_ms_;
  }
  return *this;
}
HostBuffer::~HostBuffer() { release(); }
HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), kind_(o.kind_) {}
HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    kind_ = o.kind_;
  }
  return *this;
}

}  // namespace dflash
