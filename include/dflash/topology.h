// Who does what: computed once at startup from --topology and the node layout (picotron style). Every
// other piece of the runtime asks the Topology; no rank arithmetic anywhere else.
//
// Per node (ranks sharing memory, MPI_COMM_TYPE_SHARED): the first T node-local ranks are targets, the
// next D drafters, the rest idle. Targets feed the drafters of their own node; drafters allreduce their
// gradients over all nodes (drafter_comm). --topology colocated: every rank holds both roles in one process
// (Role::Colocated): it is in both `targets` and `drafters`, its target feeds only its own drafter.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dflash/tensor.h"  // Device

namespace dflash {

// How a node's ranks share the two roles: a split (T target ranks, D drafter ranks, the rest idle), or
// colocated (every rank runs a target and a drafter in one process; docs/pipeline.md "The colocated layout").
enum class Layout : uint8_t { Split, Colocated };

// --topology T-D: T target and D drafter ranks per node; the node's other ranks idle. --topology colocated:
// every rank of the node is both (the counts are 0 until assign_roles knows the node's size).
struct TopologySpec {
  int targets_per_node = 0;
  int drafters_per_node = 0;
  Layout layout = Layout::Split;
  bool colocated() const { return layout == Layout::Colocated; }
  std::string to_string() const;  // "2-1", or "colocated"
};
// Parses "T-D" (both >= 1) or "colocated". Fatal BadOptions on anything else ("auto" is handled by parse_options).
TopologySpec parse_topology_spec(const std::string& text);
TopologySpec colocated_spec();  // --topology colocated

// Colocated: one process holds a target and a drafter (a thread each; role_colocated.cpp).
enum class Role : uint8_t { Target, Drafter, Idle, Colocated };

// --eval-data: one eval batch's way from the target that forwards it to the drafter that keeps it.
struct EvalRoute {
  int64_t batch = 0;  // index in the packed eval set
  int drafter = -1;   // world rank
  int target = -1;    // world rank, a target of the drafter's node
};
const char* role_name(Role r);

// Where one world rank sits: its node and node-local rank (gathered from every rank).
struct RankSlot {
  int node = 0;
  int local_rank = 0;
};

// The machine one world rank runs on: its host, and its GPU (ordinal and PCI bus id; none on the CPU
// backend and on idle ranks, which touch no device). Gathered from every rank by create_topology.
struct RankPlace {
  char host[64] = {0};
  int32_t gpu = -1;
  char gpu_bus[32] = {0};
};

struct Topology {
  int world_rank = 0, world_size = 1;
  int num_nodes = 1, node = 0;
  int ranks_per_node = 1, local_rank = 0;
  TopologySpec spec;
  Role role = Role::Idle;
  int role_index = 0;  // index among all ranks of this role (world order)
  int role_count = 0;  // ranks of this role in the job
  std::vector<Role> roles;            // [world_size] every rank's role
  std::vector<int> targets;           // world ranks of all targets, by role index
  std::vector<int> drafters;          // world ranks of all drafters, by role index
  // The peers of this rank's data plane: the targets that feed its drafter and the drafters its target
  // feeds. In a split: this node's targets and drafters. Colocated: this rank alone (its target feeds its
  // own drafter), so the credit protocol, --batch-order fixed and the eval routes run per rank unchanged.
  std::vector<int> node_targets;      // world ranks of the targets feeding this rank's drafter
  std::vector<int> node_drafters;     // world ranks of the drafters this rank's target feeds
  std::string host;
  int gpu = -1;                       // device ordinal (node-local rank) on the CUDA backend, -1 on the CPU
  std::vector<RankPlace> places;      // [world_size] every rank's host and GPU (create_topology)
  MPI_Comm drafter_comm = MPI_COMM_NULL;  // drafters only: gradient allreduce, lockstep agreement

  bool runs_target() const { return role == Role::Target || role == Role::Colocated; }
  bool runs_drafter() const { return role == Role::Drafter || role == Role::Colocated; }
  int metrics_rank() const { return drafters.front(); }  // the first drafter writes metrics.h5
  bool is_metrics_writer() const { return world_rank == metrics_rank(); }
  int target_index_of(int world_rank) const;   // role index of a target rank (-1 if not a target)
  int drafter_index_of(int world_rank) const;  // role index of a drafter rank (-1 if not a drafter)
  int node_target_index_of(int world_rank) const;   // index in node_targets (fatal Internal if absent)
  int node_drafter_index_of(int world_rank) const;  // index in node_drafters (fatal Internal if absent)
  // Whether world ranks a and b run on one GPU: the same host and PCI bus id (so ranks shown different
  // CUDA_VISIBLE_DEVICES compare right). False when either has no GPU. The only place this is decided
  // (NCCL refuses two ranks of a communicator on one GPU; power is counted once per GPU).
  bool same_gpu(int a, int b) const;
  // --eval-data: the routes of this node's eval batches, in batch order. Batch i belongs to drafter
  // drafters[i % D]; that drafter's j-th batch comes from node target (j * Dn + dn) % Tn (dn: its index among
  // the node's Dn drafters, Tn node targets), so the node's targets share the forwards evenly (on one node:
  // batch i from target i % T). Batches of other nodes' drafters are left out (targets feed their own node).
  std::vector<EvalRoute> eval_routes(int64_t num_batches) const;
  // "drafter[1/2] world 7/8 host gpu1" (index within the role / count, world rank / size, host)
  std::string to_string() const;
};

// The pure part: roles and peer lists from every rank's slot. Fatal TopologyMismatch when nodes differ
// in size or T + D exceeds the ranks per node.
Topology assign_roles(int world_rank, const std::vector<RankSlot>& slots, const TopologySpec& spec);

// Checks the MPI world size against what the launcher meant to start (OMPI_COMM_WORLD_SIZE, or Slurm's
// SLURM_STEP_NUM_TASKS / SLURM_NTASKS): srun without a PMI the MPI speaks starts N singletons, each
// "rank 0 of 1". getenv_fn is getenv (injectable for tests). Fatal TopologyMismatch on disagreement.
void check_launcher_world_size(int world_size, const std::function<const char*(const char*)>& getenv_fn);

// This rank's place on its node: the one node-local split (ranks sharing memory, MPI_COMM_TYPE_SHARED),
// made here only; the job, --topology auto and the dry run ask it. Collective; touches no device.
struct NodeSeat {
  int local_rank = 0;     // this rank's index among its node's ranks (world order)
  int ranks_on_node = 1;  // its node's ranks
};
NodeSeat node_seat(MPI_Comm world);

// The CUDA device the rank of node-local rank local_rank binds: local_rank % the devices this process sees
// (one GPU per rank where the launcher shows a node's GPUs to every rank; device 0 where the scheduler shows
// each task its own GPU, or ranks share one, as in tests). Where it sees none (a login node, a build without
// CUDA) the local rank itself: what a dry run assumes. The only place this rule lives.
int bind_gpu(int local_rank);

// Every rank's node (ranks sharing memory, MPI_COMM_TYPE_SHARED; numbered in world order of their first
// rank) and node-local rank, after check_launcher_world_size. Collective; touches no device (--dry-run).
std::vector<RankSlot> gather_rank_slots(MPI_Comm world);

// The collective part (every rank of world calls it): gathers slots, assigns roles, splits the drafter
// communicator, gathers every rank's place (host, GPU, bus id), fills process_identity().
Topology create_topology(MPI_Comm world, const TopologySpec& spec, Device backend);
void free_topology(Topology& t);

}  // namespace dflash
