// Device limits (kernels/device_limits.cuh): what the launch check reports and refuses, and which kernel
// variants a device chooses. Run twice by `ctest -L gpu`: as the device is, and as gpu.sm120_limits with
// DFLASH_DEVICE_LIMITS=sm_120, where an H100/H200 must choose exactly what an RTX PRO 6000 Blackwell
// (99 KB shared memory per block) would, and the whole GPU suite must pass with every launch checked
// against those limits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "attention.cuh"
#include "block_attention.cuh"
#include "device_limits.cuh"
#include "gated_delta_rule.cuh"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using cuda::AttentionKernel;
using test::gpu;

__global__ void dynamic_smem_probe_kernel(int* out) {
  extern __shared__ int probe_smem[];
  probe_smem[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) *out = probe_smem[blockDim.x - 1];
}

bool forced_sm120() {
  const char* e = std::getenv("DFLASH_DEVICE_LIMITS");
  return e && (std::string(e) == "sm_120" || std::string(e) == "sm120");
}

TEST(GpuDeviceLimits, ReportsTheDeviceOrTheForcedLimits) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const cuda::DeviceLimits& l = cuda::current_device_limits();
  std::printf("[limits] %s\n", cuda::describe(l).c_str());
  EXPECT_GE(l.cc_major, 8);
  EXPECT_GE(l.max_threads_per_block, 1024);
  EXPECT_GE(l.regs_per_block, 65536);
  EXPECT_GT(l.smem_per_sm, 0u);
  int real = 0;
  cudaDeviceGetAttribute(&real, cudaDevAttrMaxSharedMemoryPerBlockOptin, l.device);
  if (forced_sm120()) {
    EXPECT_EQ(l.source, cuda::LimitsSource::ForcedSm120);
    EXPECT_LE(l.smem_per_block_optin, cuda::kSm120SmemPerBlockOptin);
    EXPECT_LE(l.max_threads_per_sm, cuda::kSm120MaxThreadsPerSm);
    EXPECT_NE(cuda::describe(l).find("forced to sm_120"), std::string::npos);
  } else {
    EXPECT_EQ(l.source, cuda::LimitsSource::Device);
    EXPECT_EQ(l.smem_per_block_optin, static_cast<size_t>(real));
  }
}

// The check can fail: one byte over the limit does not fit; at the limit a real launch runs.
TEST(GpuDeviceLimits, LaunchCheckRefusesOneByteOverTheLimit) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const cuda::DeviceLimits& l = cuda::current_device_limits();
  const size_t limit = l.smem_per_block_optin;
  EXPECT_TRUE(cuda::launch_fits(dynamic_smem_probe_kernel, 256, limit, l.device));
  EXPECT_FALSE(cuda::launch_fits(dynamic_smem_probe_kernel, 256, limit + 1, l.device));
  EXPECT_FALSE(cuda::launch_fits(dynamic_smem_probe_kernel, l.max_threads_per_block + 32, 1024, l.device));
  cuda::fit_launch(dynamic_smem_probe_kernel, "dynamic_smem_probe_kernel", 256, limit, l.device);
  Buffer out(Device::CUDA, DType::I32, {1});
  dynamic_smem_probe_kernel<<<1, 256, limit>>>(static_cast<int*>(out.t().data));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  int host = -1;
  cudaMemcpy(&host, out.t().data, sizeof(int), cudaMemcpyDeviceToHost);
  EXPECT_EQ(host, 255);
}

TEST(GpuDeviceLimitsDeathTest, FitLaunchIsFatalNamingTheKernel) {
  SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child re-executes: no CUDA state across fork
  EXPECT_DEATH(
      {
        const cuda::DeviceLimits& l = cuda::current_device_limits();
        cuda::fit_launch(dynamic_smem_probe_kernel, "dynamic_smem_probe_kernel", 256, l.smem_per_block_optin + 1,
                         l.device);
      },
      "dynamic_smem_probe_kernel does not fit device");
}

// Which variants the device gets: the big-shared-memory ones on an H100/H200/B200, the ones that fit
// 99 KB under sm_120 limits (each then runs in this suite's own tests against its CPU twin).
TEST(GpuDeviceLimits, ChoosesVariantsThatFit) {
  SKIP_WITHOUT_GPU();
  Ctx g = gpu();
  const cuda::DeviceLimits& l = cuda::current_device_limits();
  const bool small = l.smem_per_block_optin < 150 * 1024;
  const AttentionKernel k256 = cuda::attention_kernel_for(g, 256);
  EXPECT_EQ(k256, small ? AttentionKernel::Hd256Small : AttentionKernel::Hd256);
  EXPECT_TRUE(cuda::attention_kernel_fits(g, AttentionKernel::Hd128));
  EXPECT_EQ(cuda::attention_kernel_fits(g, AttentionKernel::Hd256), !small);
  // The 8B drafter's block attention (32/8 heads x 128, B 16): fused everywhere (sm_120: the compact dq
  // kernel); the 27B drafter's (24/4 x 256, B 16): fused only where 227 KB per block exist.
  EXPECT_TRUE(cuda::block_attention_fused_supported(32, 8, 128, 16));
  EXPECT_EQ(cuda::block_attention_fused_supported(24, 4, 256, 16), !small);
  // B 64 at head dim 128 needs the default dq kernel's 64-key tile (105 KB): fused only with big memory.
  EXPECT_EQ(cuda::block_attention_fused_supported(4, 4, 128, 64), !small);
  // The hybrid target's gated delta rule (16 key heads x 128): the pipelined scan where it fits.
  ops::GdnHeads hd{16, 128, 48, 128};
  std::printf("[limits] %s: hd 256 attention %s, 27B block attention %s, gated delta rule scan %s\n",
              cuda::describe(l).c_str(), cuda::attention_kernel_name(k256),
              cuda::block_attention_fused_supported(24, 4, 256, 16) ? "fused" : "chunked",
              cuda::gated_delta_rule_scan_is_pipelined(g, hd) ? "pipelined" : "sync");
}

}  // namespace
}  // namespace dflash
