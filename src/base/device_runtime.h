// The device half of the base library's types (Buffer in tensor.h; Event, HostBuffer, side_ctx and
// copy_bytes_async in device_async.h): a table of the device runtime's calls, filled by the CUDA library
// (src/core/cuda/device_runtime.cpp) when it starts (cuda::device_count, the first CUDA context). The base
// library names no CUDA symbol, so it links below the CUDA library; without a table (a CPU-only build) the
// base types are host-only and a device request is a BadOptions error "this build has no CUDA backend".
#pragma once
#include <cstddef>
#include <string>

#include "dflash/tensor.h"

namespace dflash {

struct DeviceRuntime {
  // Device memory on the current device (Buffer); alloc is fatal (DeviceFailure) when it fails.
  void* (*alloc)(size_t bytes);
  void (*free)(void* p);
  void (*zero)(void* p, size_t bytes);
  // Events on ctx's device and stream (Event); done() never blocks.
  void* (*event_create)(const Ctx& ctx, bool timing);
  void (*event_destroy)(void* ev);
  void (*event_record)(void* ev, const Ctx& ctx);
  bool (*event_done)(void* ev);
  void (*event_order_before)(void* ev, const Ctx& ctx);
  double (*event_elapsed_ms)(void* from, void* to);
  // A second stream on ctx's device (side_ctx), and an asynchronous copy on ctx's stream.
  Ctx (*side_ctx)(const Ctx& ctx);
  void (*copy_async)(const Ctx& ctx, void* dst, const void* src, size_t bytes);
  // Page-locked host memory (HostBuffer with HostMemory::Pinned).
  void* (*host_alloc_pinned)(size_t bytes);
  void (*host_free_pinned)(void* p);
};

// Installs the device runtime (the CUDA library does, before its first device call); idempotent.
void set_device_runtime(const DeviceRuntime* rt);
// The installed runtime, or null (a CPU-only build).
const DeviceRuntime* device_runtime();
// The installed runtime; without one, fatal_no_cuda(what).
const DeviceRuntime& device_runtime_for(const char* what);

// Fatal BadOptions (exit 2) "<what>: this build has no CUDA backend", with the fix: what a CPU-only build
// answers to every CUDA request (here, and through src/core/cuda_entry.h's library_for for the CUDA library).
[[noreturn]] void fatal_no_cuda(const std::string& what);

}  // namespace dflash
