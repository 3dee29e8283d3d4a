// Gradient reducers: the bucket plan, the bucket bookkeeping every reducer shares, the host-MPI reducer and
// the factory (the NCCL one is in src/comm/cuda/, built with CUDA).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dflash/device_async.h"
#include "dflash/error.h"
#include "dflash/grad_reducer.h"
#include "dflash/mpi_typed.h"
#include "dflash/optim.h"
#include "dflash/topology.h"

namespace dflash {

#ifdef DFLASH_HAVE_CUDA
std::unique_ptr<GradientReducer> make_nccl_reducer(MPI_Comm drafter_comm, const Ctx& ctx, std::vector<GradRange> buckets,
                                                   double timeout_s);
#endif

// ---- the plan ------------------------------------------------------------------------------------

std::vector<GradRange> plan_grad_buckets(std::vector<GradRange> params, size_t cap_elements) {
  std::sort(params.begin(), params.end(), [](const GradRange& a, const GradRange& b) { return a.begin < b.begin; });
  size_t P = 0;
  for (const GradRange& p : params) {
    DF_CHECK(p.begin == P && p.end >= p.begin, Internal,
             "gradient buckets: the parameters do not tile the gradient (a range [" << p.begin << ", " << p.end
                                                                                    << ") after element " << P << ")");
    P = p.end;
  }
  DF_CHECK(P > 0, Internal, "gradient buckets: an empty gradient");
  if (cap_elements == 0) return {GradRange{0, P}};
  std::vector<GradRange> out;
  GradRange cur{P, P};
  for (size_t i = params.size(); i-- > 0;) {
    const GradRange& p = params[i];
    if (p.size() == 0) continue;
    if (cur.size() > 0 && cur.end - p.begin > cap_elements) {  // p does not fit: close the bucket
      out.push_back(cur);
      cur = GradRange{cur.begin, cur.begin};
    }
    cur.begin = p.begin;
  }
  out.push_back(cur);
  return out;
}

size_t grad_bucket_elements(double cap_mb) {
  if (!(cap_mb > 0)) return 0;
  const double n = cap_mb * 1024.0 * 1024.0 / sizeof(float);
  return n < 1 ? 1 : static_cast<size_t>(n);
}

// ---- bucket bookkeeping --------------------------------------------------------------------------

GradientReducer::GradientReducer(std::vector<GradRange> buckets) : buckets_(std::move(buckets)) {
  DF_CHECK(!buckets_.empty(), Internal, "gradient reducer without buckets");
  by_begin_.resize(buckets_.size());
  for (size_t i = 0; i < by_begin_.size(); ++i) by_begin_[i] = i;
  std::sort(by_begin_.begin(), by_begin_.end(), [&](size_t a, size_t b) { return buckets_[a].begin < buckets_[b].begin; });
  size_t at = 0;
  for (size_t i : by_begin_) {
    DF_CHECK(buckets_[i].begin == at && buckets_[i].end > at, Internal, "gradient buckets do not tile the gradient");
    at = buckets_[i].end;
  }
  ready_.assign(buckets_.size(), 0);
}

void GradientReducer::begin_step(const Tensor& grads, float prescale) {
  DF_CHECK(!open_, Internal, "gradient reducer: a step began before the last one was done");
  const size_t P = buckets_[by_begin_.back()].end;
  DF_CHECK(grads.dtype == DType::F32 && grads.numel() == P, Internal,
           "gradient reducer: gradients " << dtype_name(grads.dtype) << " " << grads.shape_str() << ", planned F32 [" << P
                                          << "]");
  grads_ = grads;
  prescale_ = prescale;
  std::fill(ready_.begin(), ready_.end(), 0);
  next_ = 0;
  open_ = true;
  on_begin_step();
}

void GradientReducer::bucket_ready(size_t begin, size_t end) {
  DF_CHECK(open_, Internal, "gradient reducer: a range reported outside a step");
  const size_t P = buckets_[by_begin_.back()].end;
  DF_CHECK(begin <= end && end <= P, Internal, "gradient reducer: range [" << begin << ", " << end << ") of " << P);
  if (begin == end) return;
  // The bucket holding `begin`, then every one up to `end`.
  size_t k = static_cast<size_t>(std::upper_bound(by_begin_.begin(), by_begin_.end(), begin,
                                                  [&](size_t b, size_t i) { return b < buckets_[i].begin; }) -
                                 by_begin_.begin()) - 1;
  for (; k < by_begin_.size() && buckets_[by_begin_[k]].begin < end; ++k) {
    const size_t i = by_begin_[k];
    const size_t lo = std::max(begin, buckets_[i].begin), hi = std::min(end, buckets_[i].end);
    ready_[i] += hi - lo;
    DF_CHECK(ready_[i] <= buckets_[i].size(), Internal,
             "gradient reducer: part of [" << begin << ", " << end << ") was reported final twice");
  }
  while (next_ < buckets_.size() && ready_[next_] == buckets_[next_].size()) launch(next_++);
  progress();
}

bool GradientReducer::done() {
  if (!open_) return true;
  DF_CHECK(next_ == buckets_.size(), Internal,
           "gradient reducer: " << buckets_.size() - next_ << " of " << buckets_.size()
                                << " buckets were never reported final (the backward must report all of [0, P))");
  if (!progress()) return false;
  open_ = false;
  return true;
}

void GradientReducer::start(const Tensor& grads, float prescale) {
  begin_step(grads, prescale);
  bucket_ready(0, grads.numel());
}

Tensor GradientReducer::bucket_view(size_t i) const {
  const GradRange& b = buckets_.at(i);
  Tensor t = grads_;
  t.data = static_cast<float*>(grads_.data) + b.begin;
  t.ndim = 1;
  t.shape[0] = static_cast<int64_t>(b.size());
  return t;
}

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
#ifdef DFLASH_HAVE_CUDA
  return distinct ? GradReduceKind::Nccl : GradReduceKind::HostMpi;
#else
  (void)distinct;
  return GradReduceKind::HostMpi;
#endif
}

std::unique_ptr<GradientReducer> make_gradient_reducer(GradReduceKind kind, MPI_Comm comm, const Ctx& ctx,
                                                       std::vector<GradRange> buckets, double timeout_s) {
  if (kind == GradReduceKind::HostMpi) return std::make_unique<HostMpiReducer>(comm, ctx, std::move(buckets), timeout_s);
#ifdef DFLASH_HAVE_CUDA
  DF_CHECK(ctx.device == Device::CUDA, BadOptions, "the NCCL gradient reducer needs the CUDA backend");
  return make_nccl_reducer(comm, ctx, std::move(buckets), timeout_s);
#else
  (void)timeout_s;
  fatal(ExitCode::BadOptions, "the NCCL gradient reducer needs a build with CUDA and NCCL",
        "rebuild with a CUDA toolkit, or run the drafters on the CPU backend");
#endif
}

}  // namespace dflash
