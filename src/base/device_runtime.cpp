// base/device_runtime.h: the slot the CUDA library fills.
#include "base/device_runtime.h"

#include <atomic>

#include "dflash/error.h"

namespace dflash {

namespace {
std::atomic<const DeviceRuntime*> g_runtime{nullptr};
}  // namespace

void set_device_runtime(const DeviceRuntime* rt) { g_runtime.store(rt); }

const DeviceRuntime* device_runtime() { return g_runtime.load(); }

const DeviceRuntime& device_runtime_for(const char* what) {
  const DeviceRuntime* rt = device_runtime();
  if (!rt) fatal_no_cuda(what);
  return *rt;
}

void fatal_no_cuda(const std::string& what) {
  fatal(ExitCode::BadOptions, what + ": this build has no CUDA backend",
        "rebuild with a CUDA toolkit (DFLASH_CUDA=ON) or run with --backend cpu");
}

}  // namespace dflash
