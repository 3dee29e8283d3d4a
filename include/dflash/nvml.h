// GPU power, utilisation and memory from NVML, for metrics.h5 (/gpus) and the status line (pwr=).
//
// libnvidia-ml.so.1 is opened with dlopen at run time: the binary has no link-time dependency on the
// driver, so it starts (and trains on the CPU backend) on machines without one. Without NVML nothing is
// invented: the sampler says unavailable, with the reason, and metrics.h5 stores available = 0 + reason.
//
// Each rank samples its own GPU (the CUDA device ordinal it binds, = node-local rank) and sends the
// reading with its timing report; the metrics writer puts one column per GPU-owning rank in /gpus.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dflash/gpu_reading.h"
#include "dflash/tensor.h"  // Device (the --backend)

namespace dflash {

// The NVML library to open: the driver's. Tests pass other names to exercise the failure paths.
constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

// Reads one GPU through NVML. Not thread-safe (one per rank, used from its main thread).
class PowerSampler {
 public:
  // Device::CPU: unavailable, reason "CPU backend: no NVML" (no library is touched).
  // Device::CUDA: opens `library`, nvmlInit_v2, finds the NVML device of CUDA device `cuda_device`
  // (by PCI bus id when the CUDA backend is built in, else by index) and takes one probe reading:
  // any failure leaves the sampler unavailable with the reason ("libnvidia-ml.so.1 not found: ...").
  PowerSampler(Device backend, int cuda_device, const std::string& library = kNvmlLibrary);
  ~PowerSampler();  // nvmlShutdown + dlclose
  PowerSampler(const PowerSampler&) = delete;
  PowerSampler& operator=(const PowerSampler&) = delete;

  // The sampler of a rank: its backend's GPU `local_rank` (the device the rank binds). Test hook: with
  // DFLASH_TEST_NVML_LIBRARY=path set, that library is read as device `local_rank` even on the CPU
  // backend (the e2e test drives the whole GPU-metrics path with tests/support/fake_nvml.cpp).
  static std::unique_ptr<PowerSampler> for_rank(Device backend, int local_rank);

  bool available() const { return available_; }
  const std::string& reason() const { return reason_; }  // why unavailable ("" when available)
  const std::string& pci_bus_id() const { return pci_bus_id_; }  // of the sampled GPU, when known

  // A fresh reading (valid = 0 when unavailable or a query failed; the failure is kept in last_error()).
  GpuReading sample();
  // The last reading if it is younger than max_age_s (by the monotonic clock), else a fresh one:
  // callers on a hot path (a target, once per batch) sample at most every max_age_s.
  GpuReading sample_at_most_every(double max_age_s);
  const std::string& last_error() const { return last_error_; }

  struct Api;  // the resolved NVML entry points (nvml.cpp)

 private:
  void fail(const std::string& why);  // unavailable from now on, with this reason
  bool available_ = false;
  std::string reason_, last_error_, pci_bus_id_;
  void* lib_ = nullptr;     // dlopen handle
  Api* api_ = nullptr;
  void* device_ = nullptr;  // nvmlDevice_t
  bool initialised_ = false;
  GpuReading last_;
  double last_mono_s_ = -1;
};

// ---- the /gpus series: which ranks own a column, and one row from their readings -------------------

// Decided once when metrics.h5 is created, from every rank's startup reading (allgathered).
struct GpuColumns {
  bool available = false;
  std::string reason;      // when !available: "CPU backend: no NVML", or which rank lacks NVML and why
  std::vector<int> ranks;  // world rank of each column (target and drafter ranks, world order)
};

// startup[r], note[r]: world rank r's startup reading and, without one, its sampler's reason.
// reports[r]: whether rank r sends timing reports (targets, drafters); idle ranks do not, so their
// GPUs get no column (their draw is in the gpu_idle_power_w attribute). Available only when every
// reporting rank had a startup reading (a column that would stay empty is not invented). The reason
// is the ranks' own when they all agree ("CPU backend: no NVML"), else it names the first rank lacking.
GpuColumns plan_gpu_columns(const std::vector<GpuReading>& startup, const std::vector<std::string>& note,
                            const std::vector<bool>& reports);

// One /gpus row: the column readings, or nothing when any column has no valid reading this interval
// (the row is skipped rather than filled with made-up values).
struct GpuRow {
  std::vector<double> power_w, util_pct, mem_used_mib;
  double total_power_w = 0;
};
std::optional<GpuRow> assemble_gpu_row(const std::vector<GpuReading>& columns);

// Mean startup draw of the GPUs with a reading (gpu_idle_power_w: before any model loaded); nullopt
// when none has one.
std::optional<double> mean_startup_power_w(const std::vector<GpuReading>& startup);

// "[1,2,5]" (the gpu_ranks attribute).
std::string json_int_list(const std::vector<int>& v);

}  // namespace dflash
