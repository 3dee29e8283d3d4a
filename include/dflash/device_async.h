// Ordering asynchronous device work without host syncs: events, a second stream per device, async copies
// and page-locked host memory. The communication layer (src/comm) is written against this header only,
// so the same code runs on both backends: on the CPU backend an Event is always done, a side context is
// the CPU context and copies are memcpy.
#pragma once
#include <cstddef>

#include "dflash/tensor.h"

namespace dflash {

// A point in a context's stream of work. Move-only. On the CPU backend work is done when it is enqueued:
// an event is always done and remembers the host time it was recorded at, so elapsed_ms() times CPU
// work by the same calls that time GPU work.
class Event {
 public:
  Event() = default;
  explicit Event(const Ctx& ctx, bool timing = false);  // created on ctx's device
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Marks everything enqueued on ctx so far.
  void record(const Ctx& ctx);
  // True once the marked work has finished (never blocks). Device errors surface here as fatal CUDA errors.
  bool done() const;
  // Later work enqueued on ctx waits for the marked work (no host sync).
  void order_before(const Ctx& ctx) const;
  // Milliseconds between two done events (CUDA: both made with timing = true, on one device).
  static double elapsed_ms(const Event& from, const Event& to);

 private:
  void* ev_ = nullptr;    // cudaEvent_t; null on the CPU backend
  double host_ms_ = 0;    // CPU backend: when it was recorded (steady clock)
};

// A second stream on ctx's device, for copies and communication that overlap the compute stream. Made
// once per device and kept for the process's lifetime. On the CPU backend: the CPU context.
Ctx side_ctx(const Ctx& ctx);

// bytes from src to dst, ordered on ctx's stream; returns at once on CUDA (host memory should be pinned
// for the copy to overlap). On the CPU backend a memcpy.
void copy_bytes_async(const Ctx& ctx, void* dst, const void* src, size_t bytes);

// Host memory, page-locked when the job runs on a GPU (async copies need it), plain otherwise.
enum class HostMemory : uint8_t { Pageable, Pinned };
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(size_t bytes, HostMemory kind);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() const { return p_; }
  size_t size() const { return bytes_; }

 private:
  void release();
  void* p_ = nullptr;
  size_t bytes_ = 0;
  HostMemory kind_ = HostMemory::Pageable;
};

}  // namespace dflash
