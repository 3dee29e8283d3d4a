// NVML on a real GPU: the sampler of CUDA device d finds its board by PCI bus id and reads plausible
// power (> 0 W), utilisation and memory (the total agrees with what CUDA reports for the same device).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "dflash/backend.h"
#include "dflash/nvml.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

TEST(GpuNvml, ReadsPowerAndMemoryOfEveryVisibleGpu) {
  SKIP_WITHOUT_GPU();
  std::set<std::string> buses;
  for (int d = 0; d < cuda_device_count(); ++d) {
    PowerSampler s(Device::CUDA, d);
    ASSERT_TRUE(s.available()) << "device " << d << ": " << s.reason();
    const GpuReading g = s.sample();
    ASSERT_EQ(g.valid, 1) << s.last_error();
    EXPECT_GT(g.power_w, 0.0f) << "device " << d;
    EXPECT_LT(g.power_w, 5000.0f) << "device " << d;  // mW read as W would be ~1000x this
    EXPECT_GT(g.mem_total_mib, 0.0f);
    EXPECT_LE(g.mem_used_mib, g.mem_total_mib);
    EXPECT_GE(g.util_pct, 0.0f);
    EXPECT_LE(g.util_pct, 100.0f);
    EXPECT_FALSE(s.pci_bus_id().empty()) << "the CUDA build maps ordinals by PCI bus id";
    buses.insert(s.pci_bus_id());

    // The same board as CUDA's device d: its memory total, within NVML's and CUDA's reservations.
    size_t free_b = 0, total_b = 0;
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    const double cuda_total_mib = static_cast<double>(total_b) / (1024.0 * 1024.0);
    EXPECT_NEAR(g.mem_total_mib, cuda_total_mib, test::tol::kNvmlMemTotal * cuda_total_mib) << "device " << d;
    std::printf("[ nvml ] device %d (%s): %.1f W, %.0f %% busy, %.0f / %.0f MiB\n", d, s.pci_bus_id().c_str(),
                g.power_w, g.util_pct, g.mem_used_mib, g.mem_total_mib);
  }
  EXPECT_EQ(static_cast<int>(buses.size()), cuda_device_count()) << "two CUDA ordinals mapped to one board";
}

}  // namespace
}  // namespace dflash
