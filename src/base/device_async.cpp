// include/dflash/device_async.h: host-side logic of the base library; the CUDA runtime's calls are the
// CUDA library's (src/core/cuda/device_runtime.cpp, through base/device_runtime.h).
#include "dflash/device_async.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "base/device_runtime.h"
#include "dflash/clock.h"
#include "dflash/error.h"

namespace dflash {

// Events and pinned memory on a CUDA context go through the CUDA library's runtime (device_runtime.h); on
// the CPU backend events are always done, there is one stream and host memory is plain.
Event::Event(const Ctx& ctx, bool timing) {
  if (ctx.device != Device::CUDA) return;
  ev_ = device_runtime_for("a CUDA event").event_create(ctx, timing);
}
Event::~Event() {
  if (ev_) device_runtime()->event_destroy(ev_);
}
void Event::record(const Ctx& ctx) {
  host_ms_ = monotonic_s() * 1e3;
  if (ev_) device_runtime()->event_record(ev_, ctx);
}
bool Event::done() const { return !ev_ || device_runtime()->event_done(ev_); }
void Event::order_before(const Ctx& ctx) const {
  if (ev_) device_runtime()->event_order_before(ev_, ctx);
}
double Event::elapsed_ms(const Event& from, const Event& to) {
  if (!from.ev_ || !to.ev_) return to.host_ms_ - from.host_ms_;
  return device_runtime()->event_elapsed_ms(from.ev_, to.ev_);
}

Ctx side_ctx(const Ctx& ctx) {
  if (ctx.device != Device::CUDA) return ctx;
  return device_runtime_for("a CUDA side stream").side_ctx(ctx);
}

void copy_bytes_async(const Ctx& ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (ctx.device != Device::CUDA) {
    std::memcpy(dst, src, bytes);
    return;
  }
  device_runtime_for("a CUDA copy").copy_async(ctx, dst, src, bytes);
}

// Pinned where a device runtime is installed (a CUDA build), else plain pageable memory.
HostBuffer::HostBuffer(size_t bytes, HostMemory kind)
    : bytes_(bytes), kind_(kind == HostMemory::Pinned && device_runtime() ? HostMemory::Pinned : HostMemory::Pageable) {
  if (bytes == 0) return;
  if (kind_ == HostMemory::Pinned) {
    p_ = device_runtime()->host_alloc_pinned(bytes);
  } else {
    p_ = std::malloc(bytes);
    DF_CHECK(p_ != nullptr, SystemFailure, "out of host memory allocating " << bytes << " bytes");
  }
}
void HostBuffer::release() {
  if (!p_) return;
  if (kind_ == HostMemory::Pinned) device_runtime()->host_free_pinned(p_);
  else std::free(p_);
  p_ = nullptr;
}

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
