// A build without the CUDA library (CMakeLists.txt links each floor's no_cuda.cpp in its place): the
// table is null, so every CUDA request ends in core/cuda_entry.h's library_for, one fatal "this build has
// no CUDA backend" (exit 2) with the fix, and in_build() answers no.
#include "core/cuda_entry.h"

namespace dflash::cuda {
const Library* const library = nullptr;
}  // namespace dflash::cuda
