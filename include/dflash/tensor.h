// Device-agnostic tensor views, owning buffers and the execution context every op takes.
//
// Ops are plain functions `x_forward(ctx, out..., in...)` over Tensor views. The Ctx says which backend
// runs them (CPU float32, the reference; CUDA bf16) and on which stream, so a CUDA twin slots in beside
// each CPU op and is chosen at run time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

namespace dflash {

// F8E4M3: OCP e4m3fn bytes (FP8 checkpoints' weights, the FP8 wire; arithmetic in dflash/fp8.h).
enum class DType : uint8_t { F32, BF16, F16, I32, U8, I64, F8E4M3 };
enum class Device : uint8_t { CPU, CUDA };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
const char* device_name(Device d);

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }

constexpr int kMaxDims = 4;

// A non-owning view of contiguous (row-major) memory.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* p, DType t, Device d, std::initializer_list<int64_t> dims);

  size_t numel() const;
  size_t nbytes() const { return numel() * dtype_size(dtype); }
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  bool empty() const { return data == nullptr; }
  std::string shape_str() const;  // "[3, 64]"
  // Typed pointer; checks the dtype (a wrong dtype is a bug, reported through the fatal path).
  template <class T> T* ptr() const;
  // Same memory, new shape (numel must match).
  Tensor reshape(std::initializer_list<int64_t> dims) const;
  // Rows [begin, end) of the leading dimension.
  Tensor slice_rows(int64_t begin, int64_t end) const;
};

// Convenience views over host memory.
Tensor cpu_view(float* p, std::initializer_list<int64_t> dims);
Tensor cpu_view(const float* p, std::initializer_list<int64_t> dims);
Tensor cpu_view(int32_t* p, std::initializer_list<int64_t> dims);
Tensor cpu_view(const int32_t* p, std::initializer_list<int64_t> dims);

// Execution context: backend + stream (a cudaStream_t on CUDA) + backend handles.
struct Ctx {
  Device device = Device::CPU;
  void* stream = nullptr;   // cudaStream_t
  void* backend = nullptr;  // CUDA: cublasLt handle, workspace... (owned by the CUDA backend)
};
inline Ctx cpu_ctx() { return Ctx{}; }

// Owning buffer on a device. Allocate once, outside the training loop.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device dev, DType t, std::initializer_list<int64_t> dims);
  Buffer(Buffer&&) noexcept;
  Buffer& operator=(Buffer&&) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();
  const Tensor& t() const { return view_; }
  operator const Tensor&() const { return view_; }
  template <class T> T* ptr() const { return view_.ptr<T>(); }
  size_t numel() const { return view_.numel(); }
  void zero();

 private:
  void release();
  Tensor view_;
};

// ---- host-side conversions between float and the 16-bit formats (round to nearest even) ----------
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);
// Converts n elements of src (F32/BF16/F16) to float.
void to_f32(float* dst, const void* src, DType src_type, size_t n);

}  // namespace dflash
