// The NCCL gradient reducer (grad_reducer.h): one ncclAllReduce per bucket of the flat fp32 gradient, over
// a communicator of the drafters, on a stream of its own (so the sums overlap the backward, and never
// queue behind or ahead of another communicator's work on a shared stream). A bucket reported final gets
// an event on the trainer's stream; the reduce stream waits for it, scales the bucket by the step's
// prescale and sums it. The trainer's stream waits for the reduce stream once every bucket is summed.
//
// The communicator is non-blocking (config.blocking = 0), so neither its setup nor a collective can hang
// the host: an NCCL call may return ncclInProgress, and the next one is issued only once
// ncclCommGetAsyncError says the last has been enqueued (buckets queue on the host meanwhile); every wait
// polls under the caller's deadline, and a lost peer ends in ncclCommAbort. All calls come from the
// drafter's one thread (NCCL communicators are not thread-safe).
#include <cuda_runtime.h>
#include <nccl.h>

#include <deque>
#include <string>

#include "adamw.cuh"  // cuda::scale_inplace
#include "backend.cuh"
#include "cuda_check.cuh"
#include "dflash/device_async.h"
#include "dflash/error.h"
#include "dflash/grad_reducer.h"
#include "dflash/mpi_typed.h"
#include "nccl_util.h"

namespace dflash {
namespace {

class NcclReducer final : public GradientReducer {
 public:
  NcclReducer(MPI_Comm comm, const Ctx& ctx, std::vector<GradRange> buckets, double timeout_s)
      : GradientReducer(std::move(buckets)), ctx_(ctx), red_(ctx), summed_(ctx), timeout_s_(timeout_s) {
    int rank = 0, size = 1;
    DF_MPI(MPI_Comm_rank(comm, &rank));
    DF_MPI(MPI_Comm_size(comm, &size));
    DF_CHECK(cudaSetDevice(cuda::backend_of(ctx).device) == cudaSuccess, DeviceFailure, "cudaSetDevice failed");
    cudaStream_t s = nullptr;
    DF_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    red_.stream = s;
    for (size_t i = 0; i < this->buckets().size(); ++i) final_.emplace_back(ctx);
    ncclUniqueId id{};
    if (rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Request r = mpi::ibcast(&id, 1, 0, comm);
    mpi::wait(r, timeout_s, [] { return std::string("lost peer: a drafter did not join the NCCL communicator setup"); });
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
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
    if (comm_) {
      // Finalize flushes outstanding work; bounded like every other wait, then freed either way.
      if (ncclCommFinalize(comm_) == ncclInProgress) {
        mpi::Deadline deadline(timeout_s_);
        mpi::Backoff backoff;
        ncclResult_t st = ncclInProgress;
        while (ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st == ncclInProgress && !deadline.expired())
          backoff.idle();
      }
      ncclCommDestroy(comm_);
    }
    // An aborted communicator may leave work on the stream; cudaStreamDestroy does not wait for it.
    if (red_.stream) cudaStreamDestroy(static_cast<cudaStream_t>(red_.stream));
  }

  GradReduceKind kind() const override { return GradReduceKind::Nccl; }

  void abort() override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    queue_.clear();
  }

 protected:
  void on_begin_step() override {
    DF_CHECK(grads().device == Device::CUDA, Internal, "NCCL reduces F32 device gradients");
    DF_CHECK(comm_ != nullptr, Internal, "NCCL gradient reducer used after abort()");
    issued_ = 0;
    finished_ = false;
    queue_.clear();
  }

  void launch(size_t i) override {
    final_[i].record(ctx_);  // the bucket is final here on the trainer's stream
    queue_.push_back(i);
  }

  bool progress() override {
    // One NCCL call at a time: the next only once the communicator has enqueued the last.
    while (!queue_.empty() && async_state() != ncclInProgress) {
      const size_t i = queue_.front();
      queue_.pop_front();
      const Tensor view = bucket_view(i);
      final_[i].order_before(red_);
      if (prescale() != 1.0f) cuda::scale_inplace(red_, view, prescale());
      const ncclResult_t r = ncclAllReduce(view.data, view.data, view.numel(), ncclFloat32, ncclSum, comm_,
                                           cuda::stream_of(red_));
      if (r != ncclInProgress) check(r, "ncclAllReduce");
      ++issued_;
    }
    if (issued_ < buckets().size() || async_state() == ncclInProgress) return false;
    if (!finished_) {
      summed_.record(red_);
      summed_.order_before(ctx_);  // the optimizer reads the sums
      finished_ = true;
    }
    return summed_.done();
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

  Ctx ctx_;   // the trainer's
  Ctx red_;   // the same device and backend, the reducer's stream
  ncclComm_t comm_ = nullptr;
  std::vector<Event> final_;  // per bucket: final on the trainer's stream
  Event summed_;              // every bucket summed (on the reduce stream)
  std::deque<size_t> queue_;  // final buckets not yet handed to NCCL, in plan order
  size_t issued_ = 0;
  bool finished_ = false;
  double timeout_s_;
};

}  // namespace

std::unique_ptr<GradientReducer> make_nccl_reducer(MPI_Comm comm, const Ctx& ctx, std::vector<GradRange> buckets,
                                                   double timeout_s) {
  return std::make_unique<NcclReducer>(comm, ctx, std::move(buckets), timeout_s);
}

}  // namespace dflash
