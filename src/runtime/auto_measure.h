// --topology auto: measure both roles on the real models and data, predict every split and the colocated
// layout (auto_topology.h), pick one. Private to src/runtime (called by run_job before the roles exist).
#pragma once
#include <mpi.h>

#include <optional>
#include <string>

#include "dflash/nvml.h"
#include "dflash/options.h"
#include "run_plan.h"

namespace dflash {

// Collective over `world`. Every rank, on its own backend (its GPU on CUDA), times a few target forwards,
// then a throwaway drafter's steps (fwd + bwd + AdamW) on the captured features, and one gradient-sized
// allreduce over all ranks. Where a colocated rank fits (check_colocated_fit: known to fit the GPU, or host
// memory on the CPU backend) the target stays loaded, on the colocated target's context, and each rank then
// times a forward and a step at once (the colocated overlap); else the target is released before the
// drafter is built and colocated is shown, not chosen (auto_topology.h); gpu
// (NVML, may be null) gives each role's mean power and the idle draw. The averages go through the
// what-if model and the fastest split (within --power-budget-w when power is known) wins. Rank 0 prints
// the table and the choice (a split, or colocated_spec()). record_json gets what metrics.h5 stores as the
// attribute auto_topology.
// Fatal TopologyMismatch with < 2 ranks per node, unless o.measure_only (then any count: one rank per
// GPU measures each role standalone). *planned gets the job's plan (plan_job, after the input paths are
// checked): the job goes on with it instead of parsing the configs again.
TopologySpec choose_topology_auto(const Options& o, MPI_Comm world, PowerSampler* gpu, std::string* record_json,
                                  std::optional<ModelPlan>* planned);

}  // namespace dflash
