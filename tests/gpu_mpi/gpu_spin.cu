// A kernel that only waits (tests/gpu_mpi): delays the work queued after it on a stream, so a reducer that
// read a bucket before the event marking it final would read what was there before.
#include "backend.cuh"
#include "cuda_check.cuh"
#include "gpu_spin.h"

namespace dflash::test {
namespace {
__global__ void spin_kernel(unsigned ns) {
  for (unsigned waited = 0; waited < ns; waited += 1000) __nanosleep(1000);
}
}  // namespace

void gpu_spin(const Ctx& ctx, unsigned microseconds) {
  spin_kernel<<<1, 1, 0, cuda::stream_of(ctx)>>>(microseconds * 1000u);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::test
