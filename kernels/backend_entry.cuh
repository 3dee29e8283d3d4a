// The CUDA backend's entry points (src/core/cuda/backend.cpp defines them): plain C++, so core/cuda_entry.h
// can put them in the CUDA library's table; code outside the library reaches them only through that table
// (kernels/backend.cuh has the rest of the backend, which names the CUDA runtime).
#pragma once
#include <cstddef>
#include <string>

#include "dflash/tensor.h"

namespace dflash::cuda {

int device_count();  // visible CUDA devices (0 without any)
// A context on device `gpu` (made current on this thread): its stream, cuBLASLt handle and workspace.
// lane 0 is the rank's compute context; lane 1 a second one on the same GPU with its own stream, handle and
// workspace (a colocated rank's target computes on it while its drafter uses lane 0: include/dflash/backend.h).
Ctx context(int gpu, int lane);
// Deterministic kernels (dflash::set_deterministic_kernels): a process-wide switch, read by launchers.
void set_deterministic(bool on);
bool deterministic();
// Fatal (BadInput) if a kernel flagged an error since the last check; call after a stream sync.
void check_device_errors(const Ctx& ctx);
// Raw copies on the context's stream (cudaMemcpyDefault decides the direction). Copies that land in
// host memory are complete on return.
void copy_bytes(const Ctx& ctx, void* dst, const void* src, size_t bytes);
void synchronize_stream(const Ctx& ctx);
// The PCI bus id of CUDA device `device` ("" when CUDA cannot name it): NVML's handle for the same board.
std::string pci_bus_id(int device);

}  // namespace dflash::cuda
