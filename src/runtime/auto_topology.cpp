// The what-if model (include/dflash/auto_topology.h). Keep in step with tools/dflash_report/model.py.
#include "dflash/auto_topology.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "dflash/error.h"
#include "plan/layout_plan.h"  // colocated_seconds_per_batch: the layout plan prices its colocated row the same way

namespace dflash {

double ring_allreduce_factor(int drafters_total) {
  return drafters_total <= 1 ? 0.0 : 2.0 * (drafters_total - 1) / drafters_total;
}

const char* split_limit_name(SplitLimit l) { return l == SplitLimit::Target ? "target" : "drafter"; }

const char* colocated_fit_name(ColocatedFit f) {
  return f == ColocatedFit::Fits ? "fits" : f == ColocatedFit::DoesNotFit ? "does not fit" : "unknown";
}

ColocatedFit parse_colocated_fit(const std::string& name) {
  if (name == "fits") return ColocatedFit::Fits;
  if (name == "does not fit") return ColocatedFit::DoesNotFit;
  return ColocatedFit::Unknown;
}

double colocated_overlap(double target_s, double drafter_s, double both_s) {
  const double shorter = std::min(target_s, drafter_s);
  if (!(shorter > 0) || !std::isfinite(both_s)) return 0;
  return std::min((target_s + drafter_s - both_s) / shorter, 1.0);
}

std::string SplitPrediction::split() const {
  return layout == Layout::Colocated ? "colocated" : std::to_string(targets) + "-" + std::to_string(drafters);
}

TopologySpec SplitPrediction::spec() const {
  return layout == Layout::Colocated ? colocated_spec() : TopologySpec{targets, drafters};
}

int SplitPrediction::gpus() const { return layout == Layout::Colocated ? targets : targets + drafters; }

SplitPrediction predict_split(const RoleMeasurements& m, int targets, int drafters) {
  const int idle = m.gpus_per_node - targets - drafters;
  DF_CHECK(targets >= 1 && drafters >= 1 && idle >= 0, Internal,
           "predict_split " << targets << "-" << drafters << " on " << m.gpus_per_node << " GPUs");
  DF_CHECK(m.target_s_per_batch > 0 && m.drafter_s_per_batch > 0, Internal, "predict_split without service times");
  const double n = m.nodes;
  SplitPrediction p;
  p.targets = targets;
  p.drafters = drafters;
  p.idle = idle;
  p.target_cap_bps = n * targets / m.target_s_per_batch;
  p.allreduce_s_per_batch = m.allreduce_coeff_s.value_or(0.0) * ring_allreduce_factor(m.nodes * drafters);
  p.drafter_cap_bps = n * drafters / (m.drafter_s_per_batch + p.allreduce_s_per_batch);
  p.batches_per_s = std::min(p.target_cap_bps, p.drafter_cap_bps);
  p.ktok_per_s = p.batches_per_s * m.tokens_per_batch / 1000.0;
  p.limit = p.target_cap_bps <= p.drafter_cap_bps ? SplitLimit::Target : SplitLimit::Drafter;
  if (m.power_target_w && m.power_drafter_w && (idle == 0 || m.power_idle_w)) {
    p.power_w = n * (targets * *m.power_target_w + drafters * *m.power_drafter_w + idle * m.power_idle_w.value_or(0.0));
    if (*p.power_w > 0) p.ktok_per_kw = p.ktok_per_s / (*p.power_w / 1000.0);
  }
  if (m.remaining_tokens && p.ktok_per_s > 0) p.eta_s = *m.remaining_tokens / (p.ktok_per_s * 1000.0);
  return p;
}

std::vector<SplitPrediction> predict_all_splits(const RoleMeasurements& m) {
  std::vector<SplitPrediction> out;
  for (int t = m.gpus_per_node - 1; t >= 1; --t)
    for (int d = 1; t + d <= m.gpus_per_node; ++d) out.push_back(predict_split(m, t, d));
  return out;
}

SplitPrediction predict_colocated(const RoleMeasurements& m) {
  const double t = m.target_s_per_batch, d = m.drafter_s_per_batch;
  DF_CHECK(t > 0 && d > 0, Internal, "predict_colocated without service times");
  const double n = m.nodes, g = m.gpus_per_node;
  SplitPrediction p;
  p.layout = Layout::Colocated;
  p.targets = p.drafters = m.gpus_per_node;
  p.fit = m.colocated_fit;
  p.allreduce_s_per_batch = m.allreduce_coeff_s.value_or(0.0) * ring_allreduce_factor(m.nodes * m.gpus_per_node);
  // Each role alone on every GPU: what the rate would be if the other cost nothing.
  p.target_cap_bps = n * g / t;
  p.drafter_cap_bps = n * g / (d + p.allreduce_s_per_batch);
  // At most 1: a batch never takes less than its longer role. Below 0 it is what was measured (contention).
  if (m.colocated_overlap) p.overlap = std::min(*m.colocated_overlap, 1.0);
  p.batches_per_s = n * g / plan::colocated_seconds_per_batch(t, d, p.allreduce_s_per_batch, p.overlap.value_or(0.0));
  p.ktok_per_s = p.batches_per_s * m.tokens_per_batch / 1000.0;
  p.limit = t >= d + p.allreduce_s_per_batch ? SplitLimit::Target : SplitLimit::Drafter;
  if (m.power_target_w && m.power_drafter_w) {
    // A GPU that runs both draws each role's power for that role's share of the batch's time.
    p.power_w = n * g * (*m.power_target_w * t + *m.power_drafter_w * d) / (t + d);
    if (*p.power_w > 0) p.ktok_per_kw = p.ktok_per_s / (*p.power_w / 1000.0);
  }
  if (m.remaining_tokens && p.ktok_per_s > 0) p.eta_s = *m.remaining_tokens / (p.ktok_per_s * 1000.0);
  return p;
}

SplitPrediction predict_layout(const RoleMeasurements& m, const TopologySpec& layout) {
  return layout.colocated() ? predict_colocated(m) : predict_split(m, layout.targets_per_node, layout.drafters_per_node);
}

std::vector<SplitPrediction> predict_all_layouts(const RoleMeasurements& m) {
  std::vector<SplitPrediction> out = predict_all_splits(m);
  out.push_back(predict_colocated(m));
  return out;
}

namespace {
constexpr double kTieFraction = 0.005;  // closer predictions are measurement noise

bool better(const SplitPrediction& a, const SplitPrediction& b) {
  const double top = std::max(a.batches_per_s, b.batches_per_s);
  if (std::fabs(a.batches_per_s - b.batches_per_s) > kTieFraction * top) return a.batches_per_s > b.batches_per_s;
  if (a.power_w && b.power_w && *a.power_w != *b.power_w) return *a.power_w < *b.power_w;
  return a.gpus() < b.gpus();
}
}  // namespace

std::optional<SplitPrediction> best_split(const std::vector<SplitPrediction>& preds, std::optional<double> power_budget_w) {
  std::optional<SplitPrediction> best;
  for (const SplitPrediction& p : preds) {
    if (p.layout == Layout::Colocated && (!p.overlap || p.fit == ColocatedFit::DoesNotFit)) continue;
    if (power_budget_w && (!p.power_w || *p.power_w > *power_budget_w)) continue;
    if (!best || better(p, *best)) best = p;
  }
  return best;
}

RebalanceChoice choose_rebalance(const RoleMeasurements& m, const TopologySpec& now, double min_gain_frac,
                                 std::optional<double> power_budget_w) {
  RebalanceChoice c;
  c.now = predict_layout(m, now);
  c.best = best_split(predict_all_layouts(m), power_budget_w);
  char line[256];
  if (!c.best) {
    std::snprintf(line, sizeof(line), "no layout fits --power-budget-w %.0f W (or the GPUs' power is not measured): keep %s",
                  power_budget_w.value_or(0), c.now.split().c_str());
    c.why = line;
    return c;
  }
  c.gain = c.now.batches_per_s > 0 ? c.best->batches_per_s / c.now.batches_per_s - 1 : 0;
  const bool other = c.best->split() != c.now.split();
  if (other && c.gain >= min_gain_frac) c.to = c.best;
  if (other)
    std::snprintf(line, sizeof(line), "%s predicted %.3f b/s, the best, %s, %.3f b/s (%+.1f %%; the bar is %+.1f %%)%s",
                  c.now.split().c_str(), c.now.batches_per_s, c.best->split().c_str(), c.best->batches_per_s,
                  100 * c.gain, 100 * min_gain_frac, c.to ? "" : ": keep it");
  else
    std::snprintf(line, sizeof(line), "%s predicted %.3f b/s, the best of every layout: keep it", c.now.split().c_str(),
                  c.now.batches_per_s);
  c.why = line;
  // A faster colocated row that is no candidate: say why it is not the choice.
  const SplitPrediction co = predict_colocated(m);
  if (!c.now.spec().colocated() && co.batches_per_s > c.best->batches_per_s && (!co.overlap || co.fit == ColocatedFit::DoesNotFit)) {
    std::snprintf(line, sizeof(line), " (colocated would predict %.3f b/s, but %s)", co.batches_per_s,
                  !co.overlap ? "its overlap is not measured: --topology auto measures it" : "a colocated rank does not fit");
    c.why += line;
  }
  return c;
}

std::string format_whatif_table(const RoleMeasurements& m, const std::vector<SplitPrediction>& preds,
                                const std::string& mark_split) {
  std::string out = "  layout     idle  tgt cap b/s  dft cap b/s  pred b/s   Ktok/s  limit     power W  Ktok/s/kW\n";
  char line[240];
  bool colocated = false;
  for (const SplitPrediction& p : preds) {
    char power[32] = "       -", per_kw[32] = "        -";
    if (p.power_w) std::snprintf(power, sizeof(power), "%8.0f", *p.power_w);
    if (p.ktok_per_kw) std::snprintf(per_kw, sizeof(per_kw), "%9.2f", *p.ktok_per_kw);
    std::snprintf(line, sizeof(line), " %s%-10s%4d  %11.3f  %11.3f  %8.3f %8.2f  %-8s%s  %s%s\n",
                  p.split() == mark_split ? "*" : " ", p.split().c_str(), p.idle, p.target_cap_bps, p.drafter_cap_bps,
                  p.batches_per_s, p.ktok_per_s, split_limit_name(p.limit), power, per_kw,
                  p.fit == ColocatedFit::DoesNotFit ? "  (does not fit)" : "");
    out += line;
    colocated = colocated || p.layout == Layout::Colocated;
  }
  if (colocated) {
    if (m.colocated_overlap)
      std::snprintf(line, sizeof(line), "  colocated: overlap %.2f of the shorter role (measured), memory %s\n",
                    std::min(*m.colocated_overlap, 1.0), colocated_fit_name(m.colocated_fit));
    else
      std::snprintf(line, sizeof(line), "  colocated: overlap not measured (taken as 0: the roles take turns; not a candidate), memory %s\n",
                    colocated_fit_name(m.colocated_fit));
    out += line;
  }
  return out;
}

namespace {
nlohmann::json opt_json(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }
}  // namespace

std::string whatif_json(const RoleMeasurements& m, const std::vector<SplitPrediction>& preds,
                        const std::optional<SplitPrediction>& chosen) {
  nlohmann::json j;
  j["measurements"] = {{"gpus_per_node", m.gpus_per_node},
                       {"nodes", m.nodes},
                       {"target_s_per_batch", m.target_s_per_batch},
                       {"drafter_s_per_batch", m.drafter_s_per_batch},
                       {"allreduce_coeff_s", opt_json(m.allreduce_coeff_s)},
                       {"tokens_per_batch", m.tokens_per_batch},
                       {"power_target_w", opt_json(m.power_target_w)},
                       {"power_drafter_w", opt_json(m.power_drafter_w)},
                       {"power_idle_w", opt_json(m.power_idle_w)},
                       {"remaining_tokens", opt_json(m.remaining_tokens)},
                       {"colocated_overlap", opt_json(m.colocated_overlap)},
                       {"colocated_fit", colocated_fit_name(m.colocated_fit)}};
  nlohmann::json rows = nlohmann::json::array();
  for (const SplitPrediction& p : preds)
    rows.push_back({{"split", p.split()},
                    {"layout", p.layout == Layout::Colocated ? "colocated" : "split"},
                    {"fit", colocated_fit_name(p.fit)},
                    {"overlap", opt_json(p.overlap)},
                    {"targets", p.targets},
                    {"drafters", p.drafters},
                    {"idle", p.idle},
                    {"target_cap_bps", p.target_cap_bps},
                    {"drafter_cap_bps", p.drafter_cap_bps},
                    {"batches_per_s", p.batches_per_s},
                    {"ktok_per_s", p.ktok_per_s},
                    {"limit", split_limit_name(p.limit)},
                    {"allreduce_s_per_batch", p.allreduce_s_per_batch},
                    {"power_w", opt_json(p.power_w)},
                    {"ktok_per_kw", opt_json(p.ktok_per_kw)},
                    {"eta_s", opt_json(p.eta_s)}});
  j["whatif"] = rows;
  j["best"] = chosen ? nlohmann::json(chosen->split()) : nlohmann::json(nullptr);
  return j.dump();
}

}  // namespace dflash
