// The CUDA library's entry points: every function of the CUDA backend that code outside it calls (the op
// layer, the backend context, the drafter trainer, the metrics sampler). Always declared, so callers choose
// with a plain `if (ctx.device == Device::CUDA) return cuda::op(...)`; a CUDA build defines them in the
// CUDA library (kernels/*.cu, src/**/cuda/), a CPU-only build in src/core/cuda_entry_stub.cpp, where each
// is a fatal BadOptions error "<what>: this build has no CUDA backend" (exit 2) with the fix.
//
// Plain C++, no CUDA header, so the op layer compiles the same in both builds. The ops' twins are declared,
// each with its contract, in their op's own header kernels/<op>.cuh (plain C++ too, included here; one op,
// one file pair); the backend's entry points below (kernels/backend.cuh includes this header for them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "adamw.cuh"
#include "attention.cuh"
#include "block_attention.cuh"
#include "causal_conv1d.cuh"
#include <mpi.h>

#include "dflash/tensor.h"
#include "embedding.cuh"
#include "gated_delta_rule.cuh"
#include "gated_rmsnorm.cuh"
#include "gdn_gates.cuh"
#include "grouped_conv.cuh"
#include "grad_accum.cuh"
#include "head_norm_rope.cuh"
#include "lm_loss.cuh"
#include "matmul.cuh"
#include "qkv_norm_rope.cuh"
#include "rmsnorm.cuh"
#include "selector.cuh"
#include "sigmoid_gate.cuh"
#include "swiglu.cuh"

namespace dflash::train {
struct EngineSetup;
class TrainerEngine;
// The drafter trainer's CUDA engine (src/drafter/cuda/trainer_engine_cuda.cpp; drafter/trainer_engine.h).
std::unique_ptr<TrainerEngine> make_cuda_trainer_engine(EngineSetup setup);
}  // namespace dflash::train

namespace dflash::cuda {

// Whether this build has the CUDA backend (false from the stub).
bool in_build();

// ---- the backend (src/core/cuda/backend.cpp) ------------------------------------------------------
int device_count();  // visible CUDA devices (0 without any)
// A context on device `gpu` (made current on this thread): its stream, cuBLASLt handle and workspace.
Ctx context(int gpu);
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

// ---- NCCL (src/comm/cuda/): the data plane's pair communicators, the plane, the gradient reducer --------
namespace dflash {
class NcclPairs;
class DataPlane;
struct DataPlaneSpec;
class GradientReducer;
struct GradRange;
struct Topology;
// Every target-drafter pair's communicator; on failure null and *error says why (the stub: no NCCL).
std::shared_ptr<NcclPairs> make_nccl_pairs(const Topology& topo, const Ctx& ctx, double timeout_s, std::string* error);
// The nccl data plane (DataPlaneKind::Nccl; declared with the others in dflash/data_plane.h).
std::unique_ptr<DataPlane> make_nccl_data_plane(const DataPlaneSpec& spec);
// The drafters' gradient sum by ncclAllReduce, one per bucket, overlapping the backward.
std::unique_ptr<GradientReducer> make_nccl_reducer(MPI_Comm drafter_comm, const Ctx& ctx, std::vector<GradRange> buckets,
                                                   double timeout_s);
}  // namespace dflash
