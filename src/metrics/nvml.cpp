// NVML through dlopen (include/dflash/nvml.h). nvml.h is not included: it is not installed everywhere
// (it ships with the driver's development files, not with this project's dependencies), and the few
// declarations needed are stable C ABI since NVML 5 (the _v2 entry points since CUDA 5.5 drivers).
#include "dflash/nvml.h"

#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/cuda_entry.h"
#include "dflash/clock.h"

namespace dflash {

namespace {

// ---- the NVML declarations used (values and layouts as in nvml.h) -----------------------------------
using nvmlReturn_t = int;  // an enum in nvml.h: int-sized
constexpr nvmlReturn_t NVML_SUCCESS = 0;
using nvmlDevice_t = void*;  // struct nvmlDevice_st*
struct nvmlUtilization_t {
  unsigned int gpu;     // percent of the last sample period a kernel was running
  unsigned int memory;  // percent of it device memory was read or written
};
struct nvmlMemory_t {  // the v1 struct of nvmlDeviceGetMemoryInfo, in bytes
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

}  // namespace

struct PowerSampler::Api {
  nvmlReturn_t (*init)() = nullptr;                                          // nvmlInit_v2
  nvmlReturn_t (*shutdown)() = nullptr;                                      // nvmlShutdown
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;    // nvmlDeviceGetHandleByIndex_v2
  nvmlReturn_t (*handle_by_pci)(const char*, nvmlDevice_t*) = nullptr;       // nvmlDeviceGetHandleByPciBusId_v2
  nvmlReturn_t (*power_usage)(nvmlDevice_t, unsigned int*) = nullptr;        // milliwatts
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;                       // optional

  std::string describe(nvmlReturn_t r) const {
    std::string s = "NVML error " + std::to_string(r);
    if (error_string) {
      const char* e = error_string(r);
      if (e) s += " (" + std::string(e) + ")";
    }
    return s;
  }
};

PowerSampler::PowerSampler(Device backend, int cuda_device, const std::string& library) {
  if (backend == Device::CPU) {
    reason_ = "CPU backend: no NVML";
    return;
  }
  if (cuda_device < 0) {
    reason_ = "no CUDA device bound to this rank";
    return;
  }
  // RTLD_LOCAL: NVML's symbols stay out of the global namespace (nothing else should bind to them).
  lib_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib_) {
    const char* e = ::dlerror();
    fail(library + " not found (no NVIDIA driver on this machine?): " + std::string(e ? e : "dlopen failed"));
    return;
  }
  api_ = new Api;
  auto resolve = [&](const char* name, auto* fn) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(::dlsym(lib_, name));
    return *fn != nullptr;
  };
  const char* missing = nullptr;
  if (!resolve("nvmlInit_v2", &api_->init)) missing = "nvmlInit_v2";
  else if (!resolve("nvmlShutdown", &api_->shutdown)) missing = "nvmlShutdown";
  else if (!resolve("nvmlDeviceGetHandleByIndex_v2", &api_->handle_by_index)) missing = "nvmlDeviceGetHandleByIndex_v2";
  else if (!resolve("nvmlDeviceGetPowerUsage", &api_->power_usage)) missing = "nvmlDeviceGetPowerUsage";
  else if (!resolve("nvmlDeviceGetUtilizationRates", &api_->utilization)) missing = "nvmlDeviceGetUtilizationRates";
  else if (!resolve("nvmlDeviceGetMemoryInfo", &api_->memory)) missing = "nvmlDeviceGetMemoryInfo";
  if (missing) {
    fail(library + " lacks " + missing + " (not NVML, or a driver too old)");
    return;
  }
  resolve("nvmlDeviceGetHandleByPciBusId_v2", &api_->handle_by_pci);  // optional: index mapping without it
  resolve("nvmlErrorString", &api_->error_string);

  nvmlReturn_t r = api_->init();
  if (r != NVML_SUCCESS) {
    fail("nvmlInit_v2 failed: " + api_->describe(r));
    return;
  }
  initialised_ = true;

  // CUDA ordinals follow CUDA_VISIBLE_DEVICES (and CUDA's device order); NVML indices do not. The PCI
  // bus id names the same board in both. cudaDeviceGetPCIBusId is a device query: it initialises the
  // runtime but creates no context (none on GPU 0 from every rank before it binds its own). When CUDA
  // cannot name the device, the NVML index is the best guess (the rank fails binding it anyway).
  nvmlDevice_t dev = nullptr;
  const std::string bus =
      api_->handle_by_pci && cuda::in_build() ? cuda::library->pci_bus_id(cuda_device) : "";  // "" without CUDA
  if (!bus.empty()) {
    pci_bus_id_ = bus;
    r = api_->handle_by_pci(bus.c_str(), &dev);
    if (r != NVML_SUCCESS) {
      fail("nvmlDeviceGetHandleByPciBusId_v2(" + pci_bus_id_ + ") for CUDA device " + std::to_string(cuda_device) +
           " failed: " + api_->describe(r));
      return;
    }
  }
  if (!dev) {
    r = api_->handle_by_index(static_cast<unsigned int>(cuda_device), &dev);
    if (r != NVML_SUCCESS) {
      fail("nvmlDeviceGetHandleByIndex_v2(" + std::to_string(cuda_device) + ") failed: " + api_->describe(r));
      return;
    }
  }
  device_ = dev;
  available_ = true;
  // A GPU that cannot report power (some virtualised ones) gets no column rather than zeros.
  const GpuReading probe = sample();
  if (!probe.valid) fail("first reading failed: " + last_error_);
}

std::unique_ptr<PowerSampler> PowerSampler::for_rank(Device backend, int local_rank) {
  const char* test_library = std::getenv("DFLASH_TEST_NVML_LIBRARY");
  if (test_library && *test_library) {
    std::fprintf(stderr, "[dflash] DFLASH_TEST_NVML_LIBRARY=%s: GPU readings come from this library (a test hook)\n",
                 test_library);
    return std::make_unique<PowerSampler>(Device::CUDA, local_rank, test_library);
  }
  return std::make_unique<PowerSampler>(backend, backend == Device::CUDA ? local_rank : -1);
}

PowerSampler::~PowerSampler() {
  if (initialised_ && api_ && api_->shutdown) api_->shutdown();
  delete api_;
  if (lib_) ::dlclose(lib_);
}

void PowerSampler::fail(const std::string& why) {
  available_ = false;
  reason_ = why;
}

GpuReading PowerSampler::sample() {
  GpuReading g;
  if (!available_) return g;
  nvmlDevice_t dev = static_cast<nvmlDevice_t>(device_);
  unsigned int mw = 0;
  nvmlUtilization_t util{};
  nvmlMemory_t mem{};
  nvmlReturn_t r;
  if ((r = api_->power_usage(dev, &mw)) != NVML_SUCCESS) {
    last_error_ = "nvmlDeviceGetPowerUsage: " + api_->describe(r);
    return g;
  }
  if ((r = api_->utilization(dev, &util)) != NVML_SUCCESS) {
    last_error_ = "nvmlDeviceGetUtilizationRates: " + api_->describe(r);
    return g;
  }
  if ((r = api_->memory(dev, &mem)) != NVML_SUCCESS) {
    last_error_ = "nvmlDeviceGetMemoryInfo: " + api_->describe(r);
    return g;
  }
  constexpr double kMiB = 1024.0 * 1024.0;
  g.valid = 1;
  g.power_w = static_cast<float>(mw / 1000.0);
  g.util_pct = static_cast<float>(util.gpu);
  g.mem_used_mib = static_cast<float>(static_cast<double>(mem.used) / kMiB);
  g.mem_total_mib = static_cast<float>(static_cast<double>(mem.total) / kMiB);
  last_ = g;
  last_mono_s_ = monotonic_s();
  return g;
}

GpuReading PowerSampler::sample_at_most_every(double max_age_s) {
  if (available_ && last_.valid && last_mono_s_ >= 0 && monotonic_s() - last_mono_s_ < max_age_s) return last_;
  return sample();
}

// ---- the /gpus series ------------------------------------------------------------------------------

GpuColumns plan_gpu_columns(const std::vector<GpuReading>& startup, const std::vector<std::string>& note,
                            const std::vector<bool>& reports) {
  GpuColumns c;
  auto note_of = [&](size_t r) { return r < note.size() && !note[r].empty() ? note[r] : std::string("no reading"); };
  std::vector<size_t> lacking;  // reporting ranks without a startup reading
  for (size_t r = 0; r < reports.size(); ++r) {
    if (!reports[r]) continue;
    if (r < startup.size() && startup[r].valid) c.ranks.push_back(static_cast<int>(r));
    else lacking.push_back(r);
  }
  if (lacking.empty()) {
    c.available = !c.ranks.empty();
    if (!c.available) c.reason = "no rank with a GPU sends reports";
    return c;
  }
  // Every rank lacking it for the same reason (the CPU backend, no driver anywhere): that reason as is,
  // e.g. "CPU backend: no NVML". Otherwise name the first rank without a reading.
  bool same = c.ranks.empty();
  for (size_t r : lacking) same = same && note_of(r) == note_of(lacking[0]);
  c.reason = same ? note_of(lacking[0]) : "no NVML reading on rank " + std::to_string(lacking[0]) + ": " + note_of(lacking[0]);
  c.ranks.clear();
  return c;
}

std::optional<GpuRow> assemble_gpu_row(const std::vector<GpuReading>& columns) {
  if (columns.empty()) return std::nullopt;
  GpuRow row;
  for (const GpuReading& g : columns) {
    if (!g.valid || !std::isfinite(g.power_w)) return std::nullopt;
    row.power_w.push_back(g.power_w);
    row.util_pct.push_back(g.util_pct);
    row.mem_used_mib.push_back(g.mem_used_mib);
    row.total_power_w += g.power_w;
  }
  return row;
}

std::optional<double> mean_startup_power_w(const std::vector<GpuReading>& startup) {
  double sum = 0;
  int n = 0;
  for (const GpuReading& g : startup)
    if (g.valid) {
      sum += g.power_w;
      ++n;
    }
  if (n == 0) return std::nullopt;
  return sum / n;
}

std::string json_int_list(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace dflash
