// Which data plane a job uses (--data-plane, data_plane.h), agreed by every rank, and the factory.
//   auto: nccl when every target-drafter pair of every node has two GPUs and NCCL sets the pairs up,
//         else cuda-mpi when the MPI library is CUDA-aware on every rank, else host.
// An explicit plane that cannot work is refused here, before any model loads (BadOptions, exit 2).
#include <string>
#include <vector>

#include "base/device_runtime.h"  // fatal_no_cuda
#include "dflash/data_plane.h"
#include "dflash/error.h"
#include "dflash/mpi_typed.h"
#include "dflash/topology.h"

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>  // MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

namespace dflash {

namespace {

// Every rank's answer ANDed over the world (idle ranks vote yes), bounded by the peers' deadline.
bool all_ranks_agree(bool mine, double timeout_s, const char* what) {
  int32_t v = mine ? 1 : 0;
  MPI_Request r = mpi::iallreduce(&v, 1, MPI_MIN, MPI_COMM_WORLD);
  mpi::wait(r, timeout_s, [&] { return std::string("lost peer: a rank did not answer ") + what; });
  return v == 1;
}

// This rank's partners on its node: a target's drafters, a drafter's targets.
const std::vector<int>& partners_of(const Topology& topo) {
  static const std::vector<int> none;
  if (topo.role == Role::Target) return topo.node_drafters;
  if (topo.role == Role::Drafter) return topo.node_targets;
  return none;
}

// A partner on the same GPU as this rank (NCCL refuses two ranks of a communicator on one GPU), or one
// whose GPU is unknown; -1 when none.
int partner_sharing_gpu(const Topology& topo) {
  for (int p : partners_of(topo))
    if (!topo.places[static_cast<size_t>(topo.world_rank)].gpu_bus[0] || !topo.places[static_cast<size_t>(p)].gpu_bus[0] ||
        topo.same_gpu(topo.world_rank, p))
      return p;
  return -1;
}

}  // namespace

const char* data_plane_choice_name(DataPlaneChoice c) {
  switch (c) {
    case DataPlaneChoice::Auto: return "auto";
    case DataPlaneChoice::Nccl: return "nccl";
    case DataPlaneChoice::CudaMpi: return "cuda-mpi";
    case DataPlaneChoice::Host: return "host";
  }
  return "?";
}

const char* data_plane_name(DataPlaneKind k) {
  switch (k) {
    case DataPlaneKind::Host: return "host";
    case DataPlaneKind::CudaMpi: return "cuda-mpi";
    case DataPlaneKind::Nccl: return "nccl";
    case DataPlaneKind::Local: return "local";
  }
  return "?";
}

std::string CudaAwareMpi::describe() const {
  return std::string("compile-time ") + (compiled ? "yes" : "no") + ", run-time " + (runtime ? "yes" : "no");
}

CudaAwareMpi query_cuda_aware_mpi() {
  CudaAwareMpi a;
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  a.compiled = true;
#endif
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  a.runtime = MPIX_Query_cuda_support() == 1;
#endif
  return a;
}

DataPlaneSetup setup_data_plane(DataPlaneChoice choice, Device backend, const Topology& topo, const Ctx& ctx, double timeout_s) {
  DataPlaneSetup s;
  if (topo.spec.colocated()) {  // every rank is colocated: nothing to agree on, nothing travels
    s.kind = DataPlaneKind::Local;
    s.why = std::string("colocated: each rank's target forward writes into its own drafter's slots, no transfer") +
            (choice == DataPlaneChoice::Auto ? "" : std::string("; --data-plane ") + data_plane_choice_name(choice) + " does not apply");
    return s;
  }
  if (backend == Device::CPU || choice == DataPlaneChoice::Host) {
    s.why = backend == Device::CPU ? "the CPU backend's tensors are host memory" : "--data-plane host";
    return s;
  }
  std::string refused;  // why auto passed over nccl
  if (choice == DataPlaneChoice::Nccl || choice == DataPlaneChoice::Auto) {
    const int shared = partner_sharing_gpu(topo);
    DF_CHECK_HINT(choice != DataPlaneChoice::Nccl || shared < 0, BadOptions,
                  "--data-plane nccl: rank " << topo.world_rank << " and its partner rank " << shared
                                             << " share a GPU, and NCCL refuses two ranks of a communicator on one GPU",
                  "run one rank per GPU, or use --data-plane cuda-mpi (a CUDA-aware MPI) or host");
    if (all_ranks_agree(shared < 0, timeout_s, "which GPUs the ranks use")) {
      std::string error;
      if (!make_nccl_pairs)
        error = "this build has no NCCL";
      else if (topo.role != Role::Idle)
        s.nccl = make_nccl_pairs(topo, ctx, timeout_s, &error);
      DF_CHECK_HINT(choice != DataPlaneChoice::Nccl || error.empty(), BadOptions, "--data-plane nccl: " << error,
                    "rerun with NCCL_DEBUG=WARN to see why, or use --data-plane cuda-mpi or host");
      if (all_ranks_agree(error.empty(), timeout_s, "whether NCCL set up")) {
        s.kind = DataPlaneKind::Nccl;
        s.why = choice == DataPlaneChoice::Auto ? "auto: every target-drafter pair has GPUs of its own" : "--data-plane nccl";
        return s;
      }
      s.nccl.reset();  // some rank's NCCL failed: nobody uses it
      refused = "NCCL did not set up on every rank";
    } else {
      refused = "a target and a drafter share a GPU (NCCL needs one each)";
    }
  }
  const CudaAwareMpi mpi = query_cuda_aware_mpi();
  DF_CHECK_HINT(choice != DataPlaneChoice::CudaMpi || mpi.usable(), BadOptions,
                "--data-plane cuda-mpi: this MPI library is not CUDA-aware (" << mpi.describe() << ")",
                "use a CUDA-aware MPI (a cluster's UCX or --with-cuda Open MPI; tools/build_cuda_openmpi.sh builds one and "
                "dflash-train must be built against it), or --data-plane nccl or host");
  if (all_ranks_agree(mpi.usable(), timeout_s, "whether MPI is CUDA-aware")) {
    s.kind = DataPlaneKind::CudaMpi;
    s.why = choice == DataPlaneChoice::Auto ? "auto: " + refused + "; the MPI library is CUDA-aware" : "--data-plane cuda-mpi";
    return s;
  }
  s.kind = DataPlaneKind::Host;
  s.why = "auto: " + refused + "; the MPI library is not CUDA-aware (" + mpi.describe() + ")";
  return s;
}

std::unique_ptr<DataPlane> make_data_plane(const DataPlaneSpec& spec) {
  switch (spec.kind) {
    case DataPlaneKind::Host:
    case DataPlaneKind::CudaMpi: return make_mpi_data_plane(spec);
    case DataPlaneKind::Nccl:
      if (!make_nccl_data_plane) fatal_no_cuda("the nccl data plane");
      return make_nccl_data_plane(spec);
    case DataPlaneKind::Local: return make_local_data_plane(spec);
  }
  DF_FAIL(Internal, "unknown data plane kind " << static_cast<int>(spec.kind), "");
}

}  // namespace dflash
