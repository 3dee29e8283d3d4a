// Summing the drafters' gradients (docs/pipeline.md "Gradients"). One flat fp32 buffer per drafter, on
// the device its trainer runs on, cut into buckets (contiguous ranges, a pure function of the parameter
// layout and --grad-bucket-mb, so every drafter has the same ones in the same order). A reducer sums the
// buckets in place over the drafters' communicator as the backward finalises them (as PyTorch DDP does),
// without blocking: begin_step() opens a step, ready() reports what the backward has finalised and
// launches every bucket that became whole, done() drives and tests, so the caller keeps MPI progress and
// its deadlines going while it waits (NCCL's own guidance). Each bucket is multiplied by the step's
// prescale just before its sum (the local loss weight sum: one global normalisation, see role_drafter.cpp);
// the final division by the global sum stays with the caller.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "dflash/tensor.h"

namespace dflash {

enum class GradReduceKind : uint8_t {
  HostMpi,  // MPI_Iallreduce on host memory (device gradients staged through page-locked buffers)
  Nccl,     // ncclAllReduce on the device, over a communicator of the drafters (one GPU each)
};
const char* grad_reduce_name(GradReduceKind k);

// A contiguous range [begin, end) of the flat gradient, in elements.
struct GradRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
  bool operator==(const GradRange& o) const { return begin == o.begin && end == o.end; }
};

// The buckets of a gradient whose parameters occupy `params` (ranges that tile [0, P) exactly, in any
// order; anything else is an Internal error). Walking the parameters from the last to the first (the
// order a backward finalises them: the drafter's last layer first, fc and hidden_norm last), consecutive
// parameters are merged while the bucket stays within cap_elements; a parameter larger than the cap is a
// bucket of its own. cap_elements 0: one bucket [0, P) (summed once the whole backward is done). The
// result is in launch order (descending offsets) and covers [0, P) exactly once.
std::vector<GradRange> plan_grad_buckets(std::vector<GradRange> params, size_t cap_elements);
// --grad-bucket-mb in elements of fp32 (MiB; 0 stays 0, any positive cap is at least one element).
size_t grad_bucket_elements(double cap_mb);

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual GradReduceKind kind() const = 0;
  // The plan, in launch order.
  const std::vector<GradRange>& buckets() const { return buckets_; }

  // Opens a step: grads (F32 [P] on the trainer's device, P = the plan's size) is summed bucket by bucket,
  // each bucket multiplied by `prescale` on the reducer's side just before its sum. From here until done()
  // returns true nothing but the backward may write grads and nothing may read it.
  void begin_step(const Tensor& grads, float prescale);
  // [begin, end) of grads holds its final value once the work enqueued so far on the trainer's context
  // has run. Launches, in plan order, every bucket that is now wholly final (a bucket waits for the ones
  // before it: the drafters' collectives must match). Never waits. Every element of [0, P) is reported
  // exactly once per step, in any pieces.
  void ready(size_t begin, size_t end);
  // Drives the sums; true once every bucket was reported and summed and the trainer's context is ordered
  // after the sums (the optimizer may read grads). Calling it before every element was reported is an
  // Internal error. A communication failure is fatal (DeviceFailure).
  bool done();
  // One piece, as before buckets: begin_step(grads, prescale) + ready(0, P).
  void start(const Tensor& grads, float prescale = 1.0f);
  // A peer is lost: abandon the collectives so this rank can report and exit (NCCL: ncclCommAbort).
  virtual void abort() = 0;
  // Buckets launched in the current (or last) step.
  size_t launched() const { return next_; }

 protected:
  explicit GradientReducer(std::vector<GradRange> buckets);
  const Tensor& grads() const { return grads_; }
  float prescale() const { return prescale_; }
  // grads restricted to bucket i (a flat F32 view on the trainer's device).
  Tensor bucket_view(size_t i) const;
  // A step opens (grads() and prescale() are set; every earlier step is done).
  virtual void on_begin_step() {}
  // Bucket i is final as of the work enqueued so far on the trainer's context: scale it by prescale() and
  // start its sum. Called in plan order, once per bucket and step.
  virtual void launch(size_t i) = 0;
  // Drives the launched sums without waiting; true once every launched sum is complete and ordered before
  // later work on the trainer's context.
  virtual bool progress() = 0;

 private:
  std::vector<GradRange> buckets_;
  std::vector<size_t> by_begin_;  // bucket indices by ascending begin (for ready's lookup)
  std::vector<size_t> ready_;     // elements of each bucket reported final this step
  size_t next_ = 0;               // the next bucket to launch
  bool open_ = false;             // a step is open (begin_step .. done() == true)
  Tensor grads_;
  float prescale_ = 1.0f;
};

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
