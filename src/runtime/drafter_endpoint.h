// The drafter's protocol endpoint (docs/pipeline.md "Protocol"): its receive slots and the credits that
// grant them, the progress pump (arrivals, end-of-data, liveness of the targets), the order in which
// batches become ready, and the drain at the end. It knows nothing of training: the drafter loop
// (role_drafter.cpp) asks it for the next ready batch and hands the slot back when done.
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dflash/data_plane.h"
#include "dflash/flow_control.h"
#include "job.h"

namespace dflash {

class DrafterEndpoint {
 public:
  // Owns `plane` (its slots are this drafter's receive slots). Starts nothing until start().
  DrafterEndpoint(JobContext& job, std::unique_ptr<DataPlane> plane);
  ~DrafterEndpoint();

  // --eval-data, before start(): receives this drafter's share of the eval set. senders[n] = node target
  // index of the one that forwards the share's n-th batch (in eval batch order, the order every target
  // sends its own in). Credits are granted in that order, one per batch, so none is left over when it
  // returns, and the batch with the smallest index not yet sent always gets one (no target waits on a
  // drafter whose slots wait on it). Each batch is handed to `keep` (which copies what it needs) and its
  // slot is free again. The eval batches lead each target's sequence (BatchHeader::seq).
  void receive_eval(const std::vector<int>& senders, const std::function<void(const HsBatch&)>& keep);
  // Grants every slot (training begins).
  void start();
  // Drives every transfer and control message; checks the targets' liveness. A target that owes this
  // drafter something (a credit to use, batches it announced) and stays silent past --peer-timeout is
  // lost: fatal LostPeer before start() (nothing is trained yet), afterwards recorded (target_lost()), so
  // the drafter loop can checkpoint the last applied step before it ends the job (fail_lost_target()).
  void pump();
  // Waits (pumping) until a batch is ready (Batch), no batch will come (Ended), or a target was lost
  // (TargetLost: first, even when a batch is ready). Bounded by the targets' liveness (--peer-timeout).
  enum class Arrival { Batch, Ended, TargetLost };
  Arrival wait_for_batch();
  // The oldest ready batch; the slot stays this caller's until release().
  int take_ready();
  const HsBatch& batch(int slot) { return plane_->slot(slot); }
  // The slot was trained on: its credit goes back to a target at once.
  void release(int slot);
  // After the last step: stop the targets, take in (and drop) what they still send, acknowledge. A target
  // lost meanwhile ends the drain early (target_lost(); nothing more is asked of the targets).
  void drain();
  // A target was lost during training (pump()); fail_lost_target() ends the job naming it (fatal LostPeer).
  bool target_lost() const { return lost_.has_value(); }
  [[noreturn]] void fail_lost_target() const;

  int queue_depth() const { return static_cast<int>(ready_.size() + arrived_.size()); }
  // The newest report of every target (world target index), learnt from the batch headers.
  const std::vector<TargetReport>& known_targets() const { return known_targets_; }

 private:
  struct TargetState {
    int64_t received = 0;
    int64_t announced = -1;  // batches it says it sent (end-of-data), -1 before
    int64_t next_seq = 0;    // its next batch to make ready
    bool done = false;
    mpi::Clock::time_point last_heard;
  };
  struct Outgoing {
    ControlMsg msg;
    MPI_Request req;
  };

  void init_fixed_order();
  void promote_expected();
  void grant(int slot);
  int credits_held_by(int rank) const;
  void send_control(int to, const ControlMsg& m);
  void check_liveness();
  bool all_targets_done() const;
  void release_drained(int slot);

  JobContext& job_;
  const Options& o_;
  const Topology& topo_;
  std::unique_ptr<DataPlane> plane_;
  CreditLedger ledger_;
  std::vector<TargetState> targets_;  // by node target index
  std::vector<int> slot_owner_;       // target holding the slot's credit, -1 = none
  std::vector<bool> slot_full_;       // the slot holds a batch not yet trained on
  std::deque<int> ready_;             // slots holding a batch, in training order
  std::vector<int> arrived_;          // full slots waiting for an earlier batch of the same target
  std::deque<Outgoing> out_;          // deque: messages stay put while MPI sends them
  ControlMsg control_in_;
  MPI_Request control_req_ = MPI_REQUEST_NULL;
  std::vector<TargetReport> known_targets_;
  bool draining_ = false;
  // receive_eval: the senders of the share's batches in order, how many got a credit, slots holding one.
  bool eval_phase_ = false;
  std::vector<int> eval_senders_;
  size_t eval_granted_ = 0;
  std::deque<int> eval_ready_;
  std::optional<FixedBatchOrder> fixed_;  // --batch-order fixed
  struct LostTarget {
    std::string what, hint;
  };
  bool training_ = false;             // start() ran: a lost target is recorded, not fatal at once
  std::optional<LostTarget> lost_;    // the first target found lost
};

}  // namespace dflash
