// Roles from node layouts (the pure part of the topology) and the launcher/world-size check.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "dflash/topology.h"

using namespace dflash;

namespace {

// n nodes of per ranks each, world ranks filled node by node (mpirun's default --map-by slot).
std::vector<RankSlot> blocked(int nodes, int per) {
  std::vector<RankSlot> s;
  for (int n = 0; n < nodes; ++n)
    for (int l = 0; l < per; ++l) s.push_back({n, l});
  return s;
}

TopologySpec spec(int t, int d) { return TopologySpec{t, d}; }

}  // namespace

TEST(Topology, OneNodeTwoTargetsOneDrafterOneIdle) {
  auto slots = blocked(1, 4);
  Topology t0 = assign_roles(0, slots, spec(2, 1));
  EXPECT_EQ(t0.role, Role::Target);
  EXPECT_EQ(t0.role_index, 0);
  EXPECT_EQ(t0.role_count, 2);
  EXPECT_EQ(t0.node_drafters, std::vector<int>({2}));
  Topology t2 = assign_roles(2, slots, spec(2, 1));
  EXPECT_EQ(t2.role, Role::Drafter);
  EXPECT_EQ(t2.node_targets, std::vector<int>({0, 1}));
  EXPECT_TRUE(t2.is_metrics_writer());
  Topology t3 = assign_roles(3, slots, spec(2, 1));
  EXPECT_EQ(t3.role, Role::Idle);
  EXPECT_EQ(t3.role_count, 1);
  EXPECT_EQ(t3.metrics_rank(), 2);
}

TEST(Topology, TwoNodesTargetsFeedTheirOwnNode) {
  auto slots = blocked(2, 8);  // 6-2 per node
  Topology a = assign_roles(3, slots, spec(6, 2));
  EXPECT_EQ(a.role, Role::Target);
  EXPECT_EQ(a.node_drafters, std::vector<int>({6, 7}));
  Topology b = assign_roles(14, slots, spec(6, 2));
  EXPECT_EQ(b.role, Role::Drafter);
  EXPECT_EQ(b.node, 1);
  EXPECT_EQ(b.role_index, 2);  // drafters 6, 7, 14, 15
  EXPECT_EQ(b.role_count, 4);
  EXPECT_EQ(b.drafters, std::vector<int>({6, 7, 14, 15}));
  EXPECT_EQ(b.node_targets, std::vector<int>({8, 9, 10, 11, 12, 13}));
  EXPECT_EQ(b.targets.size(), 12u);
  EXPECT_EQ(b.metrics_rank(), 6);
  EXPECT_EQ(b.target_index_of(8), 6);
  EXPECT_EQ(b.drafter_index_of(15), 3);
  EXPECT_EQ(b.target_index_of(7), -1);
  // Node-local indices (what the credits and --batch-order fixed count in), never rank arithmetic.
  EXPECT_EQ(b.node_target_index_of(8), 0);
  EXPECT_EQ(b.node_target_index_of(13), 5);
  EXPECT_EQ(b.node_drafter_index_of(15), 1);
  EXPECT_EQ(a.node_target_index_of(3), 3);
  EXPECT_EXIT(b.node_target_index_of(3), testing::ExitedWithCode(9), "not a target of this node");
}

// --topology colocated: every rank both roles; its data-plane peers are itself alone (its target feeds its own
// drafter), so --batch-order fixed and the eval routes make rank i what target i and drafter i of the N-N split are.
TEST(Topology, ColocatedEveryRankBothRoles) {
  auto slots = blocked(2, 2);
  Topology t = assign_roles(3, slots, colocated_spec());
  EXPECT_EQ(t.role, Role::Colocated);
  EXPECT_TRUE(t.runs_target() && t.runs_drafter());
  EXPECT_EQ(t.targets, std::vector<int>({0, 1, 2, 3}));
  EXPECT_EQ(t.drafters, std::vector<int>({0, 1, 2, 3}));
  EXPECT_EQ(t.node_targets, std::vector<int>({3}));
  EXPECT_EQ(t.node_drafters, std::vector<int>({3}));
  EXPECT_EQ(t.target_index_of(3), 3);
  EXPECT_EQ(t.drafter_index_of(3), 3);
  EXPECT_EQ(t.spec.targets_per_node, 2);
  EXPECT_EQ(t.spec.to_string(), "colocated");
  EXPECT_EQ(t.metrics_rank(), 0);
  EXPECT_STREQ(role_name(t.role), "colocated");
  // Eval batch i belongs to drafter i % 4 and is forwarded by that same rank, as target i of 4-4 would.
  for (const EvalRoute& r : t.eval_routes(10)) {
    EXPECT_EQ(r.drafter, 3);
    EXPECT_EQ(r.target, 3);
    EXPECT_EQ(r.batch % 4, 3);
  }
  // One process, no mpirun: a world of one.
  Topology one = assign_roles(0, blocked(1, 1), colocated_spec());
  EXPECT_EQ(one.role, Role::Colocated);
  EXPECT_EQ(one.node_targets, std::vector<int>({0}));
}

TEST(Topology, InterleavedPlacementUsesNodeLocalRanks) {
  // --map-by node: world ranks alternate between two nodes.
  std::vector<RankSlot> slots;
  for (int r = 0; r < 6; ++r) slots.push_back({r % 2, r / 2});
  Topology t = assign_roles(5, slots, spec(1, 1));  // node 1, local 2 -> idle
  EXPECT_EQ(t.role, Role::Idle);
  Topology d = assign_roles(3, slots, spec(1, 1));  // node 1, local 1 -> drafter
  EXPECT_EQ(d.role, Role::Drafter);
  EXPECT_EQ(d.node_targets, std::vector<int>({1}));
  EXPECT_EQ(d.drafters, std::vector<int>({2, 3}));
}

TEST(Topology, ToStringNamesRoleWorldAndHost) {
  Topology t = assign_roles(3, blocked(1, 4), spec(2, 2));
  t.host = "gpu1";
  t.gpu = 3;
  EXPECT_EQ(t.to_string(), "drafter[1/2] world 3/4 gpu1 gpu3");
}

TEST(TopologyDeath, TooFewRanksPerNode) {
  EXPECT_EXIT(assign_roles(0, blocked(1, 4), spec(3, 2)), testing::ExitedWithCode(4), "needs 5 ranks per node");
}

TEST(TopologyDeath, UnevenNodes) {
  std::vector<RankSlot> slots = blocked(1, 4);
  slots.push_back({1, 0});
  EXPECT_EXIT(assign_roles(0, slots, spec(1, 1)), testing::ExitedWithCode(4), "different numbers of ranks");
}

TEST(TopologySpecParse, Valid) {
  TopologySpec s = parse_topology_spec("7-1");
  EXPECT_EQ(s.targets_per_node, 7);
  EXPECT_EQ(s.drafters_per_node, 1);
  EXPECT_EQ(parse_topology_spec("6-2").to_string(), "6-2");
  EXPECT_TRUE(parse_topology_spec("colocated").colocated());
  EXPECT_EQ(parse_topology_spec("colocated").to_string(), "colocated");
}

TEST(TopologySpecParseDeath, Invalid) {
  for (const char* bad : {"7", "7-", "-1", "a-b", "7-1-1", "7x1", "0-1", "1-0", " 1-1", "auto"})
    EXPECT_EXIT(parse_topology_spec(bad), testing::ExitedWithCode(2), "topology") << bad;
}

// Returning normally is the assertion: each check runs in a child that exits 0 only if the call came
// back (a mismatch ends it through the fatal path with exit 4 instead).
TEST(LauncherWorldSizeDeath, AgreesOrAbsent) {
  std::map<std::string, std::string> env{{"OMPI_COMM_WORLD_SIZE", "4"}, {"SLURM_NTASKS", "8"}};
  auto get = [&](const char* n) -> const char* { auto it = env.find(n); return it == env.end() ? nullptr : it->second.c_str(); };
  // mpirun's own count wins over the allocation's: 4 agrees, 8 (the allocation's) does not
  EXPECT_EXIT({ check_launcher_world_size(4, get); std::exit(0); }, testing::ExitedWithCode(0), "");
  EXPECT_EXIT(check_launcher_world_size(8, get), testing::ExitedWithCode(4), "OMPI_COMM_WORLD_SIZE=4");
  env.clear();
  EXPECT_EXIT({ check_launcher_world_size(3, get); std::exit(0); }, testing::ExitedWithCode(0), "");  // nothing to compare
}

TEST(LauncherWorldSizeDeath, SlurmSingletonsTrap) {
  std::map<std::string, std::string> env{{"SLURM_NTASKS", "8"}};
  auto get = [&](const char* n) -> const char* { auto it = env.find(n); return it == env.end() ? nullptr : it->second.c_str(); };
  EXPECT_EXIT(check_launcher_world_size(1, get), testing::ExitedWithCode(4), "SLURM_NTASKS=8 but the MPI world has 1");
}

TEST(LauncherWorldSizeDeath, MpirunDisagrees) {
  std::map<std::string, std::string> env{{"OMPI_COMM_WORLD_SIZE", "4"}};
  auto get = [&](const char* n) -> const char* { auto it = env.find(n); return it == env.end() ? nullptr : it->second.c_str(); };
  EXPECT_EXIT(check_launcher_world_size(2, get), testing::ExitedWithCode(4), "OMPI_COMM_WORLD_SIZE=4");
}

// Two ranks share a GPU when host and PCI bus id agree (the ordinal alone may differ under different
// CUDA_VISIBLE_DEVICES); a rank without a GPU shares none.
TEST(Topology, SameGpuByHostAndBusId) {
  Topology t = assign_roles(0, blocked(2, 2), spec(1, 1));
  auto place = [](const char* host, int gpu, const char* bus) {
    RankPlace p;
    std::snprintf(p.host, sizeof(p.host), "%s", host);
    p.gpu = gpu;
    std::snprintf(p.gpu_bus, sizeof(p.gpu_bus), "%s", bus);
    return p;
  };
  t.places = {place("a", 0, "0000:1B:00.0"), place("a", 1, "0000:1B:00.0"), place("b", 0, "0000:1B:00.0"),
              place("b", -1, "")};
  EXPECT_TRUE(t.same_gpu(0, 1));   // ordinals differ, the bus id is one
  EXPECT_FALSE(t.same_gpu(0, 2));  // another host
  EXPECT_FALSE(t.same_gpu(3, 3));  // no GPU
}
