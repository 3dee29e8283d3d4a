// The plan of a job's layouts (issue 44, item 2): for a node of G GPUs (and N such nodes) every split T-D the
// world allows (T + D <= G, the rest idle) and the colocated layout (every GPU runs both roles, issue 45), each
// with its predicted service rates, the pipeline's rate, which role binds, memory fit and power; the
// recommendation (fastest that fits, within a power budget; colocated included) and how far a chosen layout is
// from it. Pure: the role times come from src/plan/cost_model.h, the memory from the caller (the dry run's
// src/runtime/dry_run_plan.cpp computes each role's fixed memory).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "plan/cost_model.h"

namespace dflash::plan {

// Split: `targets` target ranks and `drafters` drafter ranks on each node, one GPU each. Colocated: every GPU
// runs a target and a drafter in one process (--topology colocated, docs/pipeline.md "The colocated layout").
enum class LayoutKind : uint8_t { Split, Colocated };

struct Layout {
  LayoutKind kind = LayoutKind::Split;
  int targets = 0, drafters = 0;  // per node; Colocated: both = the GPUs per node
  std::string name() const;       // "6-2", "colocated"
  int gpus() const;               // per node: T + D, or G colocated
  bool operator==(const Layout& o) const { return kind == o.kind && targets == o.targets && drafters == o.drafters; }
};

enum class BindingRole : uint8_t { Target, Drafter, Transport, Both };
const char* binding_role_name(BindingRole r);
enum class MemoryFit : uint8_t { Fits, DoesNotFit, Unknown };
const char* memory_fit_name(MemoryFit f);
// The one fit rule: `bytes` of fixed memory on a GPU of `gpu_bytes` (either 0: unknown). The job's own check of
// a colocated rank (check_colocated_fit, src/runtime/dry_run_plan.h) decides by it too.
MemoryFit memory_fit(double bytes, double gpu_bytes);

// Each role's fixed memory on its GPU (what the dry run prints); 0 = not known. The gradient accumulator is
// added to the drafter where its layout needs --grad-accum > 1. colocated_bytes: a colocated rank's, as the
// job counts it (src/runtime/dry_run_plan.h RoleMemory::colocated(): both roles' fixed parts).
struct RoleMemory {
  double target_bytes = 0, drafter_bytes = 0, accumulator_bytes = 0;
  double colocated_bytes = 0;
};

// The job, as the plan sees it.
struct JobCostInputs {
  TargetShape target;
  PackedBatchShape target_batch;       // one packed batch (--token-budget tokens)
  DrafterShape drafter;
  DrafterBatchShape drafter_batch;     // the same batch on the drafter side, with its anchors
  bool final_norm_sent = false;        // KL: the target also sends its final norm
  HsDType hs_dtype = HsDType::Backend; // --hs-dtype: the form the hidden states travel in
  int64_t global_batch_tokens = 0;     // > 0: --grad-accum K = ceil(global / (tokens x drafters)), as the job
  int grad_accum = 1;                  // used when global_batch_tokens is 0
};

struct ClusterInputs {
  GpuCalibration gpu;
  int nodes = 1, gpus_per_node = 8;
  TransportLink link = TransportLink::NvLink;
  double internode_gbps = 50;          // per GPU between nodes (400 Gb/s InfiniBand): the ring's bound there
};

struct PlanRequest {
  JobCostInputs job;
  ClusterInputs cluster;
  RoleMemory memory;
  double power_budget_w = 0;           // 0: none
  std::optional<Layout> chosen;        // --topology as given, to say how far it is from the recommendation
  bool include_colocated = true;       // its overlap: cluster.gpu.colocated_overlap
};

struct LayoutPrediction {
  Layout layout;
  int grad_accum = 1;
  double target_batches_per_s = 0;     // the target ranks' service rate (all nodes)
  double drafter_batches_per_s = 0;    // the drafter ranks' (allreduce included)
  double transport_batches_per_s = 0;  // what the links can carry
  double batches_per_s = 0;            // the pipeline's: the smallest of the three
  double tokens_per_s = 0, anchors_per_s = 0;
  double drafter_step_s = 0, allreduce_s = 0;  // per batch, on one drafter
  BindingRole binds = BindingRole::Target;
  MemoryFit fit = MemoryFit::Unknown;
  double largest_role_bytes = 0;       // the most a GPU of this layout holds (0 = unknown)
  double power_w = -1;                 // < 0: unknown (the GPU's TDP is not known)
  bool within_power_budget = true;
};

// How the colocated row is priced: the roles overlapping by the GPU kind's measured share, or, where both
// roles' fixed memory fills the GPU as far as the H100 run that measured less than back to back did, at that
// run's measured fraction of back to back (docs/cost_model.md "The colocated layout"). Two ranks sharing a GPU
// (shared_gpu_seconds_per_batch) fall in the same regime at the same fill: the same memory on one card.
enum class ColocatedRegime : uint8_t { Overlapped, MemoryFull };
// Where both roles fill the GPU (bench/results/h100-issue44-45-46-20261206b, one H100, 512 anchors per record,
// after the GEMM autotune fix): a colocated rank's fixed part was 67.5 GiB of the card's 79.6 (85 %, the dry run
// of that run's options) and it ran at 0.547 b/s against the back-to-back bound of the model's role times,
// 0.966 b/s: the two roles slowed each other beyond taking turns (0.372 of 0.595 before the fix). At 47.6 GiB
// (60 %, 512 anchors per batch) the same job overlapped (GpuCalibration::colocated_overlap). The regime starts
// between the two fills; the plan takes 80 % (a threshold set at the measured 85 % put that very run, its fill
// rounded just below, on the overlapped side) and prices a colocated rank that fits from there at the measured
// fraction of back to back.
constexpr double kColocatedMemoryFullFill = 0.80;
constexpr double kColocatedMemoryFullRate = 0.547 / 0.966;

// A colocated GPU's seconds per batch: the target's forward t, the drafter's step d, its share of the
// gradient allreduce a, the share `overlap` of the shorter of t and d hidden under the other (at most 1; below
// 0 where measured contention made them slower than back to back), never less than the slower role alone.
// --topology auto's what-if (src/runtime/auto_topology.cpp) prices its colocated row by it too.
double colocated_seconds_per_batch(double target_s, double drafter_s, double allreduce_s, double overlap);

struct Plan {
  std::vector<LayoutPrediction> layouts;  // splits by targets then drafters, then colocated
  int recommended = -1;                  // index into layouts; -1 when none fits the memory and the budget
  int chosen = -1;                       // the chosen layout's index; -1 when none was given or it is not listed
  double chosen_shortfall_pct = 0;       // 100 x (1 - chosen / recommended batches/s)
  double target_forward_s = 0, drafter_step_s = 0, transport_s = 0, batch_bytes = 0;
  std::string gpu_name, gpu_source, link;
  int nodes = 1, gpus_per_node = 1;
  double colocated_overlap = 0;          // the GPU kind's (cluster.gpu.colocated_overlap)
  ColocatedRegime colocated_regime = ColocatedRegime::Overlapped;
  double colocated_fill = 0;             // a colocated rank's fixed memory / the GPU's (0: unknown)
};

// Every layout and the recommendation. Fatal BadOptions on a node of no GPU or an overlap outside [0, 1].
Plan plan_layouts(const PlanRequest& r);

// A batch's seconds where a target rank and a drafter rank share each GPU (a one-GPU 1-1: two processes taking
// turns, the host-staged transfer hidden under them, bench/results/pipeline/h200-1gpu-8b-summary.txt measured
// 1.5 % above back to back): the forward and the step back to back, or, where both roles' fixed memory fills
// the GPU (Plan::colocated_regime, the same memory on one card), at the memory-full fraction of it. The 1-1 at
// 512 anchors per record on one H100 (bench/results/h100-issue44-20261207, 85 % of the card fixed) ran at
// 0.501 b/s where this gives 0.547 (+9 %) and back to back 0.966 (+93 %).
double shared_gpu_seconds_per_batch(const Plan& p);

// The fixed-width table the dry run prints, one line per layout ("*" the recommended, ">" the chosen), with a
// header and closing lines naming the recommendation, the chosen layout's distance from it, the GPU's
// calibration source and how the colocated row is priced.
std::string render_plan_table(const Plan& p);
// The same as JSON (for metrics.h5 and calibration files).
nlohmann::json plan_to_json(const Plan& p);

}  // namespace dflash::plan
