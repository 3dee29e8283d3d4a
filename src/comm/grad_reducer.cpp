// Gradient reducers: the host-MPI one and the factory (the NCCL one is in src/comm/cuda/, built with CUDA).
#include <cstring>
#include <string>
#include <vector>

#include "dflash/device_async.h"
#include "dflash/error.h"
#include "dflash/grad_reducer.h"
#include "dflash/mpi_typed.h"

namespace dflash {

#ifdef DFLASH_HAVE_CUDA
std::unique_ptr<GradientReducer> make_nccl_reducer(MPI_Comm drafter_comm, const Ctx& ctx, double timeout_s);
#endif

namespace {

// MPI_Iallreduce in place. Device gradients go down to a page-locked buffer first (ordered after the
// backward by an event) and back up after the sum; on the CPU backend the buffer itself is reduced.
class HostMpiReducer final : public GradientReducer {
  enum class State : uint8_t { Idle, Downloading, Reducing, Uploading };

 public:
  HostMpiReducer(MPI_Comm comm, const Ctx& ctx, size_t max_elements)
      : comm_(comm),
        ctx_(ctx),
        staged_(ctx.device != Device::CPU),
        host_(staged_ ? max_elements * sizeof(float) : 0, HostMemory::Pinned),
        copied_(ctx) {}
  ~HostMpiReducer() override { abort(); }
  GradReduceKind kind() const override { return GradReduceKind::HostMpi; }

  void start(const Tensor& grads) override {
    DF_ASSERT(state_ == State::Idle);
    DF_CHECK(grads.dtype == DType::F32 && grads.device == ctx_.device, Internal, "gradients must be F32 on the trainer's device");
    grads_ = grads;
    if (!staged_) {
      req_ = mpi::iallreduce(grads.ptr<float>(), grads.numel(), MPI_SUM, comm_);
      state_ = State::Reducing;
      return;
    }
    DF_CHECK(grads.nbytes() <= host_.size(), Internal, "gradient buffer larger than the reducer's staging");
    copy_bytes_async(ctx_, host_.data(), grads.data, grads.nbytes());
    copied_.record(ctx_);
    state_ = State::Downloading;
  }

  bool done() override {
    if (state_ == State::Downloading) {
      if (!copied_.done()) return false;
      req_ = mpi::iallreduce(static_cast<float*>(host_.data()), grads_.numel(), MPI_SUM, comm_);
      state_ = State::Reducing;
    }
    if (state_ == State::Reducing) {
      if (!mpi::test(req_)) return false;
      if (!staged_) {
        state_ = State::Idle;
        return true;
      }
      copy_bytes_async(ctx_, grads_.data, host_.data(), grads_.nbytes());
      copied_.record(ctx_);
      state_ = State::Uploading;
    }
    // The upload is ordered on the trainer's stream before the optimizer; waiting for it keeps the
    // staging buffer free for the next step.
    if (state_ == State::Uploading && copied_.done()) state_ = State::Idle;
    return state_ == State::Idle;
  }

  void abort() override {
    // A pending MPI collective cannot be cancelled; the job is ending through fatal() (MPI_Abort).
    state_ = State::Idle;
  }

 private:
  MPI_Comm comm_;
  Ctx ctx_;
  bool staged_;
  HostBuffer host_;
  Event copied_;
  Tensor grads_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  State state_ = State::Idle;
};

}  // namespace

const char* grad_reduce_name(GradReduceKind k) {
  switch (k) {
    case GradReduceKind::HostMpi: return "mpi";
    case GradReduceKind::Nccl: return "nccl";
  }
  return "?";
}

GradReduceKind choose_grad_reducer(MPI_Comm comm, const Ctx& ctx, const char* host, int gpu) {
  int size = 1;
  DF_MPI(MPI_Comm_size(comm, &size));
  // Every drafter's (host, gpu): NCCL only when all are distinct and on CUDA.
  struct Where {
    char host[64];
    int32_t gpu;
  } mine{};
  std::strncpy(mine.host, host, sizeof(mine.host) - 1);
  mine.gpu = ctx.device == Device::CUDA ? gpu : -1;
  std::vector<Where> all(static_cast<size_t>(size));
  mpi::allgather(&mine, 1, all.data(), comm);
  bool distinct = true;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].gpu < 0) distinct = false;
    for (size_t j = 0; j < i; ++j)
      if (all[i].gpu == all[j].gpu && std::strcmp(all[i].host, all[j].host) == 0) distinct = false;
  }
#ifdef DFLASH_HAVE_CUDA
  return distinct ? GradReduceKind::Nccl : GradReduceKind::HostMpi;
#else
  (void)distinct;
  return GradReduceKind::HostMpi;
#endif
}

std::unique_ptr<GradientReducer> make_gradient_reducer(GradReduceKind kind, MPI_Comm comm, const Ctx& ctx,
                                                       size_t max_elements, double timeout_s) {
  if (kind == GradReduceKind::HostMpi) return std::make_unique<HostMpiReducer>(comm, ctx, max_elements);
#ifdef DFLASH_HAVE_CUDA
  DF_CHECK(ctx.device == Device::CUDA, BadOptions, "the NCCL gradient reducer needs the CUDA backend");
  return make_nccl_reducer(comm, ctx, timeout_s);
#else
  fatal(ExitCode::BadOptions, "the NCCL gradient reducer needs a build with CUDA and NCCL",
        "rebuild with a CUDA toolkit, or run the drafters on the CPU backend");
#endif
}

}  // namespace dflash
