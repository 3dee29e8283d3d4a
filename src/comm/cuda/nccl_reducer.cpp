// The NCCL gradient reducer (grad_reducer.h): one ncclAllReduce per bucket of the flat fp32 gradient, over
// a communicator of the drafters, on a stream of its own (so the sums overlap the backward, and never
// queue behind or ahead of another communicator's work on a shared stream). A bucket reported final gets
// an event on the trainer's stream; the reduce stream waits for it, scales the bucket by the step's
// prescale and sums it. The trainer's stream waits for the reduce stream once every bucket is summed.
//
// The communicator (NcclComm, nccl_comm.h) is non-blocking, so neither its setup nor a collective can hang
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
#include "dflash/grad_buckets.h"
#include "dflash/grad_reducer.h"  // the make_nccl_reducer slot this file fills
#include "dflash/mpi_typed.h"
#include "nccl_comm.h"

namespace dflash {
namespace {

class NcclReducer final : public GradientReducer {
 public:
  NcclReducer(MPI_Comm comm, const Ctx& ctx, std::vector<GradRange> buckets, double timeout_s)
      : GradientReducer(std::move(buckets)), ctx_(ctx), red_(ctx), summed_(ctx) {
    int rank = 0, size = 1;
    DF_MPI(MPI_Comm_rank(comm, &rank));
    DF_MPI(MPI_Comm_size(comm, &size));
    DF_CHECK(cudaSetDevice(cuda::backend_of(ctx).device) == cudaSuccess, DeviceFailure, "cudaSetDevice failed");
    cudaStream_t s = nullptr;
    DF_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    red_.stream = s;
    for (size_t i = 0; i < this->buckets().size(); ++i) final_.emplace_back(ctx);
    ncclUniqueId id{};
    if (rank == 0) DF_NCCL(comm_, ncclGetUniqueId(&id), "ncclGetUniqueId", kSetupHint);
    MPI_Request r = mpi::ibcast(&id, 1, 0, comm);
    mpi::wait(r, timeout_s, [] { return std::string("lost peer: a drafter did not join the NCCL communicator setup"); });
    if (!comm_.begin(id, size, rank, timeout_s))
      fatal(ExitCode::DeviceFailure, "ncclCommInitRankConfig failed: " + comm_.error(), kSetupHint);
    switch (comm_.wait_ready()) {
      case NcclComm::Setup::Ready: break;
      case NcclComm::Setup::Failed:
        fail("NCCL gradient allreduce failed: " + comm_.error());
      case NcclComm::Setup::TimedOut:
        comm_.abort();
        fatal(ExitCode::LostPeer, "lost peer: the drafters' NCCL communicator was not set up within " +
                                      std::to_string(static_cast<int>(timeout_s)) + " s",
              "a drafter rank died or hangs; see its own error above");
    }
  }

  ~NcclReducer() override {
    comm_.close();  // finalized (bounded) and destroyed before its stream goes
    // An aborted communicator may leave work on the stream; cudaStreamDestroy does not wait for it.
    if (red_.stream) cudaStreamDestroy(static_cast<cudaStream_t>(red_.stream));
  }

  GradReduceKind kind() const override { return GradReduceKind::Nccl; }

  void abort() override {
    comm_.abort();
    queue_.clear();
  }

 protected:
  void on_begin_step() override {
    DF_CHECK(grads().device == Device::CUDA, Internal, "NCCL reduces F32 device gradients");
    DF_CHECK(static_cast<bool>(comm_), Internal, "NCCL gradient reducer used after abort()");
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
      DF_NCCL(comm_, ncclAllReduce(view.data, view.data, view.numel(), ncclFloat32, ncclSum, comm_.get(), cuda::stream_of(red_)),
              "ncclAllReduce", kSetupHint);
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
    const ncclResult_t st = comm_.state();
    if (st != ncclSuccess && st != ncclInProgress) fail("NCCL gradient allreduce failed: " + nccl_error(comm_.get(), st));
    return st;
  }

  [[noreturn]] void fail(const std::string& what) {
    comm_.abort();
    fatal(ExitCode::DeviceFailure, what, "a drafter's GPU or its link failed, or a peer died; see the other ranks' errors");
  }

  static constexpr const char* kSetupHint =
      "check that every drafter has a GPU of its own (NCCL refuses two ranks on one GPU), and NCCL_DEBUG=WARN";

  Ctx ctx_;   // the trainer's
  Ctx red_;   // the same device and backend, the reducer's stream
  NcclComm comm_;
  std::vector<Event> final_;  // per bucket: final on the trainer's stream
  Event summed_;              // every bucket summed (on the reduce stream)
  std::deque<size_t> queue_;  // final buckets not yet handed to NCCL, in plan order
  size_t issued_ = 0;
  bool finished_ = false;
};

std::unique_ptr<GradientReducer> make_reducer(MPI_Comm comm, const Ctx& ctx, std::vector<GradRange> buckets,
                                              double timeout_s) {
  return std::make_unique<NcclReducer>(comm, ctx, std::move(buckets), timeout_s);
}

}  // namespace

MakeNcclReducer* const make_nccl_reducer = &make_reducer;

}  // namespace dflash
