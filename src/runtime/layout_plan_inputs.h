// What the layout plan (src/plan/layout_plan.h) is asked, from the job's options and model plan: the cost
// model's shapes of this target, drafter, batch and anchors, the GPU kind's calibration, the node layout and
// each role's fixed memory (src/runtime/dry_run_plan.h). The dry run prints the answer (docs/cost_model.md).
#pragma once
#include <optional>
#include <string>

#include "dflash/options.h"
#include "plan/layout_plan.h"
#include "run_plan.h"

namespace dflash {

struct RoleMemory;

// The plan's request for this job on `nodes` nodes of `gpus_per_node` GPUs; chosen: --topology (none with
// auto). record_tokens: the mean record length of --data (the dry run reads it from the files' shapes), or the
// token budget when unknown.
plan::PlanRequest layout_plan_request(const Options& o, const ModelPlan& model, const RoleMemory& memory,
                                      const plan::GpuCalibration& gpu, int nodes, int gpus_per_node,
                                      double record_tokens);

}  // namespace dflash
