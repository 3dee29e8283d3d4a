// The runtime's side of checkpointing (include/dflash/checkpoint.h is the checkpoint floor's): where
// checkpoints go, what a resume must match, --resume resolved once for the job, and the drafters'
// checkpointer's configuration -- each from the options and the segment's plan.
#pragma once
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "dflash/checkpoint.h"
#include "dflash/options.h"

namespace dflash {

struct RunPlan;

// OUT/checkpoints unless --checkpoint-dir is given.
std::string checkpoint_dir_of(const Options& o);
// The options a resume must keep (of the segment's resolved record), plus the world size (the topology
// spec is per node) and the inputs' content identities (input_identities_of).
OptionMap resume_invariants_of(const std::vector<std::pair<std::string, std::string>>& resolved, int world_size,
                               const OptionMap& identities);
// The inputs' content identities (kDataIdentityKey, kTargetIdentityKey, kTargetConfigIdentityKey) of --data,
// opened as `data`, and --target.
OptionMap input_identities_of(const Options& o, const DatasetMix& data);
// Collective over `world`: world rank 0 resolves `resume` (--resume, or the checkpoint a re-split continues
// from; resolve_resume with --checkpoint-dir, default OUT/checkpoints) and every rank gets the same answer
// ("" = start fresh).
std::string resolve_resume_collective(const Options& o, const std::string& resume, MPI_Comm world);
// The drafters' checkpointer as this segment runs it.
CheckpointerConfig checkpointer_config(const Options& o, const RunPlan& plan);

}  // namespace dflash
