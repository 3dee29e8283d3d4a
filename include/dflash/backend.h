// Making an execution context (Ctx) for a backend, and moving tensors between host and device.
//
// On CUDA, make_ctx binds the GPU, and the context carries that device's stream, cuBLASLt handle and
// workspace (one set per device, created on first use, kept for the process's lifetime). Ops enqueue on
// ctx.stream and return at once; synchronize() waits for them and reports errors that kernels flagged
// (a token id outside the vocabulary).
#pragma once
#include <string>

#include "dflash/tensor.h"

namespace dflash {

// Number of visible CUDA devices (0 in a CPU-only build or with none).
int cuda_device_count();

// --backend's default (--backend auto): cuda where this build has the CUDA backend and a GPU is visible,
// else cpu; `why` says which of the two facts decided ("this build has no CUDA backend", "this build has
// CUDA and sees 8 GPU(s)"). Asks the CUDA library's table (src/core/cuda_entry.h), so a CPU-only build
// answers without any CUDA code.
struct BackendDefault {
  Device device = Device::CPU;
  std::string why;
};
BackendDefault default_backend();

// The dtype of activations, captured features and the hidden states on the wire: F32 on the CPU (the
// float32 reference), BF16 on CUDA. The one place this rule is written.
DType compute_dtype(Device device);

// CPU: the float32 reference backend. CUDA: device `gpu` (made current on this thread).
Ctx make_ctx(Device device, int gpu = 0);
// A second compute context on GPU `gpu`, with its own stream, cuBLASLt handle and workspace (made once
// per GPU, kept for the process's lifetime): a colocated rank's target computes on it, so its forward
// overlaps the drafter's step on make_ctx's (src/runtime/role_colocated.cpp). The CPU context on the CPU
// backend.
Ctx colocated_target_ctx(Device device, int gpu);

// Waits until everything enqueued on ctx has finished (no-op on CPU); fatal if a kernel flagged bad input.
void synchronize(const Ctx& ctx);

// Reports (fatal BadInput) what kernels flagged in work that has finished (a token id out of range);
// call it once an event shows the work done. No-op on CPU.
void check_device_errors(const Ctx& ctx);

// Deterministic kernels (--deterministic): when on, every CUDA kernel whose result depended on the order
// in which blocks finished (atomic float adds of partial sums: the block attention's dK/dV over anchor
// splits, the norms' weight gradients) sums in a fixed order instead, and GEMM algorithms are the
// heuristic's first choice rather than timed (a timing can pick differently run to run). The same inputs
// then give bit-identical results on the same GPU model. Set it before the first CUDA context is made
// (it sizes a scratch buffer per device). No-op on the CPU backend, which is deterministic anyway.
void set_deterministic_kernels(bool on);
bool deterministic_kernels();

// dst = src, element for element (same numel). Either side may live on the host or on ctx's device;
// floating types (F32, BF16, F16) convert into dst's dtype, other dtypes must match. Copies into host
// memory are complete on return; copies to the device are ordered on ctx's stream.
void copy_tensor(const Ctx& ctx, const Tensor& dst, const Tensor& src);

}  // namespace dflash
