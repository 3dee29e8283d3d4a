#include "dflash/tensor.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "base/device_runtime.h"
#include "dflash/error.h"

namespace dflash {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::U8: return 1;
    case DType::I64: return 8;
    case DType::F8E4M3: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
    case DType::I64: return "I64";
    case DType::F8E4M3: return "F8_E4M3";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

Tensor::Tensor(void* p, DType t, Device d, std::initializer_list<int64_t> dims) : data(p), dtype(t), device(d) {
  DF_ASSERT(dims.size() <= static_cast<size_t>(kMaxDims));
  for (int64_t v : dims) shape[ndim++] = v;
}

size_t Tensor::numel() const {
  size_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= static_cast<size_t>(shape[i]);
  return ndim == 0 ? 0 : n;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

template <class T> T* Tensor::ptr() const {
  DF_CHECK(dtype == dtype_of<T>(), Internal,
           "tensor of dtype " << dtype_name(dtype) << " read as " << dtype_name(dtype_of<T>()));
  return static_cast<T*>(data);
}
template float* Tensor::ptr<float>() const;
template int32_t* Tensor::ptr<int32_t>() const;
template uint8_t* Tensor::ptr<uint8_t>() const;
template int64_t* Tensor::ptr<int64_t>() const;

Tensor Tensor::reshape(std::initializer_list<int64_t> dims) const {
  Tensor r(data, dtype, device, dims);
  DF_CHECK(r.numel() == numel(), Internal, "reshape " << shape_str() << " -> " << r.shape_str());
  return r;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  DF_CHECK(ndim >= 1 && begin >= 0 && begin <= end && end <= shape[0], Internal,
           "slice_rows [" << begin << ", " << end << ") of " << shape_str());
  Tensor r = *this;
  size_t row = numel() / static_cast<size_t>(shape[0] ? shape[0] : 1) * dtype_size(dtype);
  r.data = static_cast<char*>(data) + row * static_cast<size_t>(begin);
  r.shape[0] = end - begin;
  return r;
}

Tensor cpu_view(float* p, std::initializer_list<int64_t> dims) { return Tensor(p, DType::F32, Device::CPU, dims); }
Tensor cpu_view(const float* p, std::initializer_list<int64_t> dims) {
  return Tensor(const_cast<float*>(p), DType::F32, Device::CPU, dims);
}
Tensor cpu_view(int32_t* p, std::initializer_list<int64_t> dims) { return Tensor(p, DType::I32, Device::CPU, dims); }
Tensor cpu_view(const int32_t* p, std::initializer_list<int64_t> dims) {
  return Tensor(const_cast<int32_t*>(p), DType::I32, Device::CPU, dims);
}

Buffer::Buffer(Device dev, DType t, std::initializer_list<int64_t> dims) {
  view_ = Tensor(nullptr, t, dev, dims);
  size_t bytes = view_.nbytes();
  if (bytes == 0) return;
  if (dev == Device::CPU) {
    size_t rounded = (bytes + 63) / 64 * 64;
    view_.data = std::aligned_alloc(64, rounded);
    DF_CHECK(view_.data != nullptr, SystemFailure, "out of host memory allocating " << bytes << " bytes");
  } else {
    view_.data = device_runtime_for("a CUDA buffer").alloc(bytes);
  }
}

Buffer::Buffer(Buffer&& o) noexcept : view_(o.view_) { o.view_ = Tensor(); }
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    view_ = o.view_;
    o.view_ = Tensor();
  }
  return *this;
}
Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (!view_.data) return;
  if (view_.device == Device::CPU) {
    std::free(view_.data);
  } else {
    device_runtime()->free(view_.data);  // a device buffer exists only where a runtime made it
  }
  view_.data = nullptr;
}

void Buffer::zero() {
  if (!view_.data) return;
  if (view_.device == Device::CPU) {
    std::memset(view_.data, 0, view_.nbytes());
  } else {
    device_runtime()->zero(view_.data, view_.nbytes());
  }
}

// ---- 16-bit float conversions ---------------------------------------------------------------------
uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {                                              // subnormal or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    int shift = 113 - static_cast<int>(absx >> 23) + 13;
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t h = ((absx - 0x38000000u) >> 13);
  uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void to_f32(float* dst, const void* src, DType src_type, size_t n) {
  switch (src_type) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    default: fatal(ExitCode::Internal, std::string("to_f32 from ") + dtype_name(src_type));
  }
}

}  // namespace dflash
