#include "dflash/flow_control.h"

#include <algorithm>

#include "dflash/error.h"

namespace dflash {

const char* batch_order_name(BatchOrder b) { return b == BatchOrder::Arrival ? "arrival" : "fixed"; }

// ---- CreditLedger ----------------------------------------------------------------------------------
CreditLedger::CreditLedger(std::vector<int> targets)
    : targets_(std::move(targets)), outstanding_(targets_.size(), 0), finished_(targets_.size(), false) {
  DF_ASSERT(!targets_.empty());
}

int CreditLedger::index(int target) const {
  auto it = std::find(targets_.begin(), targets_.end(), target);
  DF_CHECK(it != targets_.end(), Internal, "rank " << target << " is not a target of this drafter's node");
  return static_cast<int>(it - targets_.begin());
}

std::optional<int> CreditLedger::next_grantee() const {
  const int n = static_cast<int>(targets_.size());
  int best = -1;
  // Round-robin order starting after the last grantee; strictly fewer outstanding wins.
  for (int k = 1; k <= n; ++k) {
    int i = (last_grant_ + k) % n;
    if (i < 0) i += n;
    if (finished_[i]) continue;
    if (best < 0 || outstanding_[i] < outstanding_[best]) best = i;
  }
  if (best < 0) return std::nullopt;
  return targets_[best];
}

void CreditLedger::granted(int target) {
  int i = index(target);
  DF_ASSERT(!finished_[i]);
  outstanding_[i]++;
  last_grant_ = i;
}

void CreditLedger::consumed(int target) {
  int i = index(target);
  DF_ASSERT(outstanding_[i] > 0);
  outstanding_[i]--;
}

void CreditLedger::finished(int target) { finished_[index(target)] = true; }
bool CreditLedger::active(int target) const { return !finished_[index(target)]; }
int CreditLedger::outstanding(int target) const { return outstanding_[index(target)]; }
int CreditLedger::num_active() const {
  return static_cast<int>(std::count(finished_.begin(), finished_.end(), false));
}

// ---- CreditWallet ----------------------------------------------------------------------------------
void CreditWallet::add(const Credit& c) {
  slots_[c.drafter].push_back(c);
  ++total_;
}

int CreditWallet::held_from(int drafter) const {
  auto it = slots_.find(drafter);
  return it == slots_.end() ? 0 : static_cast<int>(it->second.size());
}

Credit CreditWallet::take(double now_s, double max_age_s) {
  DF_ASSERT(total_ > 0);
  auto best = slots_.end(), oldest = slots_.end();
  for (auto it = slots_.begin(); it != slots_.end(); ++it) {
    if (it->second.empty()) continue;
    if (best == slots_.end() || it->second.size() > best->second.size()) best = it;
    if (oldest == slots_.end() || it->second.front().granted_s < oldest->second.front().granted_s) oldest = it;
  }
  if (max_age_s >= 0 && now_s - oldest->second.front().granted_s > max_age_s) best = oldest;
  Credit c = best->second.front();
  best->second.pop_front();
  --total_;
  return c;
}

Credit CreditWallet::take_from(int drafter) {
  auto it = slots_.find(drafter);
  DF_ASSERT(it != slots_.end() && !it->second.empty());
  Credit c = it->second.front();
  it->second.pop_front();
  --total_;
  return c;
}

// ---- FixedBatchOrder -----------------------------------------------------------------------------
FixedBatchOrder::FixedBatchOrder(int num_targets, int num_drafters, int drafter_index)
    : T_(num_targets), D_(num_drafters), d_(drafter_index), first_(num_targets, 0), later_(num_targets),
      end_(num_targets, -1), consume_g_(drafter_index), grant_g_(drafter_index) {
  DF_ASSERT(T_ >= 1 && D_ >= 1 && d_ >= 0 && d_ < D_);
}

int FixedBatchOrder::drafter_of(int num_targets, int num_drafters, int target, int64_t batch) {
  return static_cast<int>((batch * num_targets + target) % num_drafters);
}

void FixedBatchOrder::trained_before(int target, int64_t first, const std::vector<int64_t>& later) {
  first_.at(target) = first;
  later_.at(target) = std::set<int64_t>(later.begin(), later.end());
}

void FixedBatchOrder::target_ended(int target, int64_t end_index) { end_.at(target) = end_index; }

std::optional<FixedBatchRef> FixedBatchOrder::first_at_or_after(int64_t g) const {
  g = g < d_ ? d_ : g + ((d_ - g % D_) % D_ + D_) % D_;  // round up into this drafter's residue
  for (;; g += D_) {
    const int i = static_cast<int>(g % T_);
    const int64_t n = g / T_;
    // The first batch that does not exist ends this drafter's sequence. Skipping it instead would let
    // the drafters' sequences drift apart in g, and a target feeding several of them could then need a
    // credit a drafter with a small --hs-queue-depth cannot grant yet (a deadlock).
    if (end_[i] >= 0 && n >= end_[i]) return std::nullopt;
    if (n < first_[i] || later_[i].count(n)) continue;  // trained on before the resume
    return FixedBatchRef{i, n, g};
  }
}

std::optional<FixedBatchRef> FixedBatchOrder::expected() {
  auto r = first_at_or_after(consume_g_);
  if (r) consume_g_ = r->g;
  return r;
}

void FixedBatchOrder::consumed() {
  auto r = expected();
  DF_ASSERT(r.has_value());
  consume_g_ = r->g + D_;
}

std::optional<FixedBatchRef> FixedBatchOrder::next_to_grant() {
  auto r = first_at_or_after(std::max(grant_g_, consume_g_));
  if (r) grant_g_ = r->g;
  return r;
}

void FixedBatchOrder::granted() {
  auto r = next_to_grant();
  DF_ASSERT(r.has_value());
  grant_g_ = r->g + D_;
}

}  // namespace dflash
