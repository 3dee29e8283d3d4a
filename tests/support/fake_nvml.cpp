// A stand-in libnvidia-ml for the unit tests (tests/unit/test_nvml.cpp): the NVML entry points
// PowerSampler resolves, answering from a state the test sets through fake_nvml_configure(). It lets
// the sampler's reading path (units, device lookup, failures) run on a machine without a driver.
// Error values as in nvml.h: 3 NOT_SUPPORTED, 6 NOT_FOUND, 9 DRIVER_NOT_LOADED.
//
// Unconfigured (the e2e test, through DFLASH_TEST_NVML_LIBRARY) it answers for 16 devices: device i
// draws 100 + 10 i W, is 50 % busy and uses 1024 + i MiB of 80 GiB.
#include <cstring>

namespace {

struct FakeNvmlState {
  int init_result = 0;
  unsigned int device_count = 16;
  int power_result = 0;
  unsigned int power_mw = 100000, power_step_mw = 10000;  // device i: power_mw + i * power_step_mw
  unsigned int util_gpu = 50;
  unsigned long long mem_total = 80ull << 30, mem_used = 1ull << 30, mem_step = 1ull << 20;
  int inits = 0, shutdowns = 0;
  int last_index = -1;          // the index nvmlDeviceGetHandleByIndex_v2 was last asked for
  char last_pci[32] = {0};      // the bus id nvmlDeviceGetHandleByPciBusId_v2 was last asked for
};
FakeNvmlState g;
int g_devices[16];  // handles point here: device i = &g_devices[i]
unsigned int index_of(void* device) { return static_cast<unsigned int>(static_cast<int*>(device) - g_devices); }

struct Utilization {
  unsigned int gpu, memory;
};
struct Memory {
  unsigned long long total, free, used;
};

}  // namespace

extern "C" {

// The test's controls (not NVML).
__attribute__((visibility("default"))) void fake_nvml_configure(int init_result, unsigned int device_count,
                                                                  int power_result, unsigned int power_mw,
                                                                  unsigned int util_gpu, unsigned long long mem_total,
                                                                  unsigned long long mem_used) {
  g.init_result = init_result;
  g.device_count = device_count;
  g.power_result = power_result;
  g.power_mw = power_mw;
  g.power_step_mw = 0;
  g.mem_step = 0;
  g.util_gpu = util_gpu;
  g.mem_total = mem_total;
  g.mem_used = mem_used;
}
__attribute__((visibility("default"))) void fake_nvml_counters(int* inits, int* shutdowns, int* last_index) {
  *inits = g.inits;
  *shutdowns = g.shutdowns;
  *last_index = g.last_index;
}

__attribute__((visibility("default"))) int nvmlInit_v2() {
  if (g.init_result == 0) g.inits++;
  return g.init_result;
}
__attribute__((visibility("default"))) int nvmlShutdown() {
  g.shutdowns++;
  return 0;
}
__attribute__((visibility("default"))) const char* nvmlErrorString(int r) {
  switch (r) {
    case 3: return "Not Supported";
    case 6: return "Not Found";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}
__attribute__((visibility("default"))) int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  g.last_index = static_cast<int>(index);
  if (index >= g.device_count || index >= 16) return 6;
  *device = &g_devices[index];
  return 0;
}
__attribute__((visibility("default"))) int nvmlDeviceGetHandleByPciBusId_v2(const char* bus, void** device) {
  std::strncpy(g.last_pci, bus, sizeof(g.last_pci) - 1);
  if (g.device_count == 0) return 6;
  *device = &g_devices[0];
  return 0;
}
__attribute__((visibility("default"))) int nvmlDeviceGetPowerUsage(void* device, unsigned int* mw) {
  if (g.power_result != 0) return g.power_result;
  *mw = g.power_mw + index_of(device) * g.power_step_mw;
  return 0;
}
__attribute__((visibility("default"))) int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  u->gpu = g.util_gpu;
  u->memory = 0;
  return 0;
}
__attribute__((visibility("default"))) int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  m->total = g.mem_total;
  m->used = g.mem_used + index_of(device) * g.mem_step;
  m->free = m->total - m->used;
  return 0;
}

}  // extern "C"
