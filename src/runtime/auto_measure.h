// --topology auto: measure both roles on the real models and data, predict every split (auto_topology.h),
// pick one. Private to src/runtime (called by run_job before the roles exist).
#pragma once
#include <mpi.h>

#include <string>

#include "dflash/options.h"

namespace dflash {

// Collective over `world`. Every rank loads the target and a throwaway drafter, times a few target
// forwards and drafter steps (fwd + bwd + AdamW) on the first batches of --data, and one gradient-sized
// allreduce over all ranks; the averages go through the what-if model and the fastest split (within
// --power-budget-w when power is known) wins. Rank 0 prints the table and the choice. record_json gets
// what metrics.h5 stores as the attribute auto_topology. Fatal TopologyMismatch with < 2 ranks per node.
TopologySpec choose_topology_auto(const Options& o, MPI_Comm world, std::string* record_json);

}  // namespace dflash
