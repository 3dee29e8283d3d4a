// Per-target data resume points from the batches the drafters trained on (checkpoint.h explains why).
#include <algorithm>

#include "dflash/checkpoint.h"
#include "dflash/error.h"

namespace dflash {

bool DataResumePoint::already_trained(int64_t index) const {
  for (const auto& [i, next] : done_after)
    if (i == index) return true;
  return false;
}

void advance_resume_points(std::vector<DataResumePoint>& points, const std::vector<ConsumedBatch>& consumed) {
  for (const ConsumedBatch& c : consumed) {
    DF_CHECK(c.target >= 0 && static_cast<size_t>(c.target) < points.size(), Internal,
             "a trained batch names target " << c.target << " of " << points.size());
    DataResumePoint& p = points[c.target];
    DF_CHECK(c.index >= p.position.batches && !p.already_trained(c.index), Internal,
             "batch " << c.index << " of target " << c.target << " was trained on twice");
    DF_CHECK(c.next.batches == c.index + 1, Internal,
             "batch " << c.index << " of target " << c.target << " carries position " << c.next.to_string());
    p.done_after.emplace_back(c.index, c.next);
  }
  // Each target's position moves over the run of consecutive batches trained on; the rest stays listed.
  for (DataResumePoint& p : points) {
    std::sort(p.done_after.begin(), p.done_after.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t k = 0;
    while (k < p.done_after.size() && p.done_after[k].first == p.position.batches) p.position = p.done_after[k++].second;
    p.done_after.erase(p.done_after.begin(), p.done_after.begin() + static_cast<std::ptrdiff_t>(k));
  }
}

}  // namespace dflash
