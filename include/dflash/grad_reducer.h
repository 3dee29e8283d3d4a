// Summing the drafters' gradients (docs/pipeline.md "Gradients"). One flat fp32 buffer per drafter, on
// the device its trainer runs on, cut into buckets (contiguous ranges, a pure function of the parameter
// layout and --grad-bucket-mb, so every drafter has the same ones in the same order). A reducer sums the
// buckets in place over the drafters' communicator as the backward finalises them (as PyTorch DDP does),
// without blocking: begin_step() opens a step, ready() reports what the backward has finalised and
// launches every bucket that became whole, done() drives and tests, so the caller keeps MPI progress and
// its deadlines going while it waits (NCCL's own guidance). Each bucket is multiplied by the step's
// prescale just before its sum (the local loss weight sum: one global normalisation, see role_drafter.cpp);
// the final division by the global sum stays with the caller. This header: the reducers' factory
// (src/comm/grad_reducer.cpp, dflash_core); the plan and the base class are dflash/grad_buckets.h.
#pragma once
#include <mpi.h>

#include <memory>
#include <vector>

#include "dflash/grad_buckets.h"  // GradRange, GradientReducer, GradReduceKind (the base library's half)

namespace dflash {

const char* grad_reduce_name(GradReduceKind k);

// Collective over drafter_comm. ctx: the trainer's context (gradients live there); buckets: the plan
// (plan_grad_buckets), identical on every drafter. HostMpi sums on a duplicate of drafter_comm (its
// collectives never interleave with the caller's). Nccl needs a CUDA context, one GPU per drafter and a
// CUDA build (else BadOptions); its communicator is set up here (unique id broadcast over drafter_comm),
// bounded by timeout_s, and it sums on a stream of its own.
std::unique_ptr<GradientReducer> make_gradient_reducer(GradReduceKind kind, MPI_Comm drafter_comm, const Ctx& ctx,
                                                       std::vector<GradRange> buckets, double timeout_s);

// Which kind a job uses: NCCL when the drafters run on CUDA, each on a GPU of its own (two NCCL ranks on
// one GPU is an NCCL error: Topology::same_gpu), host MPI otherwise. The same answer on every drafter.
struct Topology;
GradReduceKind choose_grad_reducer(const Topology& topo, const Ctx& ctx);

// The Nccl kind (src/comm/cuda/nccl_reducer.cpp): a slot the CUDA library defines, null in a build without
// it (src/comm/no_cuda.cpp; src/core/cuda_entry.h tells the mechanism).
using MakeNcclReducer = std::unique_ptr<GradientReducer>(MPI_Comm drafter_comm, const Ctx& ctx,
                                                         std::vector<GradRange> buckets, double timeout_s);
extern MakeNcclReducer* const make_nccl_reducer;

}  // namespace dflash
