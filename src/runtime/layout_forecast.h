// This job's layout plan (issue 44; docs/cost_model.md): the cost model's prediction of every layout for the
// GPU kind the job runs on (or --gpu names), with the recommendation. The dry run prints it, --topology plan
// runs its recommendation without measuring, and metrics.h5 keeps it (attribute layout_plan) so dflash-report
// can set the prediction beside what the run measured and write OUT/calibration.json, which --calibration
// reads back.
#pragma once
#include <mpi.h>

#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "dflash/options.h"
#include "dflash/topology.h"
#include "plan/layout_plan.h"
#include "run_plan.h"

namespace dflash {

struct RoleMemory;

struct LayoutForecast {
  plan::Plan plan;
  plan::GpuCalibration gpu;             // the constants it used (the built-in table's, or --calibration's)
  std::optional<double> record_tokens;  // the mean record length of --data; nullopt: unknown (the token budget)
  double tokens_per_batch = 0, anchors_per_batch = 0;
};

// The records' mean length in --data, from the files' shapes (nothing else read); nullopt when a file lacks
// them.
std::optional<double> mean_record_tokens(const Options& o);

// The GPU kind planned for: --gpu's, else this node's by its memory (gpu_bytes, 0 = none seen); nullopt
// without either, or on the CPU backend without --gpu. --calibration replaces the kind's built-in constants
// with the file's entry for it.
std::optional<plan::GpuCalibration> forecast_calibration(const Options& o, double gpu_bytes);

// The plan of this job on `nodes` nodes of `gpus_per_node` GPUs; `chosen`: the layout to measure against the
// recommendation (none: --topology as given, if given). nullopt where no GPU kind is known.
std::optional<LayoutForecast> forecast_layouts(const Options& o, const ModelPlan& model, const RoleMemory& memory,
                                               double gpu_bytes, int nodes, int gpus_per_node,
                                               std::optional<plan::Layout> chosen = std::nullopt);

// The dry run's lines: the table (render_plan_table) under a header naming the world, the records and the
// calibration source.
std::string forecast_text(const LayoutForecast& f);

// The plan at the other anchor density (issue 44 item 4: the what-if over anchors before the run): per record
// (512 per record, the reference trainers' rule) where this job samples per batch, per batch (one anchor per 8
// tokens of --token-budget, the recipes' density) where it samples per record. One line: the density, the
// recommendation and its tokens/s and anchors/s beside this job's; "" without a forecast. The other density's
// plan has its own memory (the cap sizes the drafter's buffers: a colocated rank may fit, or fill the GPU, at one
// density and not the other).
std::string other_density_line(const Options& o, const ModelPlan& model, double gpu_bytes, int nodes, int gpus_per_node,
                               const LayoutForecast& here);

// --topology plan: the recommended split. Fatal BadOptions when the plan recommends none (nothing fits the
// memory or the power budget), naming the closest layout.
TopologySpec recommended_split(const LayoutForecast& f);

// --topology plan in a job (collective over world): rank 0 plans this job for the world's nodes and the GPU
// it binds (or --gpu), prints the table and the choice; every rank gets the split. Fatal BadOptions where no
// GPU kind is known (the CPU backend without --gpu).
TopologySpec choose_topology_plan(const Options& o, const ModelPlan& model, MPI_Comm world);

// What metrics.h5 keeps as the attribute layout_plan: the plan (plan_to_json), the calibration it used, the
// batch's tokens and anchors, and the running layout's prediction. `running`: the segment's split;
// `gpus_shared`: its target and drafter ranks share GPUs (a one-GPU 1-1: predicted as the roles taking
// turns, plan::shared_gpu_seconds_per_batch).
nlohmann::json forecast_record(const LayoutForecast& f, const TopologySpec& running, bool gpus_shared,
                               TopologyChoice how);

}  // namespace dflash
