// Summing the drafters' gradients (docs/pipeline.md "Gradients"). One flat fp32 buffer per drafter, on
// the device its trainer runs on; a reducer sums it in place over the drafters' communicator, without
// blocking: start() enqueues, done() drives and tests, so the caller keeps MPI progress and its
// deadlines going while it waits (NCCL's own guidance). The loss normalisation stays with the caller.
#pragma once
#include <mpi.h>

#include <memory>

#include "dflash/tensor.h"

namespace dflash {

enum class GradReduceKind : uint8_t {
  HostMpi,  // MPI_Iallreduce on host memory (device gradients staged through page-locked buffers)
  Nccl,     // ncclAllReduce on the device, over a communicator of the drafters (one GPU each)
};
const char* grad_reduce_name(GradReduceKind k);

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual GradReduceKind kind() const = 0;
  // Starts summing grads (F32 [P] on the context's device) over every drafter. grads must stay untouched
  // until done() returns true.
  virtual void start(const Tensor& grads) = 0;
  // Drives the sum; true once grads holds it. A communication failure is fatal (DeviceFailure).
  virtual bool done() = 0;
  // A peer is lost: abandon the collective so this rank can report and exit (NCCL: ncclCommAbort).
  virtual void abort() = 0;
};

// Collective over drafter_comm. ctx: the trainer's context (gradients live there). Nccl needs a CUDA
// context, one GPU per drafter and a CUDA build (else BadOptions); its communicator is set up here
// (unique id broadcast over drafter_comm), bounded by timeout_s.
std::unique_ptr<GradientReducer> make_gradient_reducer(GradReduceKind kind, MPI_Comm drafter_comm, const Ctx& ctx,
                                                       size_t max_elements, double timeout_s);

// Which kind a job uses: NCCL when the drafters run on CUDA, each on a GPU of its own (two NCCL ranks on
// one GPU is an NCCL error), host MPI otherwise. Collective over drafter_comm.
GradReduceKind choose_grad_reducer(MPI_Comm drafter_comm, const Ctx& ctx, const char* host, int gpu);

}  // namespace dflash
