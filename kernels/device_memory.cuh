// Device memory for dflash::Buffer (host code calls these; they check every CUDA call).
#pragma once
#include <cstddef>

namespace dflash::cuda {
void* device_alloc(size_t bytes);
void device_free(void* p);
void device_zero(void* p, size_t bytes);
}  // namespace dflash::cuda
