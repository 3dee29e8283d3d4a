// The job's topology (include/dflash/topology.h): roles from the node layout, and every rank's place.
#include "dflash/topology.h"

#include "dflash/backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/cuda_entry.h"
#include "dflash/error.h"
#include "dflash/mpi_typed.h"

namespace dflash {

std::string TopologySpec::to_string() const {
  if (colocated()) return "colocated";
  return std::to_string(targets_per_node) + "-" + std::to_string(drafters_per_node);
}

TopologySpec colocated_spec() {
  TopologySpec spec;
  spec.layout = Layout::Colocated;
  return spec;
}

TopologySpec parse_topology_spec(const std::string& text) {
  const char* hint = "--topology T-D: T target ranks and D drafter ranks per node, both >= 1, e.g. 7-1 or 6-2; or "
                     "colocated: every rank holds both";
  DF_CHECK_HINT(text != "auto", BadOptions, "--topology auto is resolved at startup, not parsed as T-D", hint);
  if (text == "colocated") return colocated_spec();
  size_t dash = text.find('-');
  auto is_count = [](const std::string& s) {
    return !s.empty() && s.size() <= 4 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  DF_CHECK_HINT(dash != std::string::npos && is_count(text.substr(0, dash)) && is_count(text.substr(dash + 1)),
                BadOptions, "bad --topology '" << text << "'", hint);
  TopologySpec spec;
  spec.targets_per_node = std::stoi(text.substr(0, dash));
  spec.drafters_per_node = std::stoi(text.substr(dash + 1));
  DF_CHECK_HINT(spec.targets_per_node >= 1 && spec.drafters_per_node >= 1, BadOptions,
                "bad --topology '" << text << "': a job needs at least one target and one drafter per node", hint);
  return spec;
}

const char* role_name(Role r) {
  switch (r) {
    case Role::Target: return "target";
    case Role::Drafter: return "drafter";
    case Role::Idle: return "idle";
    case Role::Colocated: return "colocated";
  }
  return "?";
}

int Topology::target_index_of(int r) const {
  auto it = std::find(targets.begin(), targets.end(), r);
  return it == targets.end() ? -1 : static_cast<int>(it - targets.begin());
}
int Topology::drafter_index_of(int r) const {
  auto it = std::find(drafters.begin(), drafters.end(), r);
  return it == drafters.end() ? -1 : static_cast<int>(it - drafters.begin());
}

int Topology::node_target_index_of(int r) const {
  auto it = std::find(node_targets.begin(), node_targets.end(), r);
  DF_CHECK(it != node_targets.end(), Internal, "rank " << r << " is not a target of this node");
  return static_cast<int>(it - node_targets.begin());
}
int Topology::node_drafter_index_of(int r) const {
  auto it = std::find(node_drafters.begin(), node_drafters.end(), r);
  DF_CHECK(it != node_drafters.end(), Internal, "rank " << r << " is not a drafter of this node");
  return static_cast<int>(it - node_drafters.begin());
}

bool Topology::same_gpu(int a, int b) const {
  const RankPlace& p = places.at(static_cast<size_t>(a));
  const RankPlace& q = places.at(static_cast<size_t>(b));
  return p.gpu_bus[0] && q.gpu_bus[0] && std::strcmp(p.host, q.host) == 0 && std::strcmp(p.gpu_bus, q.gpu_bus) == 0;
}

std::vector<EvalRoute> Topology::eval_routes(int64_t num_batches) const {
  std::vector<EvalRoute> routes;
  const int64_t D = static_cast<int64_t>(drafters.size());
  const int64_t Dn = static_cast<int64_t>(node_drafters.size()), Tn = static_cast<int64_t>(node_targets.size());
  if (D == 0 || Dn == 0 || Tn == 0) return routes;
  for (int64_t i = 0; i < num_batches; ++i) {
    const int d = drafters[static_cast<size_t>(i % D)];
    const auto it = std::find(node_drafters.begin(), node_drafters.end(), d);
    if (it == node_drafters.end()) continue;
    const int64_t dn = it - node_drafters.begin(), j = i / D;
    routes.push_back(EvalRoute{i, d, node_targets[static_cast<size_t>((j * Dn + dn) % Tn)]});
  }
  return routes;
}

std::string Topology::to_string() const {
  std::string s = std::string(role_name(role)) + "[" + std::to_string(role_index) + "/" + std::to_string(role_count) +
                  "] world " + std::to_string(world_rank) + "/" + std::to_string(world_size) + " " + host;
  s += gpu >= 0 ? " gpu" + std::to_string(gpu) : " cpu";
  return s;
}

namespace {

// Role index and count of this rank's role (world order).
void count_role(Topology& t) {
  int index = 0, count = 0;
  for (int r = 0; r < t.world_size; ++r) {
    if (t.roles[r] != t.role) continue;
    if (r < t.world_rank) ++index;
    ++count;
  }
  t.role_index = index;
  t.role_count = count;
}

// --topology colocated: every rank is a target and a drafter; its target feeds its own drafter only (with
// --batch-order fixed this is the N-N split's target i -> drafter i, so both train the same batches).
Topology assign_colocated(int world_rank, const std::vector<RankSlot>& slots, int per, int num_nodes, Topology t) {
  t.num_nodes = num_nodes;
  t.ranks_per_node = per;
  t.spec.targets_per_node = t.spec.drafters_per_node = per;
  t.node = slots[world_rank].node;
  t.local_rank = slots[world_rank].local_rank;
  t.roles.assign(t.world_size, Role::Colocated);
  for (int r = 0; r < t.world_size; ++r) {
    t.targets.push_back(r);
    t.drafters.push_back(r);
  }
  t.node_targets = {world_rank};
  t.node_drafters = {world_rank};
  t.role = Role::Colocated;
  count_role(t);
  return t;
}

}  // namespace

Topology assign_roles(int world_rank, const std::vector<RankSlot>& slots, const TopologySpec& spec) {
  Topology t;
  t.world_size = static_cast<int>(slots.size());
  t.world_rank = world_rank;
  t.spec = spec;
  DF_ASSERT(world_rank >= 0 && world_rank < t.world_size);
  // Node sizes: every node must hold the same number of ranks (the spec applies per node).
  int num_nodes = 0;
  for (const RankSlot& s : slots) num_nodes = std::max(num_nodes, s.node + 1);
  std::vector<int> per_node(num_nodes, 0);
  for (const RankSlot& s : slots) per_node[s.node]++;
  const int per = per_node[0];
  for (int n = 0; n < num_nodes; ++n)
    DF_CHECK_HINT(per_node[n] == per, TopologyMismatch,
                  "nodes hold different numbers of ranks (node 0: " << per << ", node " << n << ": " << per_node[n] << ")",
                  "start the same number of ranks on every node (mpirun --map-by ppr:N:node)");
  if (spec.colocated()) return assign_colocated(world_rank, slots, per, num_nodes, std::move(t));
  const int T = spec.targets_per_node, D = spec.drafters_per_node;
  DF_CHECK_HINT(T + D <= per, TopologyMismatch,
                "--topology " << spec.to_string() << " needs " << T + D << " ranks per node but " << per
                              << " run per node (world size " << t.world_size << ", " << num_nodes << " node(s))",
                "start nodes x (T + D + idle) ranks: e.g. mpirun -np " + std::to_string(num_nodes * (T + D)) +
                    " for " + spec.to_string());
  t.num_nodes = num_nodes;
  t.ranks_per_node = per;
  t.node = slots[world_rank].node;
  t.local_rank = slots[world_rank].local_rank;
  t.roles.resize(t.world_size);
  for (int r = 0; r < t.world_size; ++r) {
    const int lr = slots[r].local_rank;
    DF_ASSERT(lr >= 0 && lr < per);
    Role role = lr < T ? Role::Target : lr < T + D ? Role::Drafter : Role::Idle;
    t.roles[r] = role;
    if (role == Role::Target) t.targets.push_back(r);
    if (role == Role::Drafter) t.drafters.push_back(r);
    if (slots[r].node == t.node && role == Role::Target) t.node_targets.push_back(r);
    if (slots[r].node == t.node && role == Role::Drafter) t.node_drafters.push_back(r);
  }
  t.role = t.roles[world_rank];
  count_role(t);
  return t;
}

void check_launcher_world_size(int world_size, const std::function<const char*(const char*)>& getenv_fn) {
  // Most specific first: mpirun's own count, then the Slurm step's, then the allocation's.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}) {
    const char* v = getenv_fn(var);
    if (!v || !*v) continue;
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0') continue;
    DF_CHECK_HINT(n == world_size, TopologyMismatch,
                  var << "=" << n << " but the MPI world has " << world_size << " rank(s)",
                  world_size == 1 ? "the launcher started unconnected singletons: use mpirun, or srun --mpi=pmix "
                                    "with an MPI built for it"
                                  : "start the job with one launcher and the same task count");
    return;
  }
}

namespace {

// The node's communicator (ranks sharing memory), ordered by world rank: the one node-local split.
MPI_Comm split_node(MPI_Comm world) {
  int rank = 0;
  DF_MPI(MPI_Comm_rank(world, &rank));
  MPI_Comm node_comm;
  DF_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm));
  return node_comm;
}

}  // namespace

NodeSeat node_seat(MPI_Comm world) {
  MPI_Comm node_comm = split_node(world);
  NodeSeat seat;
  DF_MPI(MPI_Comm_rank(node_comm, &seat.local_rank));
  DF_MPI(MPI_Comm_size(node_comm, &seat.ranks_on_node));
  DF_MPI(MPI_Comm_free(&node_comm));
  return seat;
}

int bind_gpu(int local_rank) {
  const int visible = cuda::in_build() ? cuda_device_count() : 0;
  return visible > 0 ? local_rank % visible : local_rank;
}

std::vector<RankSlot> gather_rank_slots(MPI_Comm world) {
  int rank = 0, size = 1;
  DF_MPI(MPI_Comm_rank(world, &rank));
  DF_MPI(MPI_Comm_size(world, &size));
  check_launcher_world_size(size, [](const char* n) { return std::getenv(n); });

  // Node = ranks sharing memory; node index = rank of the node's first rank among node leaders.
  MPI_Comm node_comm = split_node(world);
  int local_rank = 0;
  DF_MPI(MPI_Comm_rank(node_comm, &local_rank));
  MPI_Comm leaders;
  DF_MPI(MPI_Comm_split(world, local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders));
  int node = 0;
  if (leaders != MPI_COMM_NULL) {
    DF_MPI(MPI_Comm_rank(leaders, &node));
    DF_MPI(MPI_Comm_free(&leaders));
  }
  mpi::bcast(&node, 1, 0, node_comm);
  DF_MPI(MPI_Comm_free(&node_comm));

  RankSlot mine{node, local_rank};
  std::vector<RankSlot> slots(size);
  mpi::allgather(&mine, 1, slots.data(), world);
  return slots;
}

Topology create_topology(MPI_Comm world, const TopologySpec& spec, Device backend) {
  int rank = 0, size = 1;
  DF_MPI(MPI_Comm_rank(world, &rank));
  DF_MPI(MPI_Comm_size(world, &size));
  ProcessIdentity& id = process_identity();
  id.world_rank = rank;
  id.world_size = size;
  Topology t = assign_roles(rank, gather_rank_slots(world), spec);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  t.host = host;
  if (backend == Device::CUDA) {
    if (!cuda::in_build())
      DF_FAIL(BadOptions, "--backend cuda, but this build has no CUDA backend",
              "rebuild with a CUDA toolkit (DFLASH_CUDA=ON, see README), or use --backend cpu");
    DF_CHECK_HINT(cuda_device_count() > 0, DeviceFailure, "--backend cuda, but this rank sees no CUDA device",
                  "check CUDA_VISIBLE_DEVICES / the scheduler's GPU binding (--gpus-per-task), or use --backend cpu");
    t.gpu = bind_gpu(t.local_rank);
  } else {
    t.gpu = -1;
  }

  RankPlace here;
  std::strncpy(here.host, t.host.c_str(), sizeof(here.host) - 1);
  here.gpu = t.gpu;
  if (t.role != Role::Idle && t.gpu >= 0) {
    // The bus id answers "same GPU?" (same_gpu): without it two ranks on one GPU would be told apart.
    const std::string bus = cuda::library_for("the GPU's PCI bus id").pci_bus_id(t.gpu);
    DF_CHECK(!bus.empty(), DeviceFailure, "cudaDeviceGetPCIBusId failed for CUDA device " << t.gpu);
    std::strncpy(here.gpu_bus, bus.c_str(), sizeof(here.gpu_bus) - 1);
  }
  t.places.resize(static_cast<size_t>(size));
  mpi::allgather(&here, 1, t.places.data(), world);

  DF_MPI(MPI_Comm_split(world, t.runs_drafter() ? 0 : MPI_UNDEFINED, rank, &t.drafter_comm));
  id.role = role_name(t.role);
  id.host = t.host;
  id.gpu = t.gpu;
  return t;
}

void free_topology(Topology& t) {
  if (t.drafter_comm != MPI_COMM_NULL) DF_MPI(MPI_Comm_free(&t.drafter_comm));
}

}  // namespace dflash
