// The drafters as a group (docs/pipeline.md "Steps and lockstep"): every collective the drafter loop runs
// over drafter_comm, in the same order on every drafter. Before each the drafter announces a new round
// (DrafterPresence), so a collective that stalls past --peer-timeout names the drafters that never reached
// it; every wait drives the caller's progress (the endpoint's pump) meanwhile.
#pragma once
#include <climits>
#include <functional>
#include <string>
#include <vector>

#include "dflash/grad_reducer.h"
#include "drafter_presence.h"
#include "job.h"

namespace dflash {

// One step's numbers over the drafters (summed by one allreduce, divided after). The loss is carried as
// loss × weight sum so the reported loss, like the gradient, is one global normalisation Σw·loss / Σw over
// every drafter's batch; the metrics are plain means.
struct StepSums {
  double weighted_loss = 0, weight_sum = 0, acc = 0, agree = 0, streak = 0, lr = 0, noise = 0, tokens = 0, anchors = 0;
  // DFlash2 (0 for DFlash): the selector term's weighted sum, and row counts behind recall and selector acc.
  double weighted_sel = 0, loss_rows = 0, covered_rows = 0, selector_correct_rows = 0;
  double selector_alpha = 0;  // the same on every drafter (the schedule's value): a mean, as lr
  // Every field, in the order the allreduce sums them.
  static constexpr double StepSums::*kFields[] = {
      &StepSums::weighted_loss, &StepSums::weight_sum, &StepSums::acc,          &StepSums::agree,
      &StepSums::streak,        &StepSums::lr,         &StepSums::noise,        &StepSums::tokens,
      &StepSums::anchors,       &StepSums::weighted_sel, &StepSums::loss_rows, &StepSums::covered_rows,
      &StepSums::selector_correct_rows, &StepSums::selector_alpha};
};

class DrafterGroup {
 public:
  using Progress = std::function<void()>;
  explicit DrafterGroup(const JobContext& job);

  int size() const { return static_cast<int>(topo_.drafters.size()); }
  // Takes in the other drafters' round announcements (part of the caller's progress while it waits).
  void poll() { presence_.poll(); }
  // Announces the next round: before each collective (those below that need it announce it themselves,
  // as noted), and before one made elsewhere (checkpoints, metrics gathers).
  void enter() { presence_.announce(++round_); }
  // "lost peer: <the drafters behind this round, else all>: <what>"
  std::string stalled(const char* what) const;

  // The drafters start from the same seed; a mismatch would silently train different models (Internal).
  void check_same_init(double weights_checksum);
  // The lockstep before each micro-batch (the caller entered the round before it waited for its batch):
  // whether every drafter has a batch, and the lowest world rank of a drafter that lost a target
  // (INT32_MAX: none). One drafter: its own answer.
  struct StepAgreement {
    bool all_have_batch = true;
    int lost_by = INT32_MAX;
  };
  StepAgreement agree_on_step(bool have_batch, bool lost_target, const Progress& progress);
  // After the drain: the lowest world rank of a drafter that lost a target (INT32_MAX: none). Enters a round.
  int agree_on_lost_target(bool lost_target);
  // The step's numbers and accuracy per block position summed, waited for together with the gradient sum
  // the reducer has running. Enters a round: a drafter stuck before here (in its backward, say) is the one
  // named. On a stall the reducer is abandoned (NCCL: abort) and the job ends (fatal LostPeer).
  void sum_step(StepSums& sums, std::vector<double>& acc_by_pos, GradientReducer& reducer, const Progress& progress);
  // values summed over the drafters (the eval results); `what` names a stall. Enters a round (several drafters).
  void sum(std::vector<double>& values, const char* what, const Progress& progress);
  // The end: waits until every drafter finished the last round (DrafterPresence::finish).
  void finish() { presence_.finish(round_); }

 private:
  const Options& o_;
  const Topology& topo_;
  DrafterPresence presence_;
  int64_t round_ = -1;
};

}  // namespace dflash
