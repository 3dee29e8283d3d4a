// Gradient reducers: the host-MPI reducer and the factory (the bucket plan and the bookkeeping every reducer
// shares are in src/base/grad_buckets.cpp; the NCCL reducer is in src/comm/cuda/, built with CUDA).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dflash/device_async.h"
#include "base/device_runtime.h"  // fatal_no_cuda
#include "core/cuda_entry.h"    // cuda::in_build
#include "dflash/error.h"
#include "dflash/grad_reducer.h"
#include "dflash/mpi_typed.h"
#include "dflash/optim.h"
#include "dflash/topology.h"

namespace dflash {

namespace {

// MPI_Iallreduce in place, one per bucket, on a duplicate of the drafters' communicator (so the buckets,
// issued while the caller runs its own collectives, never interleave with them). On the CPU backend the
// gradient itself is reduced. Device gradients are staged: on a copy stream, after an event marking the
// bucket final on the trainer's stream, the bucket is scaled and copied down to a page-locked buffer; its
// MPI_Iallreduce is issued once the copy is done (polled; in plan order on every drafter); the sum goes
// back up on the copy stream, and the trainer's stream waits for the last upload.
class HostMpiReducer final : public GradientReducer {
  enum class State : uint8_t { Idle, Downloading, Reducing, Uploading, Done };

 public:
  HostMpiReducer(MPI_Comm comm, const Ctx& ctx, std::vector<GradRange> buckets, double timeout_s)
      : GradientReducer(std::move(buckets)),
        ctx_(ctx),
        copy_(side_ctx(ctx)),
        staged_(ctx.device != Device::CPU),
        uploaded_(ctx) {
    MPI_Request r = MPI_REQUEST_NULL;
    DF_MPI(MPI_Comm_idup(comm, &comm_, &r));
    mpi::wait(r, timeout_s, [] { return std::string("lost peer: a drafter did not join the gradient communicator setup"); });
    const size_t n = this->buckets().size();
    state_.assign(n, State::Idle);
    req_.assign(n, MPI_REQUEST_NULL);
    if (staged_) {
      size_t P = 0;
      for (const GradRange& b : this->buckets()) P = std::max(P, b.end);
      host_ = HostBuffer(P * sizeof(float), HostMemory::Pinned);
      for (size_t i = 0; i < n; ++i) {
        final_.emplace_back(ctx);
        downloaded_.emplace_back(ctx);
      }
    }
  }
  ~HostMpiReducer() override {
    // A pending MPI collective cannot be cancelled (the job is then ending through fatal(): MPI_Abort).
    bool idle = true;
    for (MPI_Request r : req_) idle = idle && r == MPI_REQUEST_NULL;
    if (idle && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  GradReduceKind kind() const override { return GradReduceKind::HostMpi; }

  void abort() override { std::fill(state_.begin(), state_.end(), State::Idle); }

 protected:
  void on_begin_step() override {
    DF_CHECK(grads().device == ctx_.device, Internal, "gradients must be on the trainer's device");
    std::fill(state_.begin(), state_.end(), State::Idle);
    issued_ = summed_ = 0;
    final_recorded_ = false;
  }

  void launch(size_t i) override {
    const Tensor view = bucket_view(i);
    if (!staged_) {
      if (prescale() != 1.0f) ops::scale_inplace(ctx_, view, prescale());
      state_[i] = State::Downloading;  // "downloaded" at once: the buffer is the host's
      return;
    }
    final_[i].record(ctx_);  // the bucket is final here on the trainer's stream
    final_[i].order_before(copy_);
    if (prescale() != 1.0f) ops::scale_inplace(copy_, view, prescale());
    copy_bytes_async(copy_, host(i), view.data, view.nbytes());
    downloaded_[i].record(copy_);
    state_[i] = State::Downloading;
  }

  bool progress() override {
    const size_t n = buckets().size();
    // Sums are issued in plan order on every drafter (the collectives must match).
    while (issued_ < n && state_[issued_] == State::Downloading && (!staged_ || downloaded_[issued_].done())) {
      const GradRange& b = buckets()[issued_];
      req_[issued_] = mpi::iallreduce(staged_ ? host(issued_) : grads().ptr<float>() + b.begin, b.size(), MPI_SUM, comm_);
      state_[issued_++] = State::Reducing;
    }
    for (size_t i = 0; i < issued_; ++i) {
      if (state_[i] != State::Reducing || !mpi::test(req_[i])) continue;
      if (!staged_) {
        state_[i] = State::Done;
        ++summed_;
        continue;
      }
      const Tensor view = bucket_view(i);
      copy_bytes_async(copy_, view.data, host(i), view.nbytes());
      state_[i] = State::Uploading;
      ++summed_;
    }
    if (summed_ < n) return false;
    if (!staged_) return true;
    if (!final_recorded_) {
      // The optimizer (on the trainer's stream) reads the sums after the last upload; waiting for it
      // here keeps the staging buffer free for the next step.
      uploaded_.record(copy_);
      uploaded_.order_before(ctx_);
      final_recorded_ = true;
    }
    return uploaded_.done();
  }

 private:
  float* host(size_t i) const { return static_cast<float*>(host_.data()) + buckets()[i].begin; }

  MPI_Comm comm_ = MPI_COMM_NULL;
  Ctx ctx_, copy_;
  bool staged_;
  HostBuffer host_;
  std::vector<Event> final_, downloaded_;  // per bucket (staged only)
  Event uploaded_;
  std::vector<State> state_;
  std::vector<MPI_Request> req_;
  size_t issued_ = 0, summed_ = 0;
  bool final_recorded_ = false;
};

}  // namespace

const char* grad_reduce_name(GradReduceKind k) {
  switch (k) {
    case GradReduceKind::HostMpi: return "mpi";
    case GradReduceKind::Nccl: return "nccl";
  }
  return "?";
}

GradReduceKind choose_grad_reducer(const Topology& topo, const Ctx& ctx) {
  // NCCL only when every drafter runs on CUDA, each on a GPU of its own.
  bool distinct = ctx.device == Device::CUDA;
  for (size_t i = 0; i < topo.drafters.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (topo.same_gpu(topo.drafters[i], topo.drafters[j])) distinct = false;
  return distinct && cuda::in_build() ? GradReduceKind::Nccl : GradReduceKind::HostMpi;
}

std::unique_ptr<GradientReducer> make_gradient_reducer(GradReduceKind kind, MPI_Comm comm, const Ctx& ctx,
                                                       std::vector<GradRange> buckets, double timeout_s) {
  if (kind == GradReduceKind::HostMpi) return std::make_unique<HostMpiReducer>(comm, ctx, std::move(buckets), timeout_s);
  DF_CHECK(ctx.device == Device::CUDA, BadOptions, "the NCCL gradient reducer needs the CUDA backend");
  if (!make_nccl_reducer) fatal_no_cuda("the NCCL gradient reducer");
  return make_nccl_reducer(comm, ctx, std::move(buckets), timeout_s);
}

}  // namespace dflash
