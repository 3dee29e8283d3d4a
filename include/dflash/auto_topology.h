// The what-if model behind dflash-report and --topology auto: predicted throughput and power of every T-D
// split of a node's GPUs from each role's measured service time. The same formulas are in Python
// (tools/dflash_report/model.py); tests/report/ scenarios check both (docs/report.md "The model").
//
//   target side   = N * T / s_t                   s_t: busy seconds per batch of one target GPU
//   drafter side  = N * D / (s_d + a(N * D))      s_d: forward + backward + optimizer seconds per batch
//   a(D)          = c * 2 (D - 1) / D             ring allreduce of the gradients, zero at D = 1
//   predicted b/s = min(target side, drafter side)
//   power         = N * (T * P_t + D * P_d + (G - T - D) * P_idle)
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace dflash {

// 2 (D - 1) / D: bytes each drafter sends per gradient byte in a ring allreduce (0 for D <= 1).
double ring_allreduce_factor(int drafters_total);

struct RoleMeasurements {
  int gpus_per_node = 1;
  int nodes = 1;
  double target_s_per_batch = 0;         // busy seconds per batch, one target GPU
  double drafter_s_per_batch = 0;        // compute + optimizer seconds per batch, one drafter GPU
  std::optional<double> allreduce_coeff_s;  // c above (bytes / bandwidth); unknown = modelled as 0
  double tokens_per_batch = 0;
  std::optional<double> power_target_w, power_drafter_w, power_idle_w;
  std::optional<double> remaining_tokens;
};

enum class SplitLimit { Target, Drafter };  // the side that sets a split's rate
const char* split_limit_name(SplitLimit l);

struct SplitPrediction {
  int targets = 0, drafters = 0, idle = 0;   // per node
  double target_cap_bps = 0, drafter_cap_bps = 0;
  double batches_per_s = 0, ktok_per_s = 0;
  SplitLimit limit = SplitLimit::Target;
  double allreduce_s_per_batch = 0;
  std::optional<double> power_w, ktok_per_kw, eta_s;
  std::string split() const;  // "7-1"
};

// One split; fatal Internal unless targets, drafters >= 1 and targets + drafters <= gpus_per_node.
SplitPrediction predict_split(const RoleMeasurements& m, int targets, int drafters);
// Every T-D with T, D >= 1 and T + D <= gpus_per_node, most targets first (the report's row order).
std::vector<SplitPrediction> predict_all_splits(const RoleMeasurements& m);
// The fastest split; predictions within 0.5% tie and the tie goes to less power, then fewer GPUs. With a
// power budget only splits of known power <= budget count. nullopt when none fits.
std::optional<SplitPrediction> best_split(const std::vector<SplitPrediction>& preds,
                                          std::optional<double> power_budget_w = std::nullopt);

// --rebalance auto (docs/checkpoint.md "Re-splitting live"): whether a run on `targets`-`drafters` per node
// should move to the best split the model predicts from this split's own measurements -- at least
// min_gain_frac faster than this split's prediction (both predicted: the model's bias cancels) and within
// the power budget (needs power readings). `to` is set when it should.
struct RebalanceChoice {
  std::optional<SplitPrediction> to;
  SplitPrediction now;
  std::optional<SplitPrediction> best;
  double gain = 0;  // best's predicted b/s over now's, - 1
  std::string why;  // one line: the decision and its numbers
};
RebalanceChoice choose_rebalance(const RoleMeasurements& m, int targets, int drafters, double min_gain_frac,
                                 std::optional<double> power_budget_w = std::nullopt);

// The what-if table as fixed-width text (what --topology auto prints before training).
std::string format_whatif_table(const std::vector<SplitPrediction>& preds, const std::string& mark_split);
// {"measurements": {...}, "whatif": [...], "best": "T-D"}: what --topology auto records in metrics.h5.
std::string whatif_json(const RoleMeasurements& m, const std::vector<SplitPrediction>& preds,
                        const std::optional<SplitPrediction>& chosen);

}  // namespace dflash
