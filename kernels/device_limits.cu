// Device limits and the launch check; see device_limits.cuh.
#include "device_limits.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "cuda_check.cuh"
#include "dflash/error.h"

namespace dflash::cuda {
namespace {

constexpr int kMaxDevices = 64;

LimitsSource limits_source() {
  static const LimitsSource source = [] {
    const char* e = std::getenv("DFLASH_DEVICE_LIMITS");
    const std::string v = e ? e : "";
    if (v.empty() || v == "device") return LimitsSource::Device;
    DF_CHECK_HINT(v == "sm_120" || v == "sm120", BadOptions, "DFLASH_DEVICE_LIMITS=" << v << " is not device or sm_120",
                  "unset it (the device's own limits), or set sm_120 to run as on an RTX PRO 6000 Blackwell");
    return LimitsSource::ForcedSm120;
  }();
  return source;
}

DeviceLimits query(int device) {
  DeviceLimits l;
  l.device = device;
  int v = 0;
  DF_CUDA(cudaDeviceGetAttribute(&l.cc_major, cudaDevAttrComputeCapabilityMajor, device));
  DF_CUDA(cudaDeviceGetAttribute(&l.cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  DF_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  l.smem_per_block_optin = static_cast<size_t>(v);
  DF_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  l.smem_per_sm = static_cast<size_t>(v);
  DF_CUDA(cudaDeviceGetAttribute(&l.max_threads_per_block, cudaDevAttrMaxThreadsPerBlock, device));
  DF_CUDA(cudaDeviceGetAttribute(&l.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  DF_CUDA(cudaDeviceGetAttribute(&l.regs_per_block, cudaDevAttrMaxRegistersPerBlock, device));
  if (limits_source() == LimitsSource::ForcedSm120) {
    l.source = LimitsSource::ForcedSm120;
    l.smem_per_block_optin = std::min(l.smem_per_block_optin, kSm120SmemPerBlockOptin);
    l.smem_per_sm = std::min(l.smem_per_sm, kSm120SmemPerSm);
    l.max_threads_per_sm = std::min(l.max_threads_per_sm, kSm120MaxThreadsPerSm);
  }
  return l;
}

std::mutex g_mu;  // guards the caches below (ranks may drive a device from more than one thread)
DeviceLimits g_limits[kMaxDevices];
bool g_known[kMaxDevices] = {};
// (kernel, device) -> its attributes; (kernel, device) -> the dynamic shared memory attribute set so far
std::map<std::pair<const void*, int>, cudaFuncAttributes> g_attrs;
std::map<std::pair<const void*, int>, size_t> g_smem_set;

const cudaFuncAttributes& attributes_locked(const void* kernel, int device) {
  auto it = g_attrs.find({kernel, device});
  if (it == g_attrs.end()) {
    cudaFuncAttributes a{};
    DF_CUDA(cudaFuncGetAttributes(&a, kernel));
    it = g_attrs.emplace(std::make_pair(kernel, device), a).first;
  }
  return it->second;
}

const DeviceLimits& limits_locked(int device) {
  DF_CHECK(device >= 0 && device < kMaxDevices, Internal, "device_limits: device " << device);
  if (!g_known[device]) {
    g_limits[device] = query(device);
    g_known[device] = true;
  }
  return g_limits[device];
}

// Registers a block holds: each warp's allocation rounded up to 256 registers (the allocation unit of
// sm_90 and later).
int64_t regs_of_block(int regs_per_thread, int threads) {
  const int64_t warps = (threads + 31) / 32, per_warp = (int64_t(regs_per_thread) * 32 + 255) / 256 * 256;
  return warps * per_warp;
}

// The reason a launch does not fit, or "" when it does.
std::string misfit_locked(const void* kernel, int threads, size_t dynamic_smem, int device) {
  const DeviceLimits& l = limits_locked(device);
  const cudaFuncAttributes& a = attributes_locked(kernel, device);
  std::ostringstream why;
  const size_t smem = a.sharedSizeBytes + dynamic_smem;
  if (smem > l.smem_per_block_optin)
    why << smem << " B of shared memory per block (" << a.sharedSizeBytes << " static + " << dynamic_smem
        << " dynamic), the device allows " << l.smem_per_block_optin;
  else if (threads < 1 || threads > l.max_threads_per_block || threads > a.maxThreadsPerBlock)
    why << threads << " threads per block, the device allows " << l.max_threads_per_block << " and the kernel "
        << a.maxThreadsPerBlock;
  else if (regs_of_block(a.numRegs, threads) > l.regs_per_block)
    why << a.numRegs << " registers x " << threads << " threads (" << regs_of_block(a.numRegs, threads)
        << " allocated), the device allows " << l.regs_per_block << " per block";
  return why.str();
}

}  // namespace

const DeviceLimits& device_limits(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  return limits_locked(device);
}

const DeviceLimits& current_device_limits() {
  int device = 0;
  DF_CUDA(cudaGetDevice(&device));
  return device_limits(device);
}

std::string describe(const DeviceLimits& l) {
  std::ostringstream os;
  os << "device " << l.device << " (sm_" << l.cc_major << l.cc_minor << ", "
     << (l.source == LimitsSource::ForcedSm120 ? "forced to sm_120 limits by DFLASH_DEVICE_LIMITS: " : "")
     << l.smem_per_block_optin / 1024 << " KB shared memory per block, " << l.smem_per_sm / 1024 << " KB per SM, "
     << l.max_threads_per_sm << " threads per SM)";
  return os.str();
}

bool launch_fits(const void* kernel, int threads, size_t dynamic_smem, int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  return misfit_locked(kernel, threads, dynamic_smem, device).empty();
}

void fit_launch(const void* kernel, const char* name, int threads, size_t dynamic_smem, int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  const std::string why = misfit_locked(kernel, threads, dynamic_smem, device);
  DF_CHECK_HINT(why.empty(), Internal, name << " does not fit " << describe(limits_locked(device)) << ": " << why,
                "a kernel variant for this GPU is missing; report it with this line (DFLASH_DEVICE_LIMITS set? unset "
                "it to use the device's own limits)");
  constexpr size_t kDefaultDynamicSmem = 48 * 1024;
  if (dynamic_smem > kDefaultDynamicSmem) {
    size_t& set = g_smem_set[{kernel, device}];
    if (set < dynamic_smem) {
      DF_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic_smem)));
      set = dynamic_smem;
    }
  }
}

}  // namespace dflash::cuda
