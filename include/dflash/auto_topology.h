// The what-if model behind dflash-report and --topology auto: predicted throughput and power of every T-D
// split of a node's GPUs from each role's measured service time. The same formulas are in Python
// (tools/dflash_report/model.py); tests/report/ scenarios check both (docs/report.md "The model").
//
//   target side   = N * T / s_t                   s_t: busy seconds per batch of one target GPU
//   drafter side  = N * D / (s_d + a(N * D))      s_d: forward + backward + optimizer seconds per batch
//   a(D)          = c * 2 (D - 1) / D             ring allreduce of the gradients, zero at D = 1
//   predicted b/s = min(target side, drafter side)
//   power         = N * (T * P_t + D * P_d + (G - T - D) * P_idle)
//
// The colocated layout (--topology colocated: every GPU runs a target and a drafter; docs/pipeline.md "The
// colocated layout") is one more row:
//
//   colocated b/s = N * G / (s_t + s_d + a(N * G) - o * min(s_t, s_d))
//   o             = (s_t + s_d - s_both) / min(s_t, s_d)   the measured overlap of the two roles on one device
//   power         = N * G * (P_t * s_t + P_d * s_d) / (s_t + s_d)
//
// o is 1 where the shorter role hides entirely under the longer (two CUDA streams), 0 where they take turns,
// below 0 where together they took longer than one after the other (the CPU backend's roles sharing cores).
// Not measured, it is modelled as 0 and the row is shown but never the best: the choice of colocated rests
// on a measured overlap (--topology auto's colocated phase, or a colocated run's own wall time). A colocated
// rank holds both roles' memory: a row known not to fit is never the best either.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dflash/topology.h"  // Layout, TopologySpec

namespace dflash {

// 2 (D - 1) / D: bytes each drafter sends per gradient byte in a ring allreduce (0 for D <= 1).
double ring_allreduce_factor(int drafters_total);

// Whether a colocated rank (the target's and the drafter's fixed memory together, the dry run's
// RoleMemory::colocated()) fits its GPU: unknown where no GPU size is known (the CPU backend: host memory).
enum class ColocatedFit : uint8_t { Fits, DoesNotFit, Unknown };
const char* colocated_fit_name(ColocatedFit f);  // "fits", "does not fit", "unknown"
ColocatedFit parse_colocated_fit(const std::string& name);  // the names above; anything else Unknown

// The overlap o of two roles timed apart (s_t, s_d) and together (s_both) on one device, at most 1 (0 when
// a time is missing).
double colocated_overlap(double target_s, double drafter_s, double both_s);

struct RoleMeasurements {
  int gpus_per_node = 1;
  int nodes = 1;
  double target_s_per_batch = 0;         // busy seconds per batch, one target GPU
  double drafter_s_per_batch = 0;        // compute + optimizer seconds per batch, one drafter GPU
  std::optional<double> allreduce_coeff_s;  // c above (bytes / bandwidth); unknown = modelled as 0
  double tokens_per_batch = 0;
  std::optional<double> power_target_w, power_drafter_w, power_idle_w;
  std::optional<double> remaining_tokens;
  // o above (at most 1); nullopt: not measured (modelled as 0, and said so).
  std::optional<double> colocated_overlap;
  ColocatedFit colocated_fit = ColocatedFit::Unknown;
};

enum class SplitLimit { Target, Drafter };  // the side that sets a split's rate
const char* split_limit_name(SplitLimit l);

struct SplitPrediction {
  Layout layout = Layout::Split;
  int targets = 0, drafters = 0, idle = 0;   // per node (colocated: targets = drafters = G, idle 0)
  double target_cap_bps = 0, drafter_cap_bps = 0;
  double batches_per_s = 0, ktok_per_s = 0;
  SplitLimit limit = SplitLimit::Target;
  double allreduce_s_per_batch = 0;
  std::optional<double> power_w, ktok_per_kw, eta_s;
  // A split's roles fit (each was measured, or runs, on a GPU of its own); a colocated row: RoleMeasurements'.
  ColocatedFit fit = ColocatedFit::Fits;
  std::optional<double> overlap;  // a colocated row's o as predicted from (clamped); nullopt: not measured
  std::string split() const;  // "7-1", or "colocated"
  TopologySpec spec() const;
  int gpus() const;           // busy GPUs per node: T + D, or G colocated
};

// One split; fatal Internal unless targets, drafters >= 1 and targets + drafters <= gpus_per_node.
SplitPrediction predict_split(const RoleMeasurements& m, int targets, int drafters);
// Every T-D with T, D >= 1 and T + D <= gpus_per_node, most targets first (the report's row order).
std::vector<SplitPrediction> predict_all_splits(const RoleMeasurements& m);
// The colocated row (formulas above). Fatal Internal without both service times.
SplitPrediction predict_colocated(const RoleMeasurements& m);
// predict_split or predict_colocated, as `layout` says.
SplitPrediction predict_layout(const RoleMeasurements& m, const TopologySpec& layout);
// Every split (predict_all_splits' order), then colocated: what --topology auto, --rebalance auto and the
// report choose among.
std::vector<SplitPrediction> predict_all_layouts(const RoleMeasurements& m);
// The fastest row; predictions within 0.5% tie and the tie goes to less power, then fewer GPUs. With a
// power budget only rows of known power <= budget count; a colocated row counts only with a measured overlap
// and a fit that is not known to fail.
// nullopt when none fits.
std::optional<SplitPrediction> best_split(const std::vector<SplitPrediction>& preds,
                                          std::optional<double> power_budget_w = std::nullopt);

// --rebalance auto (docs/checkpoint.md "Re-splitting live"): whether a run on `now` (a split, or colocated)
// should move to the best layout the model predicts from this layout's own measurements -- at least
// min_gain_frac faster than this split's prediction (both predicted: the model's bias cancels) and within
// the power budget (needs power readings). `to` is set when it should.
struct RebalanceChoice {
  std::optional<SplitPrediction> to;
  SplitPrediction now;
  std::optional<SplitPrediction> best;
  double gain = 0;  // best's predicted b/s over now's, - 1
  std::string why;  // one line: the decision and its numbers
};
RebalanceChoice choose_rebalance(const RoleMeasurements& m, const TopologySpec& now, double min_gain_frac,
                                 std::optional<double> power_budget_w = std::nullopt);

// The what-if table as fixed-width text (what --topology auto prints before training); with a colocated row,
// a last line says its overlap and memory fit and where they come from.
std::string format_whatif_table(const RoleMeasurements& m, const std::vector<SplitPrediction>& preds,
                                const std::string& mark_split);
// {"measurements": {...}, "whatif": [...], "best": "T-D"}: what --topology auto records in metrics.h5.
std::string whatif_json(const RoleMeasurements& m, const std::vector<SplitPrediction>& preds,
                        const std::optional<SplitPrediction>& chosen);

}  // namespace dflash
