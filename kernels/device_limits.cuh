// What a kernel launch may ask of a device, in one place: the shared memory a block may opt into, the
// threads and registers a block may have. Kernels whose shared memory is large enough to exceed some
// supported GPU's limit (everything with opt-in dynamic shared memory: the flash attention, the block
// attention's fused and chunked kernels, the gated delta rule) ask device_limits() which variant fits and
// go through fit_launch() before launching, so a GPU with less shared memory gets a smaller variant or a
// clear error, never a failed launch.
//
// The GPUs this project is run on (per block, opt-in): H100/H200 (sm_90) and B200 (sm_100) 227 KB;
// RTX PRO 6000 Blackwell (sm_120) 99 KB, 100 KB per SM, 1536 threads per SM. Kernels that use only static
// shared memory need no run-time check: ptxas refuses more than 48 KB static per block, which every one of
// these GPUs allows, and their blocks have at most 1024 threads.
//
// DFLASH_DEVICE_LIMITS=sm_120 lowers the limits reported here to the RTX PRO 6000's (never raises them),
// so an H100/H200 runs exactly the variants a Blackwell workstation GPU would choose, and fit_launch
// refuses any launch that would not fit there. `ctest -L gpu` runs the GPU unit tests that way too
// (gpu.sm120_limits, tests/CMakeLists.txt).
#pragma once
#include <cstddef>
#include <string>

namespace dflash::cuda {

enum class LimitsSource { Device, ForcedSm120 };

struct DeviceLimits {
  int device = 0;
  int cc_major = 0, cc_minor = 0;      // the real device's compute capability
  size_t smem_per_block_optin = 0;     // bytes one block may use, static + dynamic, after opting in
  size_t smem_per_sm = 0;              // bytes per multiprocessor
  int max_threads_per_block = 0;
  int max_threads_per_sm = 0;
  int regs_per_block = 0;              // 32-bit registers one block may use
  LimitsSource source = LimitsSource::Device;
};

// RTX PRO 6000 Blackwell (compute capability 12.0): the limits DFLASH_DEVICE_LIMITS=sm_120 imposes.
constexpr size_t kSm120SmemPerBlockOptin = 99 * 1024;
constexpr size_t kSm120SmemPerSm = 100 * 1024;
constexpr int kSm120MaxThreadsPerSm = 1536;

// The limits of `device` (queried once; lowered when DFLASH_DEVICE_LIMITS=sm_120). A bad value of the
// variable is fatal (BadOptions).
const DeviceLimits& device_limits(int device);
// The limits of the current device (cudaGetDevice).
const DeviceLimits& current_device_limits();
// "H200-class device 0 (sm_90, 227 KB shared memory per block)" / "... forced to sm_120 limits (99 KB ...)".
std::string describe(const DeviceLimits& l);

// Whether `kernel` (a __global__ function) with `threads` per block and `dynamic_smem` bytes of dynamic
// shared memory fits `device`'s limits: its static shared memory plus dynamic_smem within the opt-in
// limit, threads within both the device's and the kernel's (launch bounds) maximum, its registers within
// the block's.
bool launch_fits(const void* kernel, int threads, size_t dynamic_smem, int device);

// Before a launch: fatal (Internal, naming `name`, what it needs and what the device offers) unless
// launch_fits; then raises the kernel's dynamic shared memory attribute to dynamic_smem when above the
// 48 KB default (once per kernel and size, per device).
void fit_launch(const void* kernel, const char* name, int threads, size_t dynamic_smem, int device);

template <class Kernel>
inline void fit_launch(Kernel* kernel, const char* name, int threads, size_t dynamic_smem, int device) {
  fit_launch(reinterpret_cast<const void*>(kernel), name, threads, dynamic_smem, device);
}
template <class Kernel>
inline bool launch_fits(Kernel* kernel, int threads, size_t dynamic_smem, int device) {
  return launch_fits(reinterpret_cast<const void*>(kernel), threads, dynamic_smem, device);
}

}  // namespace dflash::cuda
