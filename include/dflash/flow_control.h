// Credit-based flow control between the targets and drafters of a node (docs/pipeline.md "Protocol").
//
// A drafter owns --hs-queue-depth receive slots. Each free slot is granted, as one credit, to one
// target of its node; a target sends a batch only into a slot it holds a credit for, so a send always
// meets a pre-posted receive and nothing queues unbounded. When the drafter consumes a slot it re-posts
// the receive and grants the credit again, unasked. The bookkeeping below is pure (no MPI) so it can be
// tested alone; the roles move the messages.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "dflash/data.h"  // DataPosition
#include "dflash/nvml.h"  // GpuReading
#include "dflash/tensor.h"

namespace dflash {

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

// ---- wire format ---------------------------------------------------------------------------------
// Small host messages (MPI, always): drafter -> target on kTagToTarget, target -> drafter on kTagToDrafter.
enum class ControlKind : int32_t {
  Credit = 1,     // drafter -> target: slot `slot` is yours to fill
  Stop = 2,       // drafter -> target: the run has its steps; send end-of-data now
  Fin = 3,        // drafter -> target: all your batches arrived; no more messages from me
  EndOfData = 4,  // target -> drafter: `value` = batches I sent you in total
};
struct ControlMsg {
  ControlKind kind = ControlKind::Credit;
  int32_t slot = -1;
  int64_t value = 0;
  int64_t end_index = -1;  // EndOfData: the target's loader batch index after its last batch (--batch-order fixed)
};
constexpr int kTagToTarget = 1;
constexpr int kTagToDrafter = 2;

// What a target reports about itself, cumulative since its start; carried in every batch header so the
// metrics writer learns about every target without extra messages.
struct TargetReport {
  int32_t rank = -1;
  int32_t q_pre = 0;           // loader queue depth when the batch left
  int64_t batches = 0;         // batches sent
  int64_t tokens = 0;
  double compute_s = 0;        // forward
  double credit_wait_s = 0;    // holding a batch, waiting for a credit (throttled by the drafters)
  double data_wait_s = 0;      // waiting for the loader
  double send_wait_s = 0;      // waiting for a send buffer to drain
  double epoch_progress = 0;   // fractional epochs done by this target's loader
  double time_s = 0;           // since the job started, when the report was made
  GpuReading gpu;              // this target's GPU (NVML, at most 1 s old; valid = 0 without NVML)
};

// First message of every batch: sizes, so the receiver knows how much of each pre-posted buffer holds data.
struct BatchHeader {
  int64_t num_tokens = 0;      // T
  int64_t num_seqs = 0;
  int64_t num_layers = 0;      // k captured layers
  int64_t hidden = 0;          // H
  int64_t has_final_norm = 0;  // 1 when the final-norm hidden state [T, H] follows
  int64_t batch_index = 0;     // the target's loader batch index
  DataPosition next_position;  // the target's loader position right after this batch (checkpoints)
  int64_t seq = 0;             // n-th batch (0-based) this target sent to this drafter: the drafter trains
                               // each target's batches in this order even if slots complete out of order
  TargetReport report;
};

// Sizes of one slot's buffers: the largest batch a target may send.
struct SlotShape {
  int64_t max_tokens = 0;
  int64_t num_layers = 0;
  int64_t hidden = 0;
  bool final_norm = false;
};

// Host buffers of one receive slot / one send buffer.
struct WireBuffers {
  explicit WireBuffers(const SlotShape& s);
  SlotShape shape;
  BatchHeader header;
  std::vector<int32_t> tokens, cu_seqlens;
  std::vector<uint8_t> loss_mask;
  std::vector<float> features;    // [k, max_tokens, H], used as [k, T, H]
  std::vector<float> final_norm;  // [max_tokens, H]
};

// ---- data plane ----------------------------------------------------------------------------------
// How batch tensors move from a target's send buffer into a drafter's slot. The CPU backend uses host
// MPI (HostMpiDataPlane); NCCL and CUDA-aware MPI planes implement the same calls on device memory.
class DataPlane {
 public:
  virtual ~DataPlane() = default;
  // Drafter: pre-posts the receives of `slot` (from whichever target holds its credit).
  virtual void post_receive(int slot) = 0;
  // Drafter: true once every part of the slot's batch arrived; then slot_buffers(slot) holds it.
  virtual bool receive_done(int slot) = 0;
  virtual void cancel_receive(int slot) = 0;
  virtual bool receive_posted(int slot) const = 0;
  virtual WireBuffers& slot_buffers(int slot) = 0;
  // Target: starts sending send buffer `buf` (header filled) to `drafter`'s slot.
  virtual void post_send(int buf, int drafter, int slot) = 0;
  // Target: true once send buffer `buf` may be reused.
  virtual bool send_done(int buf) = 0;
  virtual WireBuffers& send_buffers(int buf) = 0;
  virtual int num_send_buffers() const = 0;
};

// Host MPI: every part is a non-blocking message on comm; a slot's receives are pre-posted from any
// source with tags unique to the slot (only the credit holder can send into it).
constexpr int kTagSlotBase = 100;
std::unique_ptr<DataPlane> make_host_mpi_data_plane(MPI_Comm comm, const SlotShape& shape, int num_slots,
                                                    int num_send_buffers);

}  // namespace dflash
