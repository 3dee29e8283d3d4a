// The NCCL gradient reducer (grad_reducer.h): ncclAllReduce of the flat fp32 gradient on the trainer's
// stream, over a communicator of the drafters. The communicator is non-blocking (config.blocking = 0),
// so neither its setup nor a collective can hang the host: every wait polls ncclCommGetAsyncError and
// an event under a deadline, and a lost peer ends in ncclCommAbort.
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "backend.cuh"
#include "dflash/device_async.h"
#include "dflash/error.h"
#include "dflash/grad_reducer.h"
#include "dflash/mpi_typed.h"

namespace dflash {
namespace {

std::string nccl_error(ncclComm_t comm, ncclResult_t r) {
  std::string s = ncclGetErrorString(r);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) s += std::string(": ") + last;
  return s;
}

class NcclReducer final : public GradientReducer {
  enum class State : uint8_t { Idle, Enqueuing, Running };

 public:
  NcclReducer(MPI_Comm comm, const Ctx& ctx, double timeout_s) : ctx_(ctx), done_event_(ctx), timeout_s_(timeout_s) {
    int rank = 0, size = 1;
    DF_MPI(MPI_Comm_rank(comm, &rank));
    DF_MPI(MPI_Comm_size(comm, &size));
    ncclUniqueId id{};
    if (rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Request r = mpi::ibcast(&id, 1, 0, comm);
    mpi::wait(r, timeout_s, [] { return std::string("lost peer: a drafter did not join the NCCL communicator setup"); });
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    DF_CHECK(cudaSetDevice(cuda::backend_of(ctx).device) == cudaSuccess, DeviceFailure, "cudaSetDevice failed");
    const ncclResult_t init = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    if (init != ncclInProgress) check(init, "ncclCommInitRankConfig");
    mpi::Deadline deadline(timeout_s);
    mpi::Backoff backoff;
    while (async_state() == ncclInProgress) {
      if (deadline.expired()) {
        abort();
        fatal(ExitCode::LostPeer, "lost peer: the drafters' NCCL communicator was not set up within " +
                                      std::to_string(static_cast<int>(timeout_s)) + " s",
              "a drafter rank died or hangs; see its own error above");
      }
      backoff.idle();
    }
  }

  ~NcclReducer() override {
    if (!comm_) return;
    // Finalize flushes outstanding work; bounded like every other wait, then freed either way.
    if (ncclCommFinalize(comm_) == ncclInProgress) {
      mpi::Deadline deadline(timeout_s_);
      mpi::Backoff backoff;
      ncclResult_t st = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st == ncclInProgress && !deadline.expired()) backoff.idle();
    }
    ncclCommDestroy(comm_);
  }

  GradReduceKind kind() const override { return GradReduceKind::Nccl; }

  void start(const Tensor& grads) override {
    DF_ASSERT(state_ == State::Idle);
    DF_CHECK(grads.dtype == DType::F32 && grads.device == Device::CUDA, Internal, "NCCL reduces F32 device gradients");
    const ncclResult_t r = ncclAllReduce(grads.data, grads.data, grads.numel(), ncclFloat32, ncclSum, comm_,
                                         cuda::stream_of(ctx_));
    if (r != ncclInProgress) check(r, "ncclAllReduce");
    state_ = State::Enqueuing;
  }

  bool done() override {
    if (state_ == State::Idle) return true;
    const ncclResult_t st = async_state();
    if (state_ == State::Enqueuing) {
      if (st == ncclInProgress) return false;  // a non-blocking communicator may still be enqueuing
      done_event_.record(ctx_);
      state_ = State::Running;
    }
    if (!done_event_.done()) return false;
    state_ = State::Idle;
    return true;
  }

  void abort() override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    state_ = State::Idle;
  }

 private:
  // ncclSuccess or ncclInProgress; any other state is fatal.
  ncclResult_t async_state() {
    ncclResult_t st = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &st), "ncclCommGetAsyncError");
    if (st != ncclSuccess && st != ncclInProgress) {
      const std::string why = nccl_error(comm_, st);
      abort();
      fatal(ExitCode::DeviceFailure, "NCCL gradient allreduce failed: " + why,
            "a drafter's GPU or its link failed, or a peer died; see the other ranks' errors");
    }
    return st;
  }

  void check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    fatal(ExitCode::DeviceFailure, std::string(what) + " failed: " + nccl_error(comm_, r),
          "check that every drafter has a GPU of its own (NCCL refuses two ranks on one GPU), and NCCL_DEBUG=WARN");
  }

  Ctx ctx_;
  ncclComm_t comm_ = nullptr;
  Event done_event_;
  double timeout_s_;
  State state_ = State::Idle;
};

}  // namespace

std::unique_ptr<GradientReducer> make_nccl_reducer(MPI_Comm comm, const Ctx& ctx, double timeout_s) {
  return std::make_unique<NcclReducer>(comm, ctx, timeout_s);
}

}  // namespace dflash
