// The plan of a job's layouts (issue 44, item 2): for a node of G GPUs (and N such nodes) every split T-D the
// world allows (T + D <= G, the rest idle) and the colocated layout (every GPU runs both roles; not a layout
// the job runs yet), each with its predicted service rates, the pipeline's rate, which role binds, memory fit
// and power; the recommendation (fastest that fits, within a power budget) and how far a chosen layout is from
// it. Pure: the role times come from src/plan/cost_model.h, the memory from the caller (the dry run's
// src/runtime/dry_run_plan.cpp computes each role's fixed memory).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "plan/cost_model.h"

namespace dflash::plan {

// Split: `targets` target ranks and `drafters` drafter ranks on each node, one GPU each. Colocated: every GPU
// runs a target and a drafter (a future layout; its prediction is here so the plan can show it once it exists).
enum class LayoutKind : uint8_t { Split, Colocated };

struct Layout {
  LayoutKind kind = LayoutKind::Split;
  int targets = 0, drafters = 0;  // per node; Colocated: both = the GPUs per node
  std::string name() const;       // "6-2", "colocated"
  bool operator==(const Layout& o) const { return kind == o.kind && targets == o.targets && drafters == o.drafters; }
};

enum class BindingRole : uint8_t { Target, Drafter, Transport, Both };
const char* binding_role_name(BindingRole r);
enum class MemoryFit : uint8_t { Fits, DoesNotFit, Unknown };
const char* memory_fit_name(MemoryFit f);

// Each role's fixed memory on its GPU (what the dry run prints); 0 = not known. The gradient accumulator is
// added to the drafter where its layout needs --grad-accum > 1.
struct RoleMemory {
  double target_bytes = 0, drafter_bytes = 0, accumulator_bytes = 0;
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
  bool include_colocated = true;
  double colocated_overlap = 0;        // 0..1: share of the shorter role hidden under the other on one GPU
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

struct Plan {
  std::vector<LayoutPrediction> layouts;  // splits by targets then drafters, then colocated
  int recommended = -1;                  // index into layouts; -1 when none fits the memory and the budget
  int chosen = -1;                       // the chosen layout's index; -1 when none was given or it is not listed
  double chosen_shortfall_pct = 0;       // 100 x (1 - chosen / recommended batches/s)
  double target_forward_s = 0, drafter_step_s = 0, transport_s = 0, batch_bytes = 0;
  std::string gpu_name, gpu_source, link;
  int nodes = 1, gpus_per_node = 1;
  double colocated_overlap = 0;
};

// Every layout and the recommendation. Fatal BadOptions on a node of no GPU or an overlap outside [0, 1].
Plan plan_layouts(const PlanRequest& r);

// The fixed-width table the dry run prints, one line per layout ("*" the recommended, ">" the chosen), with a
// header and a closing line naming the recommendation, the chosen layout's distance from it, and the GPU's
// calibration source.
std::string render_plan_table(const Plan& p);
// The same as JSON (for metrics.h5 and calibration files).
nlohmann::json plan_to_json(const Plan& p);

}  // namespace dflash::plan
