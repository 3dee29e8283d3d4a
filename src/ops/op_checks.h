// Shared argument checks and backend dispatch helpers for the op layer (src/ops/*.cpp).
//
// Every public op validates its arguments here (a mismatch is a bug in the caller: ExitCode::Internal),
// then dispatches on ctx.device: `if (ctx.device == Device::CUDA) return cuda::library_for(op).op(...);` (the
// CUDA twin, through the CUDA library's table, core/cuda_entry.h), then its CPU reference.
#pragma once
#include <initializer_list>
#include <string>

#include "base/device_runtime.h"  // fatal_no_cuda
#include "core/cuda_entry.h"
#include "dflash/error.h"
#include "dflash/tensor.h"

namespace dflash::ops::detail {

// Fatal (BadOptions) for an op run on the CUDA backend that has no CUDA twin: "this build has no CUDA
// backend" in a CPU-only build, else "CUDA backend not built for this op". Ops with a twin call it
// instead: `if (ctx.device == Device::CUDA) return cuda::library_for(op).op(...);` (core/cuda_entry.h).
[[noreturn]] inline void cuda_op_missing(const char* op) {
  if (!cuda::in_build()) fatal_no_cuda(op);
  fatal(ExitCode::BadOptions, std::string(op) + ": CUDA backend not built for this op",
        "run with --backend cpu, or use a build whose kernels/ implement this op");
}

// The tensor must be present, on the context's device, of the given rank.
inline void check_tensor(const char* op, const char* arg, const Tensor& t, const Ctx& ctx, int ndim) {
  DF_CHECK(!t.empty(), Internal, op << ": argument '" << arg << "' is empty");
  DF_CHECK(t.device == ctx.device, Internal,
           op << ": argument '" << arg << "' lives on " << device_name(t.device) << " but the op runs on "
              << device_name(ctx.device));
  DF_CHECK(t.ndim == ndim, Internal,
           op << ": argument '" << arg << "' has shape " << t.shape_str() << ", expected " << ndim << " dims");
}

// Exact shape check: shape {a, b, ...}; a negative entry matches anything.
inline void check_shape(const char* op, const char* arg, const Tensor& t, std::initializer_list<int64_t> dims) {
  bool ok = t.ndim == static_cast<int>(dims.size());
  int i = 0;
  for (int64_t d : dims) {
    if (ok && d >= 0 && t.shape[i] != d) ok = false;
    ++i;
  }
  std::string want = "[";
  i = 0;
  for (int64_t d : dims) want += (i++ ? ", " : "") + (d < 0 ? std::string("*") : std::to_string(d));
  DF_CHECK(ok, Internal, op << ": argument '" << arg << "' has shape " << t.shape_str() << ", expected " << want
                            << "]");
}

// Whether the byte ranges of a and b intersect (ops that write an output while still reading an input).
inline bool overlaps(const Tensor& a, const Tensor& b) {
  const char *pa = static_cast<const char*>(a.data), *pb = static_cast<const char*>(b.data);
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// On the CPU backend activations and weights are float32; index tensors are int32.
inline void check_cpu_dtype(const char* op, const char* arg, const Tensor& t, DType want) {
  DF_CHECK(t.dtype == want, Internal,
           op << ": argument '" << arg << "' is " << dtype_name(t.dtype) << ", the CPU backend needs "
              << dtype_name(want));
}

}  // namespace dflash::ops::detail
