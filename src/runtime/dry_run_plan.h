// --dry-run's plan of the world and of each rank's memory (src/runtime/dry_run.cpp prints it). It needs no
// mpirun, no GPU and no weights: the world is this MPI world's or the one --ranks / --nodes name, the
// memory comes from config.json (and the sizes of the safetensors, when they are there), and --gpu names
// the GPU it is checked against (docs/pipeline.md "Options").
#pragma once
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "dflash/auto_topology.h"  // ColocatedFit
#include "dflash/options.h"
#include "dflash/topology.h"
#include "run_plan.h"

namespace dflash {

// Whose ranks the dry run plans: the MPI world it runs in, or the one --ranks / --nodes name (one process).
enum class WorldSource : uint8_t { Mpi, Planned };

// One rank of the planned world.
struct PlannedSeat {
  int node = 0, local_rank = 0;
  std::string host;  // "" for a planned world: its hosts are not known before the launch
  int gpu = -1;      // the CUDA device the job would bind; -1 on the CPU backend
};

struct PlannedWorld {
  WorldSource source = WorldSource::Mpi;
  int num_nodes = 1, ranks_per_node = 1;
  std::vector<PlannedSeat> seats;  // by world rank
  std::string device_note;         // what the GPU column assumes, when it is not what a rank sees ("" if it is)
  std::vector<RankSlot> slots() const;
};

// --ranks / --nodes: rank r on node r / G as node-local rank r % G, bound to GPU r % G (the job binds the
// node-local rank's GPU on a node that shows each rank all its GPUs). Pure.
PlannedWorld planned_world(int nodes, int ranks_per_node, Device backend);
// This MPI world (collective): every rank's node, local rank and host; the GPU each would bind (local rank
// % the devices it sees, as create_topology; the local rank where it sees none or the build has no CUDA:
// a login node). No device is opened.
PlannedWorld mpi_world(MPI_Comm world, Device backend);

// Bytes of the drafter step's block activations per anchor: the buffers of drafter/step_buffers.h that
// grow with --max-anchors.
double drafter_bytes_per_anchor(const DrafterConfig& d, bool cuda);

// The target's weights on --backend, and where the number comes from: the checkpoint's *.safetensors
// sizes, else model.safetensors.index.json's total_size, else the parameters config.json describes (a
// login node may hold only the config). Reads no weight.
struct TargetWeights {
  double file_bytes = 0;  // as stored (bf16 checkpoints: 2 bytes a parameter)
  double bytes = 0;       // on --backend: its parameters in the compute dtype (bf16 on CUDA, float32 on the CPU)
  std::string source;     // "0.6 MiB of safetensors", "config.json: 8.19 B parameters (no weights in DIR)"
};
// An FP8 target's weights (--target-precision fp8 or an FP8 checkpoint): on CUDA e4m3 codes + scales, plus,
// where the GPU kind (--gpu, else this node's GPU 0 known by its memory) has no block-scaled FP8 GEMM, one
// compute-dtype scratch of the largest linear (dequantized per GEMM); on the CPU dequantized; `source` says
// which.
TargetWeights target_weights(const Options& o, const TargetConfig& t);
double target_param_count(const TargetConfig& t);  // what config.json describes (embeddings and lm_head included)
struct TargetParams {
  double total = 0;       // target_param_count
  double fp8_linear = 0;  // the decoder layers' linears an FP8 target runs in FP8 (not lm_head, in_proj_a/b)
  double fp8_largest_linear = 0;  // the most weights of one such linear as the forward runs it (gate|up fused)
};
TargetParams target_params(const TargetConfig& t);
// Whether the GPU this job plans for (--gpu, else this node's GPU 0) runs FP8 linears as FP8 GEMMs.
bool fp8_gemm_gpu(const Options& o);

// The fixed memory of each role (allocated once at startup; activations come on top), and its line.
struct RoleMemory {
  double target = 0, drafter = 0;
  // A colocated rank holds both roles' fixed parts (and both roles' activations come on top).
  double colocated() const { return target + drafter; }
  double drafter_bf16_saving = 0;  // what --optimizer-state bf16 would take off the drafter (0: already bf16)
  std::string line;  // "[dflash] memory per rank, fixed part (...): target ...; drafter ..."
};
RoleMemory plan_role_memory(const Options& o, const ModelPlan& plan);

// Records and tokens of a token dataset from the shapes of /offsets and /tokens (no data read); {-1, -1} when
// the file does not have them (the job itself reports what is wrong with it).
std::pair<int64_t, int64_t> dataset_shape(const std::string& path);

// Each role's fixed memory against the GPU's: which ranks do not fit. The ranks of each role (empty under
// --topology auto: then a role is checked without them); layout Colocated: every rank holds both (its ranks
// are target_ranks, checked against RoleMemory::colocated()).
struct MemoryVerdict {
  bool fits = true;
  std::string line;       // "[dflash] memory check against --gpu h200 (...): ...", or why nothing was checked
  std::string what, hint;  // when !fits: the fatal error's message and HINT
};
MemoryVerdict check_memory(const Options& o, const PlannedGpu& gpu, const RoleMemory& memory,
                           const std::vector<int>& target_ranks, const std::vector<int>& drafter_ranks,
                           Layout layout = Layout::Split);

std::string gib_text(double bytes);                 // "16.7 GiB", or MiB below one GiB
std::string rank_ranges(const std::vector<int>& ranks);  // {0,1,2,5} -> "0-2,5"

// The GPU the memory is checked against: --gpu, else this node's GPU 0 through NVML (CUDA backend), else
// none (bytes 0). Never opens a CUDA context.
PlannedGpu gpu_to_check(const Options& o);

// Whether a colocated rank's fixed memory (RoleMemory::colocated()) fits this job's GPU (gpu_to_check), as
// the dry run checks it: what --topology auto, --rebalance auto and dflash-report (metrics.h5 attribute
// colocated_fit) go by before they choose the colocated layout. Unknown on the CPU backend (host memory) and
// where no GPU size is known; `why` says which, or the two sizes.
struct ColocatedFitCheck {
  ColocatedFit fit = ColocatedFit::Unknown;
  std::string why;
};
ColocatedFitCheck check_colocated_fit(const Options& o, const ModelPlan& plan);

}  // namespace dflash
