// Device memory (host code calls these; they check every CUDA call), and the CUDA runtime's table behind
// the base library's Buffer, Event and HostBuffer (src/core/cuda/device_runtime.cpp).
#pragma once
#include <cstddef>

namespace dflash::cuda {
void* device_alloc(size_t bytes);
void device_free(void* p);
void device_zero(void* p, size_t bytes);
// Hands the table to the base library (base/device_runtime.h); idempotent. Called before the first device
// call: by device_count() and by the first backend of a device.
void install_device_runtime();
}  // namespace dflash::cuda
