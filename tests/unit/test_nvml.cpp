// The NVML power sampler: unavailable with a reason where there is no driver (this machine), the
// reading path against a stand-in libnvidia-ml (tests/support/fake_nvml.cpp), and the /gpus column plan.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dflash/nvml.h"

using namespace dflash;

namespace {

bool library_loads(const char* name) {
  void* h = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (h) ::dlclose(h);
  return h != nullptr;
}

// The stand-in library and its controls; the sampler's dlopen of the same path shares this state.
class FakeNvml : public ::testing::Test {
 protected:
  using Configure = void (*)(int, unsigned int, int, unsigned int, unsigned int, unsigned long long, unsigned long long);
  using Counters = void (*)(int*, int*, int*);
  static constexpr unsigned long long kGiB = 1ull << 30;

  void SetUp() override {
    handle_ = ::dlopen(DFLASH_FAKE_NVML, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << ::dlerror();
    configure_ = reinterpret_cast<Configure>(::dlsym(handle_, "fake_nvml_configure"));
    counters_ = reinterpret_cast<Counters>(::dlsym(handle_, "fake_nvml_counters"));
    ASSERT_TRUE(configure_ && counters_);
    // a healthy GPU: 412.345 W, 87 % busy, 1.5 of 80 GiB in use
    configure_(0, 2, 0, 412345, 87, 80 * kGiB, 3 * kGiB / 2);
  }
  void TearDown() override {
    if (handle_) ::dlclose(handle_);
  }
  int counter(int which) {
    int c[3];
    counters_(&c[0], &c[1], &c[2]);
    return c[which];
  }

  void* handle_ = nullptr;
  Configure configure_ = nullptr;
  Counters counters_ = nullptr;
};

}  // namespace

TEST(Nvml, CpuBackendSaysNoNvmlAndReadsNothing) {
  PowerSampler s(Device::CPU, -1);
  EXPECT_FALSE(s.available());
  EXPECT_EQ(s.reason(), "CPU backend: no NVML");
  EXPECT_EQ(s.sample().valid, 0);
  EXPECT_EQ(s.sample_at_most_every(1.0).valid, 0);
}

TEST(Nvml, TheDriversLibraryOnThisMachine) {
  PowerSampler s(Device::CUDA, 0);
  if (library_loads(kNvmlLibrary)) {
    // A machine with a driver: either a reading or a reason (tests/gpu/test_nvml.cpp checks values).
    if (s.available()) EXPECT_EQ(s.sample().valid, 1);
    else EXPECT_FALSE(s.reason().empty());
    GTEST_SKIP() << kNvmlLibrary << " exists here; the no-driver path is not testable on this machine";
  }
  EXPECT_FALSE(s.available());
  EXPECT_NE(s.reason().find("libnvidia-ml.so.1 not found"), std::string::npos) << s.reason();
  const GpuReading g = s.sample();
  EXPECT_EQ(g.valid, 0);
  EXPECT_EQ(g.power_w, 0.0f);
}

TEST(Nvml, MissingLibraryIsNamed) {
  PowerSampler s(Device::CUDA, 0, "libdflash-no-such-nvml.so.1");
  EXPECT_FALSE(s.available());
  EXPECT_NE(s.reason().find("libdflash-no-such-nvml.so.1 not found"), std::string::npos) << s.reason();
}

TEST(Nvml, LibraryWithoutNvmlIsRefused) {
  PowerSampler s(Device::CUDA, 0, "libm.so.6");
  EXPECT_FALSE(s.available());
  EXPECT_NE(s.reason().find("lacks nvmlInit_v2"), std::string::npos) << s.reason();
  EXPECT_EQ(s.sample().valid, 0);
}

TEST(Nvml, NoDeviceBound) {
  PowerSampler s(Device::CUDA, -1);
  EXPECT_FALSE(s.available());
  EXPECT_FALSE(s.reason().empty());
}

TEST_F(FakeNvml, ReadsWattsPercentAndMebibytes) {
  PowerSampler s(Device::CUDA, 1, DFLASH_FAKE_NVML);
  ASSERT_TRUE(s.available()) << s.reason();
  EXPECT_EQ(s.reason(), "");
  const GpuReading g = s.sample();
  ASSERT_EQ(g.valid, 1) << s.last_error();
  EXPECT_NEAR(g.power_w, 412.345, 1e-3);
  EXPECT_FLOAT_EQ(g.util_pct, 87.0f);
  EXPECT_FLOAT_EQ(g.mem_used_mib, 1536.0f);
  EXPECT_FLOAT_EQ(g.mem_total_mib, 81920.0f);
#ifndef DFLASH_HAVE_CUDA
  EXPECT_EQ(counter(2), 1);  // without the CUDA runtime the CUDA ordinal is the NVML index
#endif
}

TEST_F(FakeNvml, ShutsNvmlDownOnDestruction) {
  const int inits = counter(0), shutdowns = counter(1);
  { PowerSampler s(Device::CUDA, 0, DFLASH_FAKE_NVML); }
  EXPECT_EQ(counter(0), inits + 1);
  EXPECT_EQ(counter(1), shutdowns + 1);
}

TEST_F(FakeNvml, ReusesAReadingOnlyWhileYoung) {
  PowerSampler s(Device::CUDA, 0, DFLASH_FAKE_NVML);
  ASSERT_TRUE(s.available()) << s.reason();
  EXPECT_NEAR(s.sample().power_w, 412.345, 1e-3);
  configure_(0, 2, 0, 100000, 5, 80 * kGiB, 2 * kGiB);
  EXPECT_NEAR(s.sample_at_most_every(3600).power_w, 412.345, 1e-3);  // younger than an hour: reused
  EXPECT_NEAR(s.sample_at_most_every(0).power_w, 100.0, 1e-3);       // no reuse: fresh
  EXPECT_NEAR(s.sample().power_w, 100.0, 1e-3);
}

TEST_F(FakeNvml, DriverNotLoadedIsTheReason) {
  configure_(9, 2, 0, 1000, 0, kGiB, 0);
  PowerSampler s(Device::CUDA, 0, DFLASH_FAKE_NVML);
  EXPECT_FALSE(s.available());
  EXPECT_NE(s.reason().find("nvmlInit_v2 failed"), std::string::npos) << s.reason();
  EXPECT_NE(s.reason().find("Driver Not Loaded"), std::string::npos) << s.reason();
  EXPECT_EQ(s.sample().valid, 0);
}

TEST_F(FakeNvml, PowerNotSupportedMeansNoColumn) {
  configure_(0, 2, 3, 0, 50, kGiB, 0);
  PowerSampler s(Device::CUDA, 0, DFLASH_FAKE_NVML);
  EXPECT_FALSE(s.available());
  EXPECT_NE(s.reason().find("first reading failed"), std::string::npos) << s.reason();
  EXPECT_NE(s.reason().find("Not Supported"), std::string::npos) << s.reason();
}

TEST_F(FakeNvml, FailedQueryLaterGivesAnInvalidReading) {
  PowerSampler s(Device::CUDA, 0, DFLASH_FAKE_NVML);
  ASSERT_TRUE(s.available()) << s.reason();
  configure_(0, 2, 3, 0, 50, kGiB, 0);
  EXPECT_EQ(s.sample().valid, 0);
  EXPECT_NE(s.last_error().find("nvmlDeviceGetPowerUsage"), std::string::npos) << s.last_error();
  EXPECT_TRUE(s.available());  // a transient failure skips one row; it does not end the series
}

#ifndef DFLASH_HAVE_CUDA
TEST_F(FakeNvml, DeviceBeyondTheDriversCountIsNamed) {
  PowerSampler s(Device::CUDA, 5, DFLASH_FAKE_NVML);
  EXPECT_FALSE(s.available());
  EXPECT_NE(s.reason().find("nvmlDeviceGetHandleByIndex_v2(5)"), std::string::npos) << s.reason();
}
#endif

// ---- the /gpus column plan and rows ----------------------------------------------------------------

namespace {
GpuReading reading(float w, float util = 50, float used = 1000) {
  GpuReading g;
  g.valid = 1;
  g.power_w = w;
  g.util_pct = util;
  g.mem_used_mib = used;
  g.mem_total_mib = 80000;
  return g;
}
}  // namespace

TEST(GpuColumns, CpuBackendHasNoColumnsAndSaysSoInItsOwnWords) {
  const std::string cpu = PowerSampler(Device::CPU, -1).reason();
  const GpuColumns c = plan_gpu_columns({GpuReading{}, GpuReading{}, GpuReading{}}, {cpu, cpu, cpu}, {true, true, false});
  EXPECT_FALSE(c.available);
  EXPECT_EQ(c.reason, "CPU backend: no NVML");
  EXPECT_TRUE(c.ranks.empty());
}

TEST(GpuColumns, DifferentReasonsNameTheFirstRank) {
  const GpuColumns c = plan_gpu_columns({GpuReading{}, GpuReading{}}, {"nvmlInit_v2 failed", "other"}, {true, true});
  EXPECT_FALSE(c.available);
  EXPECT_EQ(c.reason, "no NVML reading on rank 0: nvmlInit_v2 failed");
}

TEST(GpuColumns, ReportingRanksOwnColumnsIdleOnesDoNot) {
  // ranks 0,1 target, 2 drafter, 3 idle (its GPU read at startup: gpu_idle_power_w)
  const GpuColumns c = plan_gpu_columns({reading(90), reading(91), reading(92), reading(80)},
                                        {"", "", "", ""}, {true, true, true, false});
  EXPECT_TRUE(c.available) << c.reason;
  EXPECT_EQ(c.ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(json_int_list(c.ranks), "[0,1,2]");
}

TEST(GpuColumns, ARankWithoutNvmlMakesTheSeriesUnavailableAndSaysWhich) {
  const GpuColumns c = plan_gpu_columns({reading(90), GpuReading{}, reading(92)},
                                        {"", "libnvidia-ml.so.1 not found", ""}, {true, true, true});
  EXPECT_FALSE(c.available);
  EXPECT_TRUE(c.ranks.empty());
  EXPECT_NE(c.reason.find("rank 1"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("libnvidia-ml.so.1 not found"), std::string::npos) << c.reason;
}

TEST(GpuColumns, AnIdleRankWithoutNvmlDoesNotMatter) {
  const GpuColumns c = plan_gpu_columns({reading(90), reading(91), GpuReading{}}, {"", "", "x"},
                                        {true, true, false});
  EXPECT_TRUE(c.available) << c.reason;
  EXPECT_EQ(c.ranks, (std::vector<int>{0, 1}));
}

TEST(GpuRow, SumsPowerAndKeepsColumnOrder) {
  const auto row = assemble_gpu_row({reading(400, 90, 5000), reading(650.5f, 99, 70000)});
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->power_w, (std::vector<double>{400, 650.5}));
  EXPECT_EQ(row->util_pct, (std::vector<double>{90, 99}));
  EXPECT_EQ(row->mem_used_mib, (std::vector<double>{5000, 70000}));
  EXPECT_DOUBLE_EQ(row->total_power_w, 1050.5);
}

TEST(GpuRow, AMissingReadingSkipsTheRow) {
  EXPECT_FALSE(assemble_gpu_row({reading(400), GpuReading{}}).has_value());
  EXPECT_FALSE(assemble_gpu_row({}).has_value());
}

TEST(GpuRow, IdlePowerIsTheMeanOfTheReadingsThereAre) {
  EXPECT_FALSE(mean_startup_power_w({GpuReading{}, GpuReading{}}).has_value());
  const auto w = mean_startup_power_w({reading(80), GpuReading{}, reading(90)});
  ASSERT_TRUE(w.has_value());
  EXPECT_DOUBLE_EQ(*w, 85.0);
}
