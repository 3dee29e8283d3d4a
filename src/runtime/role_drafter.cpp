// Drafter rank: receive batches into credited slots -> forward/backward -> gradient allreduce among the
// drafters -> AdamW step; the first drafter also writes metrics.h5 and exports the drafter.
#include <algorithm>
#include <cmath>
#include <deque>
#include <thread>

#include "dflash/checkpoint.h"
#include "dflash/drafter.h"
#include "dflash/error.h"
#include "dflash/hf_config.h"
#include "job.h"
#include "drafter_presence.h"
#include "job_metrics.h"

namespace dflash {
namespace {

std::string ranks_str(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

// One step's numbers over the drafters (summed by one allreduce, divided after). The loss is carried as
// loss × weight sum so the reported loss, like the gradient, is one global normalisation Σw·loss / Σw over
// every drafter's batch; the metrics are plain means.
struct StepSums {
  double weighted_loss = 0, weight_sum = 0, acc = 0, agree = 0, streak = 0, lr = 0, noise = 0, tokens = 0, anchors = 0;
};

class DrafterRank {
 public:
  explicit DrafterRank(JobContext& job)
      : job_(job), o_(job.opt), topo_(job.topo), ledger_(topo_.node_targets), targets_(topo_.node_targets.size()) {}

  void run() {
    const Qwen3Config cfg = load_qwen3_config(o_.target_dir + "/config.json");
    const std::vector<int> layers = capture_layer_ids(o_);
    const int num_drafters = static_cast<int>(topo_.drafters.size());
    DrafterTrainer trainer(o_.target_dir, o_.drafter_dir, o_.draft_layers, o_.train, cpu_ctx(), o_.token_budget);
    check_same_init(trainer);
    DrafterCheckpointer ckpt(o_, topo_.drafter_comm, topo_.world_size, static_cast<int>(topo_.targets.size()), job_.resume_dir);
    int64_t step = ckpt.restore(trainer);  // 0 unless resuming
    SlotShape shape{o_.token_budget, static_cast<int64_t>(layers.size()), cfg.hidden_size, o_.train.loss == LossKind::KL};
    plane_ = make_host_mpi_data_plane(MPI_COMM_WORLD, shape, o_.hs_queue_depth, 0);
    slot_owner_.assign(o_.hs_queue_depth, -1);
    slot_full_.assign(o_.hs_queue_depth, false);
    known_targets_.resize(topo_.targets.size());
    if (o_.batch_order == BatchOrder::Fixed) init_fixed_order();
    MetricsHub hub(job_);
    // The bytes each step allreduces (dflash-report prices more drafters with it when it measured none).
    hub.set_attribute("drafter_grad_bytes", static_cast<int64_t>(trainer.grads().numel() * dtype_size(trainer.grads().dtype)));
    wait_all_loaded(job_);
    hub.training_started();

    control_req_ = mpi::irecv(&control_in_, 1, MPI_ANY_SOURCE, kTagToDrafter, MPI_COMM_WORLD);
    for (auto& t : targets_) t.last_heard = mpi::Clock::now();
    for (int s = 0; s < o_.hs_queue_depth; ++s) grant(s);

    DrafterPresence presence(topo_, o_.peer_timeout_s);
    auto progress = [&] {
      pump();
      presence.poll();
    };
    // Every drafter runs the same collectives in the same order; before each it announces a new round,
    // so a stalled one names the drafters that never reached it (else all of them).
    int64_t round = -1;
    auto enter_collective = [&] { presence.announce(++round); };
    auto stalled = [&](const char* what) {
      std::string who = presence.laggards(round);
      return "lost peer: " + (who.empty() ? "drafter ranks " + ranks_str(topo_.drafters) : who) + ": " + what;
    };
    Tensor grads = trainer.grads();
    for (;;) {
      if (o_.max_steps > 0 && step >= o_.max_steps) break;  // resumed at the end
      enter_collective();
      // 1. a batch (or proof that none will come)
      auto t0 = mpi::Clock::now();
      wait_for_batch();
      report_.data_wait_s += mpi::seconds_since(t0);
      // 2. lockstep: every drafter trains this step, or all stop (the first to run dry stops everyone)
      t0 = mpi::Clock::now();
      int32_t have_all = ready_.empty() ? 0 : 1;
      if (num_drafters > 1) {
        MPI_Request r = mpi::iallreduce(&have_all, 1, MPI_MIN, topo_.drafter_comm);
        mpi::wait(r, o_.peer_timeout_s, [&] { return stalled("the drafters did not agree on the next step"); }, progress);
      }
      report_.allreduce_s += mpi::seconds_since(t0);
      if (!have_all) break;
      // 3. forward + backward on the oldest batch
      const int slot = ready_.front();
      ready_.pop_front();
      if (fixed_) fixed_->consumed();
      t0 = mpi::Clock::now();
      StepStats st = train_on_slot(trainer, slot);
      const BatchHeader& trained = plane_->slot_buffers(slot).header;  // read before the slot is released
      ckpt.trained_on(topo_.target_index_of(trained.report.rank), trained.batch_index, trained.next_position);
      if (o_.inject_delay_drafter_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.inject_delay_drafter_ms));
      report_.compute_s += mpi::seconds_since(t0);
      pump();  // batches sent during the compute complete now (host MPI progresses only inside MPI calls)
      release(slot);  // the slot is free again: its credit goes back before the optimizer runs
      maybe_inject_failure(job_, step);
      // 4. gradient average over the drafters, AdamW
      t0 = mpi::Clock::now();
      StepSums sums{st.loss * st.weight_sum, st.weight_sum, st.acc, st.agree, st.streak, st.lr, st.noise,
                    static_cast<double>(st.tokens), static_cast<double>(st.anchors)};
      if (num_drafters > 1) {
        // Each drafter's gradient is d(Σw·loss / Σw_local): scale it back to d(Σw·loss) before summing and
        // divide by the global Σw after, so several drafters train on one normalisation over all their batches
        // (the DFlash objective), not on a mean of per-drafter means.
        float* g = grads.ptr<float>();
        const float local_weight = static_cast<float>(st.weight_sum);
        for (size_t i = 0; i < grads.numel(); ++i) g[i] *= local_weight;
        enter_collective();
        MPI_Request rg = mpi::iallreduce(grads.ptr<float>(), grads.numel(), MPI_SUM, topo_.drafter_comm);
        MPI_Request rs = mpi::iallreduce(reinterpret_cast<double*>(&sums), sizeof(sums) / sizeof(double), MPI_SUM, topo_.drafter_comm);
        auto why = [&] { return stalled("the gradient allreduce stalled"); };
        mpi::wait(rg, o_.peer_timeout_s, why, progress);
        mpi::wait(rs, o_.peer_timeout_s, why, progress);
        const float inv = sums.weight_sum > 0 ? static_cast<float>(1.0 / sums.weight_sum) : 0.0f;
        for (size_t i = 0; i < grads.numel(); ++i) g[i] *= inv;
      }
      report_.allreduce_s += mpi::seconds_since(t0);
      t0 = mpi::Clock::now();
      const double grad_norm = trainer.optimizer_step();
      report_.optimizer_s += mpi::seconds_since(t0);
      ++step;
      report_.batches++;
      report_.tokens += st.tokens;

      const double n = num_drafters;
      StepMetrics m;
      m.step = step;
      m.time_s = job_.elapsed();
      m.loss = sums.weight_sum > 0 ? sums.weighted_loss / sums.weight_sum : st.loss;
      m.acc = sums.acc / n;
      m.agree = sums.agree / n;
      m.streak = sums.streak / n;
      m.lr = sums.lr / n;
      m.noise = sums.noise / n;
      m.grad_norm = grad_norm;
      m.tokens = static_cast<int64_t>(sums.tokens);
      m.anchors = static_cast<int64_t>(sums.anchors);
      DF_CHECK_HINT(std::isfinite(m.loss) && std::isfinite(grad_norm), NonFiniteLoss,
                    "step " << step << ": loss " << m.loss << ", grad norm " << grad_norm,
                    "lower --lr or add --warmup-steps; check the dataset for broken records");
      hub.record_step(m);
      if (step % o_.log_every == 0) {
        enter_collective();
        report(hub, MetricsHub::Rates::Interval, progress);
      }
      nlohmann::json schedule = {{"next_lr", trainer.current_lr()}, {"epoch_progress", nlohmann::json::array()}};
      for (const TargetReport& t : known_targets_) schedule["epoch_progress"].push_back(t.epoch_progress);
      enter_collective();
      if (ckpt.after_step(step, trainer, schedule, progress) == DrafterCheckpointer::Next::StopForRequeue) {
        job_.stop_for_requeue = true;
        break;
      }
      if (o_.max_steps > 0 && step >= o_.max_steps) break;
    }
    drain();
    presence.finish(round);
    if (step % o_.log_every != 0) report(hub, MetricsHub::Rates::WholeRun, progress);
    if (topo_.is_metrics_writer() && !job_.stop_for_requeue) {
      trainer.export_release(o_.out_dir + "/drafter", o_.export_dtype);
      std::printf("[dflash] %lld steps; drafter exported to %s/drafter\n", static_cast<long long>(step), o_.out_dir.c_str());
      std::fflush(stdout);
    }
    hub.close();
  }

 private:
  struct TargetState {
    int64_t received = 0;
    int64_t announced = -1;  // batches it says it sent (end-of-data), -1 before
    int64_t next_seq = 0;    // its next batch to make ready
    bool done = false;
    mpi::Clock::time_point last_heard;
  };

  // The drafters start from the same seed; a mismatch would silently train different models.
  void check_same_init(DrafterTrainer& trainer) {
    if (topo_.drafters.size() < 2) return;
    Tensor w = trainer.master_weights();
    double sum[2] = {0, 0};
    const float* p = w.ptr<float>();
    for (size_t i = 0; i < w.numel(); ++i) sum[0] += p[i] * static_cast<double>(i % 7 + 1);
    sum[1] = -sum[0];
    mpi::allreduce(sum, 2, MPI_MAX, topo_.drafter_comm);
    DF_CHECK(sum[0] == -sum[1], Internal, "drafter ranks start from different weights");
  }

  StepStats train_on_slot(DrafterTrainer& trainer, int slot) {
    WireBuffers& b = plane_->slot_buffers(slot);
    const BatchHeader& h = b.header;
    const int64_t T = h.num_tokens;
    batch_.tokens.assign(b.tokens.begin(), b.tokens.begin() + T);
    batch_.cu_seqlens.assign(b.cu_seqlens.begin(), b.cu_seqlens.begin() + h.num_seqs + 1);
    batch_.loss_mask.assign(b.loss_mask.begin(), b.loss_mask.begin() + T);
    FeatureBatch fb;
    fb.batch = &batch_;
    fb.features = Tensor(b.features.data(), DType::F32, Device::CPU, {h.num_layers, T, h.hidden});
    if (h.has_final_norm) fb.final_norm = Tensor(b.final_norm.data(), DType::F32, Device::CPU, {T, h.hidden});
    return trainer.forward_backward(fb);
  }

  // --batch-order fixed: this drafter's sequence (flow_control.h), continuing a resumed run's.
  void init_fixed_order() {
    const auto& nd = topo_.node_drafters;
    const int me = static_cast<int>(std::find(nd.begin(), nd.end(), topo_.world_rank) - nd.begin());
    fixed_.emplace(static_cast<int>(topo_.node_targets.size()), static_cast<int>(nd.size()), me);
    if (job_.resume_dir.empty()) return;
    for (size_t i = 0; i < topo_.node_targets.size(); ++i) {
      const DataResumePoint p = target_resume_point(job_.resume_dir, topo_.target_index_of(topo_.node_targets[i]),
                                                    static_cast<int>(topo_.targets.size()), o_.train.seed);
      std::vector<int64_t> later;
      for (const auto& [index, next] : p.done_after) later.push_back(index);
      fixed_->trained_before(static_cast<int>(i), p.position.batches, later);
    }
  }

  // --batch-order fixed: the batch this drafter trains next becomes ready once it is in (earlier
  // arrivals wait in their slots).
  void promote_expected() {
    if (!ready_.empty()) return;
    const std::optional<FixedBatchRef> e = fixed_->expected();
    if (!e) return;
    for (size_t k = 0; k < arrived_.size(); ++k) {
      const BatchHeader& h = plane_->slot_buffers(arrived_[k]).header;
      if (target_slot(h.report.rank) != e->target || h.batch_index != e->batch) continue;
      ready_.push_back(arrived_[k]);
      arrived_.erase(arrived_.begin() + static_cast<long>(k));
      return;
    }
  }

  int target_slot(int rank) const {
    for (size_t i = 0; i < topo_.node_targets.size(); ++i)
      if (topo_.node_targets[i] == rank) return static_cast<int>(i);
    DF_FAIL(Internal, "rank " << rank << " is not a target of this node", "");
  }

  // Posts the slot's receive and sends its credit to the target the ledger picks (none when all finished).
  void grant(int slot) {
    std::optional<int> to;
    if (fixed_) {  // in training order: the target of the next batch no credit was granted for yet
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
    if (!plane_->receive_posted(slot)) plane_->post_receive(slot);
    // A target that held no credit had nothing to do: its silence is timed from now.
    if (credits_held_by(*to) == 0) targets_[target_slot(*to)].last_heard = mpi::Clock::now();
    ledger_.granted(*to);
    slot_owner_[slot] = *to;
    send_control(*to, ControlMsg{ControlKind::Credit, slot, 0});
  }

  void release(int slot) {
    ledger_.consumed(slot_owner_[slot]);
    grant(slot);
  }

  // Credits of this drafter a target holds and has not used yet (its batches in full slots excluded).
  int credits_held_by(int rank) const {
    int n = 0;
    for (size_t s = 0; s < slot_owner_.size(); ++s) n += slot_owner_[s] == rank && !slot_full_[s];
    return n;
  }

  void send_control(int to, const ControlMsg& m) {
    out_.push_back(Outgoing{m, MPI_REQUEST_NULL});
    out_.back().req = mpi::isend(&out_.back().msg, 1, to, kTagToTarget, MPI_COMM_WORLD);
  }

  // Completes arrived batches and end-of-data messages; retires finished targets; checks liveness.
  void pump() {
    for (int s = 0; s < o_.hs_queue_depth; ++s) {
      if (!plane_->receive_posted(s) || !plane_->receive_done(s)) continue;
      const int from = plane_->slot_buffers(s).header.report.rank;
      DF_CHECK(from == slot_owner_[s], Internal, "slot " << s << " filled by rank " << from << ", credited to " << slot_owner_[s]);
      TargetState& t = targets_[target_slot(from)];
      t.received++;
      t.last_heard = mpi::Clock::now();
      const int ti = topo_.target_index_of(from);
      const TargetReport& rep = plane_->slot_buffers(s).header.report;
      if (rep.batches >= known_targets_[ti].batches) known_targets_[ti] = rep;  // slots complete in any order
      slot_full_[s] = true;
      if (fixed_) {
        const BatchHeader& h = plane_->slot_buffers(s).header;
        const int me = fixed_order_drafter_index();
        DF_CHECK(FixedBatchOrder::drafter_of(static_cast<int>(targets_.size()), static_cast<int>(topo_.node_drafters.size()),
                                             target_slot(from), h.batch_index) == me,
                 Internal, "batch " << h.batch_index << " of target rank " << from << " reached the wrong drafter under --batch-order fixed");
      }
      if (draining_) release_drained(s);
      else arrived_.push_back(s);
    }
    // Each target's batches become ready in the order it sent them (slots may complete out of order).
    for (bool moved = !fixed_.has_value(); moved;) {
      moved = false;
      for (size_t i = 0; i < arrived_.size(); ++i) {
        const BatchHeader& h = plane_->slot_buffers(arrived_[i]).header;
        TargetState& t = targets_[target_slot(h.report.rank)];
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
      TargetState& t = targets_[target_slot(st.MPI_SOURCE)];
      t.announced = control_in_.value;
      if (fixed_) fixed_->target_ended(target_slot(st.MPI_SOURCE), control_in_.end_index);
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
      for (int s = 0; s < o_.hs_queue_depth; ++s) {
        if (slot_owner_[s] != rank || slot_full_[s]) continue;
        ledger_.consumed(rank);
        if (draining_) slot_owner_[s] = -1;
        else grant(s);
      }
    }
    if (fixed_ && !draining_) promote_expected();
    while (!out_.empty() && mpi::test(out_.front().req)) out_.pop_front();
    check_liveness();
  }

  // A target holding credits of this drafter that has said nothing for --peer-timeout is lost.
  void check_liveness() {
    for (size_t i = 0; i < targets_.size(); ++i) {
      const TargetState& t = targets_[i];
      const int rank = topo_.node_targets[i];
      // Judged only while it owes something: a credit to use, or batches it announced.
      const int held = credits_held_by(rank);
      if (t.done || (held == 0 && t.announced < 0)) continue;
      const double silent = mpi::seconds_since(t.last_heard);
      if (silent > o_.peer_timeout_s)
        fatal(ExitCode::LostPeer,
              "lost peer: target rank " + std::to_string(rank) + (held ? " holds " + std::to_string(held) + " credit(s) of this drafter but" : "") +
                  " sent nothing for " + std::to_string(static_cast<int>(silent)) + " s",
              "target rank " + std::to_string(rank) + " died or hangs; see its own error above, or raise --peer-timeout if it is just slow");
    }
  }

  bool all_targets_done() const {
    for (const TargetState& t : targets_)
      if (!t.done) return false;
    return true;
  }

  void wait_for_batch() {
    mpi::Backoff backoff;
    for (;;) {
      pump();
      if (!ready_.empty()) return;
      // Fixed order: dry once this drafter's sequence has ended (targets it never hears from may run on).
      if (fixed_ ? !fixed_->expected().has_value() : all_targets_done()) return;
      backoff.idle();
    }
  }

  void release_drained(int slot) {
    ledger_.consumed(slot_owner_[slot]);
    slot_owner_[slot] = -1;
    slot_full_[slot] = false;
  }

  // After the last step: stop the targets, take in (and drop) what they still send, acknowledge.
  void drain() {
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
      backoff.idle();
    }
    for (int rank : topo_.node_targets) send_control(rank, ControlMsg{ControlKind::Fin, -1, 0});
    for (Outgoing& m : out_)
      mpi::wait(m.req, o_.peer_timeout_s, [&] { return std::string("a control message to a target did not complete"); });
    out_.clear();
    for (int s = 0; s < o_.hs_queue_depth; ++s) plane_->cancel_receive(s);
    mpi::cancel(control_req_);
  }

  void report(MetricsHub& hub, MetricsHub::Rates rates, const std::function<void()>& progress) {
    pump();
    report_.rank = topo_.world_rank;
    report_.q_hs = static_cast<int32_t>(ready_.size() + arrived_.size());
    report_.time_s = job_.elapsed();
    hub.report(report_, known_targets_, rates, progress);
  }

  struct Outgoing {
    ControlMsg msg;
    MPI_Request req;
  };

  JobContext& job_;
  const Options& o_;
  const Topology& topo_;
  CreditLedger ledger_;
  std::vector<TargetState> targets_;  // by node target index
  std::unique_ptr<DataPlane> plane_;
  std::vector<int> slot_owner_;       // target holding the slot's credit, -1 = none
  std::vector<bool> slot_full_;       // the slot holds a batch not yet trained on
  std::deque<int> ready_;             // slots holding a batch, in arrival order
  std::vector<int> arrived_;          // full slots waiting for an earlier batch of the same target
  std::deque<Outgoing> out_;          // deque: messages stay put while MPI sends them
  ControlMsg control_in_;
  MPI_Request control_req_ = MPI_REQUEST_NULL;
  std::vector<TargetReport> known_targets_;  // newest report of every target (world target index)
  DrafterReport report_;
  PackedBatch batch_;
  bool draining_ = false;
  std::optional<FixedBatchOrder> fixed_;  // --batch-order fixed
  int fixed_order_drafter_index() const {
    const auto& nd = topo_.node_drafters;
    return static_cast<int>(std::find(nd.begin(), nd.end(), topo_.world_rank) - nd.begin());
  }
};

}  // namespace

void run_drafter(JobContext& job) { DrafterRank(job).run(); }

}  // namespace dflash
