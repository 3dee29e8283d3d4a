// The runtime's side of checkpointing: see run_resume.h.
#include "run_resume.h"

#include "dflash/error.h"
#include "dflash/mpi_typed.h"
#include "run_plan.h"

namespace dflash {

std::string checkpoint_dir_of(const Options& o) {
  return o.checkpoint_dir.empty() ? o.out_dir + "/checkpoints" : o.checkpoint_dir;
}

OptionMap resume_invariants_of(const std::vector<std::pair<std::string, std::string>>& resolved, int world_size,
                               const OptionMap& identities) {
  OptionMap m = resume_invariants(resolved);
  m["world-size"] = std::to_string(world_size);
  for (const auto& [k, v] : identities) m[k] = v;
  return m;
}

OptionMap input_identities_of(const Options& o, const DatasetMix& data) {
  return {{kDataIdentityKey, dataset_identity(data)},
          {kTargetIdentityKey, target_weights_identity(o.target_dir)},
          {kTargetConfigIdentityKey, target_config_identity(o.target_dir)}};
}

std::string resolve_resume_collective(const Options& o, const std::string& resume, MPI_Comm world) {
  int rank = 0;
  DF_MPI(MPI_Comm_rank(world, &rank));
  std::string dir = rank == 0 ? resolve_resume(resume, checkpoint_dir_of(o)) : std::string();
  int64_t len = static_cast<int64_t>(dir.size());
  mpi::bcast(&len, 1, 0, world);
  dir.resize(static_cast<size_t>(len));
  if (len > 0) mpi::bcast(dir.data(), dir.size(), 0, world);
  return dir;
}

CheckpointerConfig checkpointer_config(const Options& o, const RunPlan& plan) {
  return CheckpointerConfig{checkpoint_dir_of(o), parse_checkpoint_every(o.checkpoint_every), o.keep_checkpoints,
                            o.export_checkpoints, o.export_dtype, plan.grad_accum, o.peer_timeout_s,
                            o.inject_stop_step};
}

}  // namespace dflash
