// Credit-based flow control between the targets and drafters of a node (docs/pipeline.md "Protocol").
//
// A drafter owns --hs-queue-depth receive slots. Each free slot is granted, as one credit, to one
// target of its node; a target sends a batch only into a slot it holds a credit for, so a send always
// meets a pre-posted receive and nothing queues unbounded. When the drafter consumes a slot it re-posts
// the receive and grants the credit again, unasked. The bookkeeping below is pure (no MPI) so it can be
// tested alone; the endpoints (src/runtime) move the messages and a DataPlane (data_plane.h) the tensors.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "dflash/hs_batch.h"  // the wire types the credits travel with

namespace dflash {

// --batch-order: how a drafter picks its next batch among the targets of its node (docs/pipeline.md
// "Order and determinism"). Arrival: whatever arrived first (the faster side takes more, best
// throughput). Fixed: a pure function of the topology (FixedBatchOrder below), so the same
// seed gives the same losses, and a resume the uninterrupted run's, with several targets per drafter.
enum class BatchOrder : uint8_t { Arrival, Fixed };
const char* batch_order_name(BatchOrder b);

// ---- drafter side: who gets the next credit ------------------------------------------------------
// Each freed slot goes to the active target holding the fewest outstanding credits from this drafter
// (granted and not yet consumed), ties broken round-robin. With depth >= targets each target keeps its
// share and runs at its own pace; with fewer slots than targets the credits rotate so none starves.
class CreditLedger {
 public:
  explicit CreditLedger(std::vector<int> targets);  // world ranks of the node's targets
  // The target the next credit should go to, or nullopt when every target has finished.
  std::optional<int> next_grantee() const;
  void granted(int target);
  void consumed(int target);   // a slot holding that target's batch was consumed (credit comes back)
  void finished(int target);   // end-of-data: no more credits for it
  bool active(int target) const;
  int outstanding(int target) const;
  int num_active() const;

 private:
  std::vector<int> targets_;
  std::vector<int> outstanding_;
  std::vector<bool> finished_;
  int last_grant_ = -1;  // index into targets_
  int index(int target) const;
};

// ---- --batch-order fixed: which drafter step trains which batch ----------------------------------
// Per node, with T targets and D drafters: global index g = n*T + i names batch n (the loader's batch
// index, LoadedBatch::index) of node target i. Target i sends its batch n to drafter (n*T + i) mod D;
// drafter d trains its batches in increasing g (with every target running: step s trains g = s*D + d).
// End of data: a target announces its end index E (it has no batch n >= E). A drafter's sequence ends at
// its first index g whose batch does not exist; the drafters stop together at that step (lockstep),
// dropping what the others still hold (at most the other targets' last few batches of the whole run).
// Resume: batches already trained on (the checkpoint's data points) are skipped the same way, so the
// sequence continues where the uninterrupted run's was. Pure bookkeeping, no MPI.
struct FixedBatchRef {
  int target = -1;    // node target index
  int64_t batch = 0;  // the target's loader batch index
  int64_t g = 0;      // global index n*T + i
};
class FixedBatchOrder {
 public:
  FixedBatchOrder(int num_targets, int num_drafters, int drafter_index);
  // Node drafter index that trains batch `batch` of node target `target`.
  static int drafter_of(int num_targets, int num_drafters, int target, int64_t batch);
  // Resume: the target's batches below `first` and those listed were trained on before.
  void trained_before(int target, int64_t first, const std::vector<int64_t>& later);
  // End of data: the target has no batch with index >= end_index.
  void target_ended(int target, int64_t end_index);
  // This drafter's first batch at or after global index g (nullopt: its sequence has ended).
  std::optional<FixedBatchRef> first_at_or_after(int64_t g) const;
  // The batch this drafter trains next; consumed() moves past it.
  std::optional<FixedBatchRef> expected();
  void consumed();
  // The batch the next credit is for (credits are granted in training order); granted() moves past it.
  std::optional<FixedBatchRef> next_to_grant();
  void granted();

 private:
  int T_, D_, d_;
  std::vector<int64_t> first_;              // per target: batches below were trained on before
  std::vector<std::set<int64_t>> later_;    // per target: later batches trained on before
  std::vector<int64_t> end_;                // per target: end index, -1 while running
  int64_t consume_g_, grant_g_;             // cursors (global indices of this drafter's residue)
};

// ---- target side: credits held, by drafter --------------------------------------------------------
// A target holding credits of several drafters sends to the one that granted the most (it has the most
// free slots: it is the faster consumer), so the faster drafter takes more batches. A credit held longer
// than max_age goes first: a drafter counts a credit left unused as silence of that target.
struct Credit {
  int drafter = -1;      // world rank
  int slot = -1;
  double granted_s = 0;  // when it arrived (the caller's clock, seconds)
};
class CreditWallet {
 public:
  void add(const Credit& c);
  bool empty() const { return total_ == 0; }
  int total() const { return total_; }
  int held_from(int drafter) const;
  // Takes the oldest credit if it is older than max_age_s (at now_s), else a credit of the drafter with
  // the most credits held (ties: lowest rank); oldest first within a drafter. Requires !empty().
  Credit take(double now_s = 0, double max_age_s = -1);
  // --batch-order fixed: the oldest credit of that drafter (granted in the order it wants the batches).
  // Requires held_from(drafter) > 0.
  Credit take_from(int drafter);

 private:
  std::map<int, std::deque<Credit>> slots_;  // drafter -> credits granted, oldest first
  int total_ = 0;
};

}  // namespace dflash
