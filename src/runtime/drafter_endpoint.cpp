// DrafterEndpoint: see drafter_endpoint.h.
#include "drafter_endpoint.h"

#include <algorithm>

#include "dflash/checkpoint.h"
#include "dflash/error.h"
#include "dflash/message_tags.h"

namespace dflash {

DrafterEndpoint::DrafterEndpoint(JobContext& job, std::unique_ptr<DataPlane> plane)
    : job_(job),
      o_(job.opt),
      topo_(job.topo),
      plane_(std::move(plane)),
      ledger_(topo_.node_targets),
      targets_(topo_.node_targets.size()),
      slot_owner_(plane_->num_slots(), -1),
      slot_full_(plane_->num_slots(), false),
      known_targets_(topo_.targets.size()) {
  if (o_.batch_order == BatchOrder::Fixed) init_fixed_order();
}

DrafterEndpoint::~DrafterEndpoint() = default;

void DrafterEndpoint::start() {
  control_req_ = mpi::irecv(&control_in_, 1, MPI_ANY_SOURCE, kTagToDrafter, MPI_COMM_WORLD);
  for (auto& t : targets_) t.last_heard = mpi::Clock::now();
  for (int s = 0; s < plane_->num_slots(); ++s) grant(s);
  training_ = true;
}

void DrafterEndpoint::receive_eval(const std::vector<int>& senders, const std::function<void(const HsBatch&)>& keep) {
  DF_CHECK(!eval_phase_ && control_req_ == MPI_REQUEST_NULL, Internal, "receive_eval called twice, or after start()");
  std::vector<int64_t> owed(targets_.size(), 0);
  for (int i : senders) {
    DF_CHECK(i >= 0 && i < static_cast<int>(targets_.size()), Internal, "eval batch from node target " << i);
    owed[static_cast<size_t>(i)]++;
  }
  const size_t want = senders.size();
  size_t got = 0;
  eval_phase_ = true;
  eval_senders_ = senders;
  eval_granted_ = 0;
  for (auto& t : targets_) t.last_heard = mpi::Clock::now();
  for (int s = 0; s < plane_->num_slots(); ++s) grant(s);
  mpi::Backoff backoff;
  while (got < want) {
    pump();  // check_liveness: a target that holds a credit and stays silent past --peer-timeout is fatal
    if (eval_ready_.empty()) {
      if (plane_->transfers_in_flight()) backoff.reset();
      backoff.idle();
      continue;
    }
    const int slot = eval_ready_.front();
    eval_ready_.pop_front();
    keep(plane_->slot(slot));
    ++got;
    release(slot);  // granted to the sender of the next batch, or left free for start()
    backoff.reset();
  }
  for (size_t i = 0; i < targets_.size(); ++i)
    DF_CHECK(targets_[i].next_seq == owed[i], Internal,
             "target rank " << topo_.node_targets[i] << " sent " << targets_[i].next_seq << " eval batches, owed " << owed[i]);
  for (int s = 0; s < plane_->num_slots(); ++s)
    DF_CHECK(slot_owner_[s] < 0 && !plane_->receive_posted(s), Internal, "slot " << s << " still granted after the eval batches");
  eval_phase_ = false;
}

// --batch-order fixed: this drafter's sequence (flow_control.h), continuing a resumed run's.
void DrafterEndpoint::init_fixed_order() {
  fixed_.emplace(static_cast<int>(topo_.node_targets.size()), static_cast<int>(topo_.node_drafters.size()),
                 topo_.node_drafter_index_of(topo_.world_rank));
  if (job_.plan.resume.fresh()) return;
  for (size_t i = 0; i < topo_.node_targets.size(); ++i) {
    const DataResumePoint& p = job_.plan.resume.data.points.at(static_cast<size_t>(topo_.target_index_of(topo_.node_targets[i])));
    std::vector<int64_t> later;
    for (const auto& [index, next] : p.done_after) later.push_back(index);
    fixed_->trained_before(static_cast<int>(i), p.position.batches, later);
  }
}

// --batch-order fixed: the batch this drafter trains next becomes ready once it is in (earlier
// arrivals wait in their slots).
void DrafterEndpoint::promote_expected() {
  if (!ready_.empty()) return;
  const std::optional<FixedBatchRef> e = fixed_->expected();
  if (!e) return;
  for (size_t k = 0; k < arrived_.size(); ++k) {
    const BatchHeader& h = plane_->slot(arrived_[k]).header;
    if (topo_.node_target_index_of(h.report.rank) != e->target || h.batch_index != e->batch) continue;
    ready_.push_back(arrived_[k]);
    arrived_.erase(arrived_.begin() + static_cast<long>(k));
    return;
  }
}

// Posts the slot's receive from the target the ledger picks and sends it the credit (none when all
// finished). A receive still posted for a target that has since finished is re-posted for the new one.
void DrafterEndpoint::grant(int slot) {
  std::optional<int> to;
  if (eval_phase_) {  // the sender of the share's next batch no credit was granted for yet
    if (eval_granted_ < eval_senders_.size()) to = topo_.node_targets[static_cast<size_t>(eval_senders_[eval_granted_++])];
  } else if (fixed_) {  // in training order: the target of the next batch no credit was granted for yet
    if (std::optional<FixedBatchRef> next = fixed_->next_to_grant()) {
      to = topo_.node_targets[next->target];
      fixed_->granted();
    }
  } else {
    to = ledger_.next_grantee();
  }
  slot_owner_[slot] = -1;
  slot_full_[slot] = false;
  if (!to) return;
  if (plane_->receive_posted(slot) && plane_->receive_sender(slot) != *to) plane_->cancel_receive(slot);
  if (!plane_->receive_posted(slot)) plane_->post_receive(slot, *to);
  // A target that held no credit had nothing to do: its silence is timed from now.
  if (credits_held_by(*to) == 0) targets_[topo_.node_target_index_of(*to)].last_heard = mpi::Clock::now();
  if (!eval_phase_) ledger_.granted(*to);  // the eval credits are outside the training's ledger
  slot_owner_[slot] = *to;
  send_control(*to, ControlMsg{ControlKind::Credit, slot, 0});
}

int DrafterEndpoint::take_ready() {
  DF_ASSERT(!ready_.empty());
  const int slot = ready_.front();
  ready_.pop_front();
  if (fixed_) fixed_->consumed();
  return slot;
}

void DrafterEndpoint::release(int slot) {
  if (!eval_phase_) ledger_.consumed(slot_owner_[slot]);
  grant(slot);
}

// Credits of this drafter a target holds and has not used yet (its batches in full slots excluded).
int DrafterEndpoint::credits_held_by(int rank) const {
  int n = 0;
  for (size_t s = 0; s < slot_owner_.size(); ++s) n += slot_owner_[s] == rank && !slot_full_[s];
  return n;
}

void DrafterEndpoint::send_control(int to, const ControlMsg& m) {
  out_.push_back(Outgoing{m, MPI_REQUEST_NULL});
  out_.back().req = mpi::isend(&out_.back().msg, 1, to, kTagToTarget, MPI_COMM_WORLD);
}

// Completes arrived batches and end-of-data messages; retires finished targets; checks liveness.
void DrafterEndpoint::pump() {
  for (int s = 0; s < plane_->num_slots(); ++s) {
    if (!plane_->receive_posted(s) || !plane_->receive_done(s)) continue;
    const BatchHeader& h = plane_->slot(s).header;
    const int from = h.report.rank;
    DF_CHECK(from == slot_owner_[s], Internal, "slot " << s << " filled by rank " << from << ", credited to " << slot_owner_[s]);
    TargetState& t = targets_[topo_.node_target_index_of(from)];
    t.received++;
    t.last_heard = mpi::Clock::now();
    slot_full_[s] = true;
    // Eval batches come only in receive_eval (training credits are granted after it) and lead the
    // target's sequence, whatever order their slots complete in.
    DF_CHECK((h.kind == BatchKind::Eval) == eval_phase_, Internal,
             (h.kind == BatchKind::Eval ? "an eval batch" : "a training batch") << " from rank " << from << " arrived "
                                                                                 << (eval_phase_ ? "during" : "after") << " the eval phase");
    if (eval_phase_) {
      t.next_seq++;
      eval_ready_.push_back(s);
      continue;
    }
    const int ti = topo_.target_index_of(from);
    if (h.report.batches >= known_targets_[ti].batches) known_targets_[ti] = h.report;  // slots complete in any order
    if (fixed_)
      DF_CHECK(FixedBatchOrder::drafter_of(static_cast<int>(targets_.size()), static_cast<int>(topo_.node_drafters.size()),
                                           topo_.node_target_index_of(from), h.batch_index) == topo_.node_drafter_index_of(topo_.world_rank),
               Internal, "batch " << h.batch_index << " of target rank " << from << " reached the wrong drafter under --batch-order fixed");
    if (draining_) release_drained(s);
    else arrived_.push_back(s);
  }
  // Each target's batches become ready in the order it sent them (slots may complete out of order).
  for (bool moved = !fixed_.has_value(); moved;) {
    moved = false;
    for (size_t i = 0; i < arrived_.size(); ++i) {
      const BatchHeader& h = plane_->slot(arrived_[i]).header;
      TargetState& t = targets_[topo_.node_target_index_of(h.report.rank)];
      if (h.seq != t.next_seq) continue;
      t.next_seq++;
      ready_.push_back(arrived_[i]);
      arrived_.erase(arrived_.begin() + static_cast<long>(i));
      moved = true;
      break;
    }
  }
  MPI_Status st;
  while (control_req_ != MPI_REQUEST_NULL && mpi::test(control_req_, &st)) {
    DF_CHECK(control_in_.kind == ControlKind::EndOfData, Internal, "drafter got control message " << static_cast<int>(control_in_.kind));
    TargetState& t = targets_[topo_.node_target_index_of(st.MPI_SOURCE)];
    t.announced = control_in_.value;
    if (fixed_) fixed_->target_ended(topo_.node_target_index_of(st.MPI_SOURCE), control_in_.end_index);
    t.last_heard = mpi::Clock::now();
    control_req_ = mpi::irecv(&control_in_, 1, MPI_ANY_SOURCE, kTagToDrafter, MPI_COMM_WORLD);
  }
  // A target is done once its end-of-data arrived and every batch it announced is in (the data
  // messages travel on other tags, so they may arrive after the announcement).
  for (size_t i = 0; i < targets_.size(); ++i) {
    TargetState& t = targets_[i];
    if (t.done || t.announced < 0 || t.received < t.announced) continue;
    t.done = true;
    const int rank = topo_.node_targets[i];
    ledger_.finished(rank);
    // Its unused credits come back and go to the targets still running.
    for (int s = 0; s < plane_->num_slots(); ++s) {
      if (slot_owner_[s] != rank || slot_full_[s]) continue;
      ledger_.consumed(rank);
      if (draining_) {
        slot_owner_[s] = -1;
        plane_->cancel_receive(s);
      } else {
        grant(s);
      }
    }
  }
  if (fixed_ && !draining_) promote_expected();
  while (!out_.empty() && mpi::test(out_.front().req)) out_.pop_front();
  check_liveness();
}

// A target holding credits of this drafter that has said nothing for --peer-timeout is lost. Before
// training nothing is at stake: fatal at once. During training the first loss is recorded and the drafter
// loop ends the job after it checkpointed (fail_lost_target).
void DrafterEndpoint::check_liveness() {
  if (lost_) return;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const TargetState& t = targets_[i];
    const int rank = topo_.node_targets[i];
    // Judged only while it owes something: a credit to use, or batches it announced.
    const int held = credits_held_by(rank);
    if (t.done || (held == 0 && t.announced < 0)) continue;
    const double silent = mpi::seconds_since(t.last_heard);
    if (silent <= o_.peer_timeout_s) continue;
    lost_ = LostTarget{"lost peer: target rank " + std::to_string(rank) +
                           (held ? " holds " + std::to_string(held) + " credit(s) of this drafter but" : "") +
                           " sent nothing for " + std::to_string(static_cast<int>(silent)) + " s",
                       "target rank " + std::to_string(rank) +
                           " died or hangs; see its own error above, or raise --peer-timeout if it is just slow"};
    if (!training_) fail_lost_target();
    return;
  }
}

void DrafterEndpoint::fail_lost_target() const {
  DF_ASSERT(lost_.has_value());
  fatal(ExitCode::LostPeer, lost_->what, lost_->hint);
}

bool DrafterEndpoint::all_targets_done() const {
  for (const TargetState& t : targets_)
    if (!t.done) return false;
  return true;
}

DrafterEndpoint::Arrival DrafterEndpoint::wait_for_batch() {
  mpi::Backoff backoff;
  for (;;) {
    pump();
    // A lost target ends training at once, even while others still feed this drafter.
    if (lost_) return Arrival::TargetLost;
    if (!ready_.empty()) return Arrival::Batch;
    // Fixed order: dry once this drafter's sequence has ended (targets it never hears from may run on).
    if (fixed_ ? !fixed_->expected().has_value() : all_targets_done()) return Arrival::Ended;
    if (plane_->transfers_in_flight()) backoff.reset();  // poll without sleeping while a batch moves
    backoff.idle();
  }
}

void DrafterEndpoint::release_drained(int slot) {
  ledger_.consumed(slot_owner_[slot]);
  slot_owner_[slot] = -1;
  slot_full_[slot] = false;
}

void DrafterEndpoint::drain() {
  draining_ = true;
  for (int s : arrived_) ready_.push_back(s);
  arrived_.clear();
  while (!ready_.empty()) {
    release_drained(ready_.front());
    ready_.pop_front();
  }
  for (size_t i = 0; i < targets_.size(); ++i)
    if (!targets_[i].done) send_control(topo_.node_targets[i], ControlMsg{ControlKind::Stop, -1, 0});
  mpi::Backoff backoff;
  while (!all_targets_done()) {  // check_liveness (in pump) bounds this wait
    pump();
    if (lost_) {  // the drafter loop checkpoints and ends the job: nothing more is owed to the targets
      for (int s = 0; s < plane_->num_slots(); ++s) plane_->cancel_receive(s);
      mpi::cancel(control_req_);
      return;
    }
    backoff.idle();
  }
  for (int rank : topo_.node_targets) send_control(rank, ControlMsg{ControlKind::Fin, -1, 0});
  for (Outgoing& m : out_)
    mpi::wait(m.req, o_.peer_timeout_s, [&] { return std::string("a control message to a target did not complete"); });
  out_.clear();
  for (int s = 0; s < plane_->num_slots(); ++s) plane_->cancel_receive(s);
  mpi::cancel(control_req_);
}

}  // namespace dflash
