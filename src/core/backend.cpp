#include "dflash/backend.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_entry.h"
#include "dflash/error.h"

namespace dflash {

namespace {
bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// Host-side conversion of n floating elements from src_type to dst_type.
void convert_host(void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  if (dst_type == src_type) {
    std::memcpy(dst, src, n * dtype_size(dst_type));
    return;
  }
  if (dst_type == DType::F32) {  // straight into dst: no intermediate copy (logits downloads are 100s of MB)
    to_f32(static_cast<float*>(dst), src, src_type, n);
    return;
  }
  std::vector<float> f32;
  const float* from = static_cast<const float*>(src);
  if (src_type != DType::F32) {
    f32.resize(n);
    to_f32(f32.data(), src, src_type, n);
    from = f32.data();
  }
  if (dst_type == DType::BF16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(from[i]);
  } else {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(from[i]);
  }
}
}  // namespace

DType compute_dtype(Device device) { return device == Device::CPU ? DType::F32 : DType::BF16; }

int cuda_device_count() { return cuda::in_build() ? cuda::library->device_count() : 0; }

BackendDefault default_backend() {
  if (!cuda::in_build()) return {Device::CPU, "this build has no CUDA backend"};
  const int gpus = cuda_device_count();
  if (gpus == 0) return {Device::CPU, "this build has CUDA but sees no GPU"};
  return {Device::CUDA, "this build has CUDA and sees " + std::to_string(gpus) + " GPU(s)"};
}

namespace {
// Recorded without the CUDA library (the CPU backend is deterministic anyway), so the switch reads back.
bool g_deterministic_no_cuda = false;
}  // namespace

void set_deterministic_kernels(bool on) {
  if (cuda::in_build()) return cuda::library->set_deterministic(on);
  g_deterministic_no_cuda = on;
}

bool deterministic_kernels() { return cuda::in_build() ? cuda::library->deterministic() : g_deterministic_no_cuda; }

Ctx make_ctx(Device device, int gpu) {
  if (device == Device::CPU) return cpu_ctx();
  return cuda::library_for("a CUDA context was requested").context(gpu, 0);
}

Ctx colocated_target_ctx(Device device, int gpu) {
  if (device == Device::CPU) return cpu_ctx();
  return cuda::library_for("a second CUDA context was requested").context(gpu, 1);
}

void synchronize(const Ctx& ctx) {
  if (ctx.device == Device::CPU) return;
  cuda::library_for("synchronize").synchronize_stream(ctx);
}

void check_device_errors(const Ctx& ctx) {
  if (ctx.device == Device::CPU) return;
  cuda::library_for("check_device_errors").check_device_errors(ctx);
}

void copy_tensor(const Ctx& ctx, const Tensor& dst, const Tensor& src) {
  DF_CHECK(dst.numel() == src.numel(), Internal,
           "copy_tensor: dst " << dst.shape_str() << " and src " << src.shape_str() << " differ in size");
  DF_CHECK(dst.dtype == src.dtype || (is_float(dst.dtype) && is_float(src.dtype)), Internal,
           "copy_tensor: cannot convert " << dtype_name(src.dtype) << " to " << dtype_name(dst.dtype));
  size_t n = dst.numel();
  if (n == 0) return;
  bool host_only = dst.device == Device::CPU && src.device == Device::CPU;
  if (host_only) {
    convert_host(dst.data, dst.dtype, src.data, src.dtype, n);
    return;
  }
  DF_CHECK(ctx.device == Device::CUDA, Internal, "copy_tensor: a device tensor needs a CUDA context");
  const auto copy_bytes = cuda::library_for("copy_bytes").copy_bytes;
  if (dst.dtype == src.dtype) {
    copy_bytes(ctx, dst.data, src.data, dst.nbytes());
  } else if (src.device == Device::CPU) {  // convert on the host, then upload
    std::vector<char> staged(dst.nbytes());
    convert_host(staged.data(), dst.dtype, src.data, src.dtype, n);
    copy_bytes(ctx, dst.data, staged.data(), staged.size());
    synchronize(ctx);  // staged must outlive the copy
  } else if (dst.device == Device::CPU) {  // download, then convert on the host
    // default-initialised (not zeroed): every byte is overwritten by the download
    const std::unique_ptr<char[]> staged(new char[src.nbytes()]);
    copy_bytes(ctx, staged.get(), src.data, src.nbytes());
    convert_host(dst.data, dst.dtype, staged.get(), src.dtype, n);
  } else {
    fatal(ExitCode::Internal, "copy_tensor: device-to-device dtype conversion is not supported");
  }
}

}  // namespace dflash
