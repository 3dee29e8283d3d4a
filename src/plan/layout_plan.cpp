// Every layout's prediction and the recommendation: src/plan/layout_plan.h; docs/cost_model.md "The plan".
#include "plan/layout_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dflash/error.h"
#include "dflash/micro_batches.h"

namespace dflash::plan {

int Layout::gpus() const { return kind == LayoutKind::Colocated ? targets : targets + drafters; }

std::string Layout::name() const {
  return kind == LayoutKind::Colocated ? std::string("colocated") : std::to_string(targets) + "-" + std::to_string(drafters);
}

const char* binding_role_name(BindingRole r) {
  switch (r) {
    case BindingRole::Target: return "target";
    case BindingRole::Drafter: return "drafter";
    case BindingRole::Transport: return "transport";
    case BindingRole::Both: return "both";
  }
  return "?";
}

const char* memory_fit_name(MemoryFit f) {
  switch (f) {
    case MemoryFit::Fits: return "yes";
    case MemoryFit::DoesNotFit: return "NO";
    case MemoryFit::Unknown: return "?";
  }
  return "?";
}

MemoryFit memory_fit(double bytes, double gpu_bytes) {
  if (bytes <= 0 || gpu_bytes <= 0) return MemoryFit::Unknown;
  return bytes <= gpu_bytes ? MemoryFit::Fits : MemoryFit::DoesNotFit;
}

double colocated_seconds_per_batch(double target_s, double drafter_s, double allreduce_s, double overlap) {
  const double o = std::min(overlap, 1.0);
  const double both = target_s + drafter_s + allreduce_s - o * std::min(target_s, drafter_s);
  return std::max(both, std::max(target_s, drafter_s + allreduce_s));
}

namespace {

// The job's K for this many drafters (include/dflash/micro_batches.h: the job's own rule), capped where the
// job would refuse the step.
int grad_accum_for(const JobCostInputs& j, int drafters_total) {
  if (j.global_batch_tokens <= 0) return std::max(1, j.grad_accum);
  const int64_t k = micro_batches_for(j.global_batch_tokens, j.target_batch.tokens * drafters_total);
  return static_cast<int>(std::min<int64_t>(k, kMostMicroBatches));
}

// Two rates within 0.5 % of each other: both roles bind (a balanced split).
BindingRole binding(double target, double drafter, double transport) {
  const double m = std::min({target, drafter, transport});
  if (transport <= m * 1.0005 && transport < std::min(target, drafter)) return BindingRole::Transport;
  if (std::abs(target - drafter) <= 0.005 * std::max(target, drafter)) return BindingRole::Both;
  return target < drafter ? BindingRole::Target : BindingRole::Drafter;
}

}  // namespace

double shared_gpu_seconds_per_batch(const Plan& p) {
  const double back_to_back = p.target_forward_s + p.drafter_step_s;
  return p.colocated_regime == ColocatedRegime::MemoryFull ? back_to_back / kColocatedMemoryFullRate : back_to_back;
}

Plan plan_layouts(const PlanRequest& r) {
  const ClusterInputs& c = r.cluster;
  const JobCostInputs& j = r.job;
  if (c.gpus_per_node < 1 || c.nodes < 1)
    fatal(ExitCode::BadOptions, "plan: a node of " + std::to_string(c.gpus_per_node) + " GPUs, " +
                                    std::to_string(c.nodes) + " nodes", "plan at least one node of at least one GPU");
  if (!(c.gpu.colocated_overlap >= 0 && c.gpu.colocated_overlap <= 1))
    fatal(ExitCode::BadOptions, "plan: colocated overlap " + std::to_string(c.gpu.colocated_overlap) + " of " + c.gpu.name +
                                    " outside [0, 1]", "a calibration's colocated_overlap is a share of the shorter role's time");
  Plan p;
  p.gpu_name = c.gpu.name;
  p.gpu_source = calibration_source_name(c.gpu.source);
  p.link = transport_link_name(c.link);
  p.nodes = c.nodes;
  p.gpus_per_node = c.gpus_per_node;
  p.colocated_overlap = c.gpu.colocated_overlap;
  p.target_forward_s = target_forward_cost(j.target, j.target_batch, c.gpu).seconds();
  const DrafterStepCost step = drafter_step_cost(j.drafter, j.drafter_batch, c.gpu);
  p.drafter_step_s = step.seconds();
  p.batch_bytes = batch_wire_bytes(j.target_batch.tokens, j.target.hidden, j.drafter.captured_layers, j.final_norm_sent,
                                   j.hs_dtype);
  p.transport_s = transport_seconds(p.batch_bytes, c.link, c.gpu);
  const double tokens = static_cast<double>(j.target_batch.tokens), anchors = static_cast<double>(j.drafter_batch.anchors);
  const double N = c.nodes;

  auto finish = [&](LayoutPrediction& lp, double busy_gpus_w_target, double busy_gpus_w_drafter) {
    lp.batches_per_s = std::min({lp.target_batches_per_s, lp.drafter_batches_per_s, lp.transport_batches_per_s});
    lp.binds = binding(lp.target_batches_per_s, lp.drafter_batches_per_s, lp.transport_batches_per_s);
    lp.tokens_per_s = lp.batches_per_s * tokens;
    lp.anchors_per_s = lp.batches_per_s * anchors;
    if (c.gpu.tdp_watts > 0) {
      // Each role's GPUs draw the board power for the share of time they are busy; idle GPUs and idle time
      // are not counted (no idle draw is calibrated).
      const double busy_t = lp.batches_per_s / lp.target_batches_per_s, busy_d = lp.batches_per_s / lp.drafter_batches_per_s;
      lp.power_w = c.gpu.tdp_watts * (busy_gpus_w_target * busy_t + busy_gpus_w_drafter * busy_d);
      lp.within_power_budget = r.power_budget_w <= 0 || lp.power_w <= r.power_budget_w;
    } else {
      lp.within_power_budget = r.power_budget_w <= 0;  // a budget cannot be checked without the power
    }
  };

  for (int t = 1; t < c.gpus_per_node; ++t)
    for (int d = 1; t + d <= c.gpus_per_node; ++d) {
      LayoutPrediction lp;
      lp.layout = Layout{LayoutKind::Split, t, d};
      const int drafters = d * c.nodes;
      lp.grad_accum = grad_accum_for(j, drafters);
      lp.allreduce_s = allreduce_seconds(step.parameters, drafters, c.nodes, c.gpu, c.internode_gbps) / lp.grad_accum;
      lp.drafter_step_s = p.drafter_step_s + lp.allreduce_s;
      lp.target_batches_per_s = N * t / p.target_forward_s;
      lp.drafter_batches_per_s = N * d / lp.drafter_step_s;
      // Each transfer is one target to one drafter; at most min(T, D) move at once per node, overlapped with
      // the compute (two send buffers, docs/pipeline.md).
      lp.transport_batches_per_s = N * std::min(t, d) / p.transport_s;
      const double accum = lp.grad_accum > 1 ? r.memory.accumulator_bytes : 0;
      const double drafter_bytes = r.memory.drafter_bytes > 0 ? r.memory.drafter_bytes + accum : 0;
      const MemoryFit ft = memory_fit(r.memory.target_bytes, c.gpu.memory_bytes), fd = memory_fit(drafter_bytes, c.gpu.memory_bytes);
      lp.fit = ft == MemoryFit::DoesNotFit || fd == MemoryFit::DoesNotFit ? MemoryFit::DoesNotFit
               : ft == MemoryFit::Fits && fd == MemoryFit::Fits           ? MemoryFit::Fits
                                                                          : MemoryFit::Unknown;
      lp.largest_role_bytes = (r.memory.target_bytes > 0 && drafter_bytes > 0) ? std::max(r.memory.target_bytes, drafter_bytes) : 0;
      finish(lp, N * t, N * d);
      p.layouts.push_back(lp);
    }

  if (r.include_colocated) {
    // Every GPU forwards a batch and trains on it (colocated_seconds_per_batch), the allreduce over all G x N
    // drafters; no transport between GPUs (the features stay on the GPU). Its memory: both roles' fixed parts
    // on one GPU, as the job checks a colocated rank.
    LayoutPrediction lp;
    const int G = c.gpus_per_node;
    lp.layout = Layout{LayoutKind::Colocated, G, G};
    lp.grad_accum = grad_accum_for(j, G * c.nodes);
    lp.allreduce_s = allreduce_seconds(step.parameters, G * c.nodes, c.nodes, c.gpu, c.internode_gbps) / lp.grad_accum;
    lp.drafter_step_s = p.drafter_step_s + lp.allreduce_s;
    lp.fit = memory_fit(r.memory.colocated_bytes, c.gpu.memory_bytes);
    lp.largest_role_bytes = lp.fit == MemoryFit::Unknown ? 0 : r.memory.colocated_bytes;
    p.colocated_fill = lp.fit == MemoryFit::Unknown ? 0 : r.memory.colocated_bytes / c.gpu.memory_bytes;
    // (A rank that does not fit is priced as if it did: what a GPU with more memory would give.)
    p.colocated_regime = lp.fit == MemoryFit::Fits && p.colocated_fill >= kColocatedMemoryFullFill ? ColocatedRegime::MemoryFull
                                                                                          : ColocatedRegime::Overlapped;
    const double per_batch = p.colocated_regime == ColocatedRegime::MemoryFull
                                 ? (p.target_forward_s + lp.drafter_step_s) / kColocatedMemoryFullRate
                                 : colocated_seconds_per_batch(p.target_forward_s, p.drafter_step_s, lp.allreduce_s,
                                                               c.gpu.colocated_overlap);
    lp.batches_per_s = N * G / per_batch;
    // Each role's own ceiling on these GPUs (what it would give if the other cost nothing): which one binds.
    lp.target_batches_per_s = N * G / p.target_forward_s;
    lp.drafter_batches_per_s = N * G / lp.drafter_step_s;
    lp.transport_batches_per_s = std::numeric_limits<double>::infinity();
    lp.binds = binding(lp.target_batches_per_s, lp.drafter_batches_per_s, lp.transport_batches_per_s);
    lp.tokens_per_s = lp.batches_per_s * tokens;
    lp.anchors_per_s = lp.batches_per_s * anchors;
    if (c.gpu.tdp_watts > 0) {
      lp.power_w = c.gpu.tdp_watts * N * G;  // every GPU busy all the time
      lp.within_power_budget = r.power_budget_w <= 0 || lp.power_w <= r.power_budget_w;
    } else {
      lp.within_power_budget = r.power_budget_w <= 0;
    }
    p.layouts.push_back(lp);
  }

  // The recommendation: the fastest layout that fits (or whose fit is unknown) within the budget; among
  // equally fast ones (within 0.5 %) the one that draws less power, then the one with fewer GPUs.
  for (size_t i = 0; i < p.layouts.size(); ++i) {
    const LayoutPrediction& lp = p.layouts[i];
    if (lp.fit == MemoryFit::DoesNotFit || !lp.within_power_budget) continue;
    if (p.recommended < 0) {
      p.recommended = static_cast<int>(i);
      continue;
    }
    const LayoutPrediction& best = p.layouts[static_cast<size_t>(p.recommended)];
    const bool faster = lp.batches_per_s > best.batches_per_s * 1.005;
    const bool tie = !faster && lp.batches_per_s >= best.batches_per_s * 0.995;
    const int gpus = lp.layout.gpus(), best_gpus = best.layout.gpus();
    const bool cheaper = lp.power_w >= 0 && best.power_w >= 0 ? lp.power_w < best.power_w * 0.995 : gpus < best_gpus;
    if (faster || (tie && cheaper)) p.recommended = static_cast<int>(i);
  }
  if (r.chosen) {
    for (size_t i = 0; i < p.layouts.size(); ++i)
      if (p.layouts[i].layout == *r.chosen) p.chosen = static_cast<int>(i);
    if (p.chosen >= 0 && p.recommended >= 0)
      p.chosen_shortfall_pct = 100.0 * (1.0 - p.layouts[static_cast<size_t>(p.chosen)].batches_per_s /
                                                  p.layouts[static_cast<size_t>(p.recommended)].batches_per_s);
  }
  return p;
}

}  // namespace dflash::plan
