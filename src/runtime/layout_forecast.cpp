// This job's layout plan: layout_forecast.h.
#include "layout_forecast.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dflash/anchors.h"  // default_max_anchors
#include "dflash/error.h"
#include "dflash/mpi_typed.h"
#include "dry_run_plan.h"
#include "layout_plan_inputs.h"

namespace dflash {

std::optional<double> mean_record_tokens(const Options& o) {
  double records = 0, tokens = 0;
  for (const DataSource& d : o.data) {
    const auto [r, t] = dataset_shape(d.path);
    if (r <= 0 || t < 0) return std::nullopt;
    records += static_cast<double>(r);
    tokens += static_cast<double>(t);
  }
  return records > 0 ? std::optional<double>(tokens / records) : std::nullopt;
}

std::optional<plan::GpuCalibration> forecast_calibration(const Options& o, double gpu_bytes) {
  plan::GpuCalibration cal;
  if (!o.plan_gpu.empty()) {
    const PlannedGpu g = parse_planned_gpu(o.plan_gpu);
    // A named kind, or a size in GiB (calibration_for scales the H100's rates to it).
    cal = plan::calibration_for(g.model.empty() ? o.plan_gpu : g.name);
  } else if (o.backend == Device::CUDA && gpu_bytes > 0) {
    cal = plan::calibration_for_memory(gpu_bytes);  // this node's GPU, known by its memory
  } else {
    return std::nullopt;
  }
  if (!o.calibration_file.empty()) cal = plan::calibration_from_file(o.calibration_file, cal.name);
  return cal;
}

std::optional<LayoutForecast> forecast_layouts(const Options& o, const ModelPlan& model, const RoleMemory& memory,
                                               double gpu_bytes, int nodes, int gpus_per_node,
                                               std::optional<plan::Layout> chosen) {
  const std::optional<plan::GpuCalibration> cal = forecast_calibration(o, gpu_bytes);
  if (!cal) return std::nullopt;
  LayoutForecast f;
  f.gpu = *cal;
  f.record_tokens = mean_record_tokens(o);
  plan::PlanRequest r = layout_plan_request(o, model, memory, *cal, nodes, gpus_per_node,
                                            f.record_tokens ? *f.record_tokens : static_cast<double>(o.token_budget));
  if (chosen) r.chosen = chosen;
  f.plan = plan::plan_layouts(r);
  f.tokens_per_batch = static_cast<double>(r.job.target_batch.tokens);
  f.anchors_per_batch = static_cast<double>(r.job.drafter_batch.anchors);
  return f;
}

std::string forecast_text(const LayoutForecast& f) {
  std::ostringstream os;
  os << "[dflash] layout plan (cost model, docs/cost_model.md; " << f.plan.nodes << " node(s) x " << f.plan.gpus_per_node
     << " GPU(s); records of "
     << (f.record_tokens ? std::to_string(std::llround(*f.record_tokens)) + " tokens on average in --data"
                         : std::string("unknown length"))
     << (f.gpu.source == plan::CalibrationSource::User ? "; --calibration " + f.gpu.basis : std::string())
     << "): predictions, not measurements\n";
  std::istringstream lines(plan::render_plan_table(f.plan));
  for (std::string line; std::getline(lines, line);)
    os << (line.rfind("[dflash]", 0) == 0 ? "" : "[dflash]   ") << line << "\n";
  return os.str();
}

std::string other_density_line(const Options& o, const ModelPlan& model, double gpu_bytes, int nodes, int gpus_per_node,
                               const LayoutForecast& here) {
  if (here.plan.recommended < 0) return "";
  // The two densities bench/quality compares (docs/recipe.md "Anchor density"): the reference trainers' 512 per
  // record, and one anchor per 8 tokens drawn over the batch (its 512 per 4096-token batch; the recipes' 2048
  // per 16384), the better per GPU-second at both widths measured.
  constexpr int kPerRecord = 512, kTokensPerAnchor = 8;
  Options other = o;
  const bool per_record = o.train.anchors_per_record > 0;
  other.train.anchors_per_record = per_record ? 0 : kPerRecord;
  other.train.max_anchors = per_record ? std::max<int64_t>(1, o.token_budget / kTokensPerAnchor)
                                       : default_max_anchors(kPerRecord, o.token_budget);
  const std::optional<LayoutForecast> f =
      forecast_layouts(other, model, plan_role_memory(other, model), gpu_bytes, nodes, gpus_per_node);
  if (!f || f->plan.recommended < 0) return "";
  const plan::LayoutPrediction& a = here.plan.layouts[static_cast<size_t>(here.plan.recommended)];
  const plan::LayoutPrediction& b = f->plan.layouts[static_cast<size_t>(f->plan.recommended)];
  char line[640];
  std::snprintf(line, sizeof line,
                "[dflash] anchors what-if: %s (%.0f anchors a batch) would recommend %s at %.0f tokens/s, %.0f "
                "anchors/s, against %s at %.0f tokens/s, %.0f anchors/s here (quality per GPU-second: "
                "docs/recipe.md \"Anchor density\")\n",
                per_record ? "one anchor per 8 tokens of the batch" : "512 anchors per record", f->anchors_per_batch,
                b.layout.name().c_str(), b.tokens_per_s, b.anchors_per_s, a.layout.name().c_str(), a.tokens_per_s,
                a.anchors_per_s);
  return line;
}

TopologySpec recommended_split(const LayoutForecast& f) {
  const plan::Plan& p = f.plan;
  if (p.recommended < 0) {
    // The fastest of those that do not fit, to say what is missing.
    std::string closest;
    double best = 0;
    for (const plan::LayoutPrediction& lp : p.layouts)
      if (lp.batches_per_s > best) {
        best = lp.batches_per_s;
        closest = lp.layout.name() + " (fits: " + plan::memory_fit_name(lp.fit) +
                  (lp.within_power_budget ? "" : ", over --power-budget-w") + ")";
      }
    fatal(ExitCode::BadOptions,
          "--topology plan: no layout of " + std::to_string(p.gpus_per_node) + " GPU(s) per node fits the " + p.gpu_name +
              "'s memory and the power budget" + (closest.empty() ? "" : "; the fastest is " + closest),
          "give --optimizer-state bf16 or a smaller --token-budget (--dry-run shows each role's memory), raise "
          "--power-budget-w, or give --topology T-D");
  }
  const plan::Layout& l = p.layouts[static_cast<size_t>(p.recommended)].layout;
  return l.kind == plan::LayoutKind::Colocated ? colocated_spec() : TopologySpec{l.targets, l.drafters};
}

TopologySpec choose_topology_plan(const Options& o, const ModelPlan& model, MPI_Comm world) {
  int rank = 0;
  DF_MPI(MPI_Comm_rank(world, &rank));
  const PlannedWorld w = mpi_world(world, o.backend);  // collective
  int split[3] = {0, 0, 0};
  if (rank == 0) {
    // --gpu's kind, else this node's GPU 0 by its memory (NVML, read without opening the device): the dry run's.
    const std::optional<LayoutForecast> f = forecast_layouts(o, model, plan_role_memory(o, model),
                                                             gpu_to_check(o).bytes, w.num_nodes, w.ranks_per_node);
    if (!f)
      fatal(ExitCode::BadOptions,
            std::string("--topology plan: no GPU kind to plan for") +
                (o.backend == Device::CUDA ? " (NVML does not see this node's GPU)" : " on the CPU backend"),
            "give --gpu h100|h200|b200|rtx-pro-6000 (or its memory in GiB), or --topology T-D");
    const TopologySpec s = recommended_split(*f);
    const plan::LayoutPrediction& best = f->plan.layouts[static_cast<size_t>(f->plan.recommended)];
    std::printf("%s[dflash] --topology plan: %s, predicted %.3f batches/s = %.0f tokens/s on %s (%s); nothing "
                "measured: dflash-report sets the prediction beside the run\n",
                forecast_text(*f).c_str(), s.to_string().c_str(), best.batches_per_s, best.tokens_per_s,
                f->plan.gpu_name.c_str(), f->plan.gpu_source.c_str());
    std::fflush(stdout);
    split[0] = s.targets_per_node;
    split[1] = s.drafters_per_node;
    split[2] = s.colocated() ? 1 : 0;
  }
  DF_MPI(MPI_Bcast(split, 3, MPI_INT, 0, world));
  return split[2] ? colocated_spec() : TopologySpec{split[0], split[1]};
}

nlohmann::json forecast_record(const LayoutForecast& f, const TopologySpec& running, bool gpus_shared,
                               TopologyChoice how) {
  const plan::Plan& p = f.plan;
  nlohmann::json run = {{"layout", running.to_string()}, {"gpus_shared", gpus_shared}};
  if (gpus_shared) {
    // Both roles' ranks on one GPU take turns (back to back, or below it where their memory fills the GPU)
    const double bps = p.gpus_per_node * p.nodes / plan::shared_gpu_seconds_per_batch(p);
    run["batches_per_s"] = bps;
    run["tokens_per_s"] = bps * f.tokens_per_batch;
    run["anchors_per_s"] = bps * f.anchors_per_batch;
  } else {
    for (const plan::LayoutPrediction& lp : p.layouts)
      if (running.colocated() ? lp.layout.kind == plan::LayoutKind::Colocated
                              : lp.layout.kind == plan::LayoutKind::Split && lp.layout.targets == running.targets_per_node &&
                                    lp.layout.drafters == running.drafters_per_node) {
        run["batches_per_s"] = lp.batches_per_s;
        run["tokens_per_s"] = lp.tokens_per_s;
        run["anchors_per_s"] = lp.anchors_per_s;
        run["binds"] = plan::binding_role_name(lp.binds);
        run["allreduce_s"] = lp.allreduce_s;
        run["grad_accum"] = lp.grad_accum;
      }
  }
  const nlohmann::json cal = plan::calibrations_to_json({f.gpu});
  return {{"version", 1},
          {"choice", how == TopologyChoice::Plan ? "plan" : how == TopologyChoice::Auto ? "auto" : "given"},
          {"calibration", cal},
          {"record_tokens", f.record_tokens ? nlohmann::json(*f.record_tokens) : nlohmann::json(nullptr)},
          {"tokens_per_batch", f.tokens_per_batch},
          {"anchors_per_batch", f.anchors_per_batch},
          {"running", run},
          {"plan", plan::plan_to_json(p)}};
}

}  // namespace dflash
