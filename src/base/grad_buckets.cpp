// Gradient reducers' shared half (include/dflash/grad_buckets.h): the bucket plan and the bucket bookkeeping
// every reducer does. In the base library: the host-MPI reducer (src/comm/grad_reducer.cpp) and the NCCL one
// (src/comm/cuda/nccl_reducer.cpp, in the CUDA library) both derive from it.
#include <algorithm>
#include <string>
#include <vector>

#include "dflash/error.h"
#include "dflash/grad_buckets.h"

namespace dflash {

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

void GradientReducer::ready(size_t begin, size_t end) {
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
  ready(0, grads.numel());
}

Tensor GradientReducer::bucket_view(size_t i) const {
  const GradRange& b = buckets_.at(i);
  Tensor t = grads_;
  t.data = static_cast<float*>(grads_.data) + b.begin;
  t.ndim = 1;
  t.shape[0] = static_cast<int64_t>(b.size());
  return t;
}

}  // namespace dflash
