// The CUDA backend (kernels/backend.cuh) and its entry points (kernels/backend_entry.cuh).
#include "backend.cuh"

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_check.cuh"
#include "device_limits.cuh"
#include "device_memory.cuh"

namespace dflash::cuda {

namespace {
// 32 MiB: what cuBLASLt's Hopper kernels ask for at most on large bf16 GEMMs.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

std::atomic<bool> g_deterministic{false};

void allocate_det_scratch(Backend& b) {
  if (b.det_scratch) return;
  b.det_scratch_floats = size_t(kDetScratchBlocksPerSm) * size_t(b.sm_count) * kDetScratchCols;
  DF_CUDA(cudaSetDevice(b.device));
  DF_CUDA(cudaMalloc(&b.det_scratch, b.det_scratch_floats * sizeof(float)));
}

std::unique_ptr<Backend> create_backend(int gpu) {
  int count = device_count();
  DF_CHECK_HINT(gpu >= 0 && gpu < count, DeviceFailure,
                "CUDA device " << gpu << " requested but " << count << " visible",
                "check CUDA_VISIBLE_DEVICES and that the job binds one rank per GPU");
  DF_CUDA(cudaSetDevice(gpu));
  auto b = std::make_unique<Backend>();
  b->device = gpu;
  DF_CUDA(cudaDeviceGetAttribute(&b->sm_count, cudaDevAttrMultiProcessorCount, gpu));
  DF_CUDA(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
  DF_CUBLAS(cublasLtCreate(&b->lt));
  DF_CUDA(cudaMalloc(&b->workspace, kWorkspaceBytes));
  b->workspace_bytes = kWorkspaceBytes;
  DF_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&b->error_flags_host), sizeof(int), cudaHostAllocMapped));
  *b->error_flags_host = 0;
  DF_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&b->error_flags_dev), b->error_flags_host, 0));
  if (deterministic()) allocate_det_scratch(*b);
  return b;
}
}  // namespace

int device_count() {
  install_device_runtime();
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

namespace {
constexpr int kLanes = 2;  // the rank's compute context, and a colocated target's (backend_entry.cuh)
std::mutex g_backends_mu;
std::vector<std::unique_ptr<Backend>> g_backends;  // [gpu * kLanes + lane]; never destroyed: lives as long as the process

Backend& backend_for_lane(int gpu, int lane) {
  DF_CHECK(lane >= 0 && lane < kLanes, Internal, "CUDA context lane " << lane);
  std::lock_guard<std::mutex> lock(g_backends_mu);
  const size_t i = static_cast<size_t>(gpu) * kLanes + static_cast<size_t>(lane);
  if (gpu >= 0 && i < g_backends.size() && g_backends[i]) return *g_backends[i];
  install_device_runtime();
  auto b = create_backend(gpu);
  // Said once per device, so a run (or a test log) under DFLASH_DEVICE_LIMITS shows it was not the real GPU's.
  const DeviceLimits& limits = device_limits(gpu);
  if (lane == 0 && limits.source == LimitsSource::ForcedSm120) std::fprintf(stderr, "[dflash] %s\n", describe(limits).c_str());
  if (g_backends.size() <= i) g_backends.resize(i + 1);
  g_backends[i] = std::move(b);
  return *g_backends[i];
}
}  // namespace

Backend& backend_for_device(int gpu) { return backend_for_lane(gpu, 0); }

void set_deterministic(bool on) {
  std::lock_guard<std::mutex> lock(g_backends_mu);
  g_deterministic = on;
  if (on)
    for (auto& b : g_backends)
      if (b) allocate_det_scratch(*b);
}

bool deterministic() { return g_deterministic; }

Backend& backend_of(const Ctx& ctx) {
  DF_CHECK(ctx.device == Device::CUDA && ctx.backend != nullptr, Internal,
           "a CUDA op was given a context that is not a CUDA context (make it with make_ctx(Device::CUDA, gpu))");
  return *static_cast<Backend*>(ctx.backend);
}

void check_device_errors(const Backend& b) {
  int flags = *reinterpret_cast<volatile int*>(b.error_flags_host);
  if (flags == 0) return;
  *b.error_flags_host = 0;
  if (flags & kBadTokenId)
    DF_FAIL(BadInput, "a token id outside [0, vocab_size) reached the embedding on GPU " << b.device,
            "the dataset was tokenized for another vocabulary: re-tokenize it for this target model");
  DF_FAIL(Internal, "device error flags " << flags << " set on GPU " << b.device, "");
}

void check_device_errors(const Ctx& ctx) { check_device_errors(backend_of(ctx)); }

Ctx context(int gpu, int lane) {
  Backend& b = backend_for_lane(gpu, lane);
  DF_CHECK(cudaSetDevice(gpu) == cudaSuccess, DeviceFailure, "cudaSetDevice(" << gpu << ") failed");
  Ctx ctx;
  ctx.device = Device::CUDA;
  ctx.stream = b.stream;
  ctx.backend = &b;
  return ctx;
}

std::string pci_bus_id(int device) {
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) != cudaSuccess) {
    cudaGetLastError();  // not sticky, but keep the next call's error its own
    return "";
  }
  return bus;
}

void copy_bytes(const Ctx& ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  cudaPointerAttributes attr{};
  DF_CUDA(cudaPointerGetAttributes(&attr, dst));
  bool dst_on_host = attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged;
  DF_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(ctx)));
  if (dst_on_host) DF_CUDA(cudaStreamSynchronize(stream_of(ctx)));
}

void synchronize_stream(const Ctx& ctx) {
  Backend& b = backend_of(ctx);
  DF_CUDA(cudaStreamSynchronize(b.stream));
  check_device_errors(b);
}

}  // namespace dflash::cuda
