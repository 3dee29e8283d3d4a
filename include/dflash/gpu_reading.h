// One GPU reading (the NVML sampler, dflash/nvml.h, takes it). Its own header because it travels in every
// target's report (dflash/hs_batch.h).
#pragma once
#include <cstdint>

namespace dflash {

// One reading of one GPU. Travels inside the ranks' timing reports (trivially copyable, fixed size).
struct GpuReading {
  int32_t valid = 0;          // 1: the fields hold a reading; 0: none (no NVML, or the query failed)
  float power_w = 0;          // board power draw (nvmlDeviceGetPowerUsage, mW / 1000)
  float util_pct = 0;         // share of NVML's last sample period a kernel ran (0..100)
  float mem_used_mib = 0;     // device memory in use (all processes), MiB
  float mem_total_mib = 0;
};

}  // namespace dflash
