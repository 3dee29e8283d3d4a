// Drafter rank, the training loop: next ready batch -> forward/backward -> gradient sum over the drafters
// (one global loss normalisation) -> AdamW. The protocol (slots, credits, drain, the targets' liveness)
// is DrafterEndpoint's; the tensors arrive through a DataPlane; the sum goes through a GradientReducer.
// The first drafter also writes metrics.h5 and exports the drafter. A target lost during training ends
// the job only after the drafters checkpointed the last applied step (end_on_lost_target).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "dflash/auto_topology.h"
#include "dflash/checkpoint.h"
#include "dflash/drafter.h"
#include "dflash/error.h"
#include "run_dir.h"
#include "dflash/grad_reducer.h"
#include "dflash/hs_wire.h"
#include "drafter_best.h"
#include "drafter_endpoint.h"
#include "drafter_eval.h"
#include "drafter_group.h"
#include "drafter_tau.h"
#include "job.h"
#include "job_metrics.h"
#include "report_sidecar.h"
#include "run_resume.h"
#include "test_trace.h"

namespace dflash {
namespace {

class DrafterLoop {
 public:
  explicit DrafterLoop(JobContext& job)
      : job_(job), o_(job.opt), topo_(job.topo), group_(job), codec_(job.plan.slot_shape), best_(o_, job.plan.resume.dir),
        trace_(o_.inject_trace_dir, topo_.world_rank, job.plan.resume.step) {}

  void run() {
    const int num_drafters = static_cast<int>(topo_.drafters.size());
    DrafterTrainer trainer(job_.plan.drafter_source(o_), job_.plan.train, job_.ctx, o_.token_budget);
    group_.check_same_init(trainer.weights_checksum());
    // --eval-tau-every: this rank's own target for the verification (loaded before the load barrier)
    if (job_.tau_prompts) tau_ = std::make_unique<DrafterTau>(job_, trainer);
    const ResumeFrom& resume = job_.plan.resume;
    DrafterCheckpointer ckpt(checkpointer_config(o_, job_.plan), topo_.drafter_comm, resume.invariants, resume.data,
                             resume.dir, resume.split);
    int64_t step = ckpt.restore(trainer);  // 0 unless resuming
    DataPlaneSpec ps = data_plane_spec(job_);
    ps.num_slots = o_.hs_queue_depth;
    DrafterEndpoint endpoint(job_, make_data_plane(ps));
    endpoint_ = &endpoint;
    Tensor grads = trainer.grads();
    const GradHooks hooks = start_reducer(trainer);  // empty with one drafter
    MetricsHub hub(job_, trainer.config().block_size, trainer.config().arch == DraftArch::DFlash2);
    if (topo_.is_metrics_writer() && !o_.report_to.empty()) sidecar_ = std::make_unique<ReportSidecar>(o_);
    ckpt.before_save([&] { hub.flush(); });  // the metrics rows up to a checkpoint are on disk before it commits
    // The bytes each step allreduces (dflash-report prices more drafters with it when it measured none).
    hub.set_attribute("drafter_grad_bytes", static_cast<int64_t>(grads.nbytes()));
    // Micro-batches per optimizer step (--grad-accum, resolved): each /steps row sums that many per drafter
    // (the last step of a run whose data ended mid-step fewer; its tokens say how many).
    hub.set_attribute("grad_accum", static_cast<int64_t>(job_.plan.grad_accum));
    auto progress = [&] {
      endpoint.pump();
      group_.poll();
    };
    wait_all_loaded(job_);
    // --eval-data: this drafter's share of the eval set arrives first, on the same plane and credits.
    std::unique_ptr<DrafterEval> eval;
    if (job_.eval) {
      eval = std::make_unique<DrafterEval>(job_, trainer.config().block_size);
      endpoint.receive_eval(eval->senders(), [&](const HsBatch& b) { eval->keep(b, codec_.decode(job_.ctx, b)); });
    }
    wait_eval_features(job_, progress);
    int64_t last_eval = -1, last_tau = -1;  // steps of the last evaluation, and of the last that measured tau
    hub.training_started();
    endpoint.start();

    const int K = job_.plan.grad_accum;  // micro-batches per optimizer step (the segment's plan)
    for (;;) {
      if (o_.max_steps > 0 && step >= o_.max_steps) break;  // resumed at the end
      // 1.-3. K micro-batches (K = 1: the step's one batch), each agreed in lockstep by every drafter
      StepSums sums;
      std::vector<double> acc_by_pos(static_cast<size_t>(std::max(trainer.config().block_size - 1, 1)), 0.0);
      ckpt.step_begins(trainer);
      int micro = 0;
      Micro got = Micro::Trained;
      for (; micro < K; ++micro) {
        const MicroBatch mb = K == 1 ? MicroBatch::Whole : micro + 1 < K ? MicroBatch::Accumulate : MicroBatch::Last;
        got = train_micro_batch(trainer, endpoint, ckpt, hooks, mb, step, sums, acc_by_pos, progress);
        if (got != Micro::Trained) break;
      }
      if (got == Micro::TargetLost) end_on_lost_target(trainer, ckpt, step, progress);
      if (micro == 0) break;  // the data ended on a step boundary
      // The data ended inside the step: it trains on what it saw, normalised over those micro-batches.
      const bool partial = micro < K;
      if (partial) {
        trainer.finish_accumulation();
        if (num_drafters > 1) reducer_->start(trainer.grads(), 1.0f);  // one piece: no backward left to overlap
      }
      // 4. gradient sum over the drafters, AdamW
      auto t0 = mpi::Clock::now();
      if (num_drafters > 1) reduce_gradients(trainer, sums, acc_by_pos, progress);
      else if (K > 1) trainer.scale_grads(sums.weight_sum > 0 ? static_cast<float>(1.0 / sums.weight_sum) : 0.0f);
      report_.allreduce_s += mpi::seconds_since(t0);
      t0 = mpi::Clock::now();
      const double grad_norm = trainer.optimizer_step();
      report_.optimizer_s += mpi::seconds_since(t0);
      ++step;
      ckpt.step_applied();
      trace_.applied(step);
      record_step(hub, step, sums, acc_by_pos, grad_norm, num_drafters * micro);
      if (step % o_.log_every == 0) {
        enter_collective();
        report(hub, MetricsHub::Rates::Interval, progress);
        if (sidecar_ && sidecar_->due()) {  // --report-to: the series so far, in the background
          hub.flush();
          sidecar_->tick();
        }
      }
      // Before the checkpoint: its flush then holds this step's /eval row too.
      const bool tau_now = tau_ && tau_due(step, o_, job_.plan);
      if (eval && (eval_due(step, job_.plan.eval_every) || tau_now)) last_eval = evaluate(hub, *eval, trainer, step, progress, tau_now);
      if (tau_now) last_tau = step;
      enter_collective();
      const DrafterCheckpointer::Next next = ckpt.after_step(step, trainer, schedule_of(trainer), progress);
      if (next == DrafterCheckpointer::Next::StopForRequeue) {
        job_.outcome.code = static_cast<int>(ExitCode::Requeue);
        break;
      }
      // --rebalance auto: at a checkpoint, maybe another split from here (every rank in place: run_job).
      if (next == DrafterCheckpointer::Next::Saved && o_.rebalance == RebalanceMode::Auto &&
          decide_rebalance(hub, step, ckpt.last_checkpoint(), progress))
        break;
      if (o_.max_steps > 0 && step >= o_.max_steps) break;
      if (partial) break;  // the data has ended (every drafter agreed so)
    }
    endpoint.drain();
    // A target lost while the drafters drained: the final state is checkpointed before the job ends.
    if (agree_on_lost_target()) end_on_lost_target(trainer, ckpt, step, progress);
    // The end of training (not a stop for requeue: the resumed run goes on and evaluates on schedule).
    if (eval && !job_.run_goes_on() && (step != last_eval || (tau_ && step != last_tau)))
      evaluate(hub, *eval, trainer, step, progress, tau_ != nullptr);
    // The final state is checkpointed before the export: an export that fails (a full disk) does not lose
    // the trained drafter, and --resume auto from that checkpoint exports it without training again.
    std::string final_checkpoint;
    if (!job_.run_goes_on()) {
      enter_collective();
      final_checkpoint = ckpt.save_final(step, trainer, schedule_of(trainer), progress);
    }
    group_.finish();
    if (step % o_.log_every != 0) report(hub, MetricsHub::Rates::WholeRun, progress);
    if (topo_.is_metrics_writer() && !job_.run_goes_on()) {
      const FatalHintNote where(final_checkpoint.empty() ? std::string("nothing was trained: nothing is lost")
                                                         : "the trained drafter is safe in the checkpoint " + final_checkpoint +
                                                               ": fix the cause, then run the same command with --resume auto "
                                                               "to export it without training again");
      trainer.export_release(o_.out_dir + "/drafter", o_.export_dtype);
      // The run's end is on disk: the same command with --resume auto then has nothing to do (run_dir.h).
      if (!final_checkpoint.empty()) record_run_complete(o_.out_dir, ckpt.run_id(), step);
      std::printf("[dflash] %lld steps; drafter exported to %s/drafter\n", static_cast<long long>(step), o_.out_dir.c_str());
      std::fflush(stdout);
    }
    hub.close();
    // The job's last export (W&B too), from the closed file; waited for well inside the shutdown's deadline
    // (10 x --peer-timeout for working ranks: shutdown.cpp), else left to finish on its own.
    if (sidecar_) sidecar_->finish(std::min(120.0, 5 * o_.peer_timeout_s));
    tau_.reset();  // its decoder refers to this trainer
    endpoint_ = nullptr;
  }

 private:
  // With several drafters: the gradient reducer (bucketed, --grad-bucket-mb) and the hooks that start each
  // bucket's sum as the backward finalises it (the step's last micro-batch's backward with --grad-accum),
  // each prescaled by the batch's weight sum (1 for a folded accumulation: GradHooks).
  GradHooks start_reducer(DrafterTrainer& trainer) {
    GradHooks hooks;
    if (group_.size() < 2) return hooks;
    std::vector<GradRange> params;
    for (const ParamSpec& p : trainer.param_layout()) params.push_back({p.offset, p.offset + p.numel()});
    reducer_ = make_gradient_reducer(job_.grad_reduce, topo_.drafter_comm, job_.ctx,
                                     plan_grad_buckets(params, grad_bucket_elements(o_.grad_bucket_mb)), o_.peer_timeout_s);
    if (topo_.is_metrics_writer()) {
      std::printf("[dflash] gradient allreduce: %zu bucket(s) (--grad-bucket-mb %g), %s\n", reducer_->buckets().size(),
                  o_.grad_bucket_mb, reducer_->buckets().size() > 1 ? "summed while the backward runs" : "summed after the backward");
      std::fflush(stdout);
    }
    hooks.begin = [this, &trainer](double prescale) { reducer_->begin_step(trainer.grads(), static_cast<float>(prescale)); };
    hooks.ready = [this](size_t begin, size_t end) { reducer_->ready(begin, end); };
    return hooks;
  }

  // One micro-batch of the step (MicroBatch::Whole with --grad-accum 1): a batch or proof that none will come,
  // the drafters' agreement (every drafter trains it, or all stop: the first to run dry stops everyone, a
  // drafter that lost a target makes everyone checkpoint and end the job), forward + backward, its numbers
  // added to sums.
  enum class Micro { Trained, DataEnded, TargetLost };
  Micro train_micro_batch(DrafterTrainer& trainer, DrafterEndpoint& endpoint, DrafterCheckpointer& ckpt,
                         const GradHooks& hooks, MicroBatch mb, int64_t step, StepSums& sums,
                         std::vector<double>& acc_by_pos, const std::function<void()>& progress) {
    enter_collective();
    auto t0 = mpi::Clock::now();
    const DrafterEndpoint::Arrival arrival = endpoint.wait_for_batch();
    report_.data_wait_s += mpi::seconds_since(t0);
    t0 = mpi::Clock::now();
    const DrafterGroup::StepAgreement agreed = group_.agree_on_step(
        arrival == DrafterEndpoint::Arrival::Batch, arrival == DrafterEndpoint::Arrival::TargetLost, progress);
    report_.allreduce_s += mpi::seconds_since(t0);
    if (agreed.lost_by != INT32_MAX) {
      lost_by_ = agreed.lost_by;
      return Micro::TargetLost;
    }
    if (!agreed.all_have_batch) return Micro::DataEnded;
    const int slot = endpoint.take_ready();
    t0 = mpi::Clock::now();
    const HsBatch& hb = endpoint.batch(slot);
    FeatureBatch fb;
    fb.batch = &hb.batch;
    const HsValues values = codec_.decode(job_.ctx, hb);  // --hs-dtype fp8: dequantized on the step's stream
    fb.features = values.features;
    fb.final_norm = values.final_norm;
    const StepStats st = mb == MicroBatch::Whole ? trainer.forward_backward(fb, hooks) : trainer.forward_backward(fb, mb, hooks);
    ckpt.trained_on(topo_.target_index_of(hb.header.report.rank), hb.header.batch_index, hb.header.next_position);
    trace_.trained(hb.header.report.rank, hb.header.batch_index);
    if (o_.inject_delay_drafter_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.inject_delay_drafter_ms));
    report_.compute_s += mpi::seconds_since(t0);
    // Contention of two roles on one device, which neither role's own busy time shows: only the rank's wall
    // time per batch (its colocated overlap, job_metrics.cpp) and auto's colocated phase see it.
    if (o_.inject_delay_colocated_ms > 0 && topo_.role == Role::Colocated)
      std::this_thread::sleep_for(std::chrono::milliseconds(o_.inject_delay_colocated_ms));
    endpoint.pump();  // batches sent during the compute complete now (host MPI progresses only inside MPI calls)
    endpoint.release(slot);  // the slot is free again: its credit goes back before the optimizer runs
    maybe_inject_failure(job_, step);
    sums.weighted_loss += st.loss * st.weight_sum;
    sums.weight_sum += st.weight_sum;
    sums.acc += st.acc;
    sums.agree += st.agree;
    sums.streak += st.streak;
    sums.lr += st.lr;
    sums.noise += st.noise;
    sums.tokens += static_cast<double>(st.tokens);
    sums.anchors += static_cast<double>(st.anchors);
    if (std::isfinite(st.loss_sel)) {
      sums.weighted_sel += st.loss_sel * st.weight_sum;
      sums.loss_rows += st.loss_rows;
      sums.covered_rows += st.covered_rows;
      sums.selector_correct_rows += st.selector_correct_rows;
      sums.selector_alpha += st.selector_alpha;
    }
    const std::vector<double> pos = positions_after_anchor(st.per_pos_acc, trainer.config().block_size);
    for (size_t i = 0; i < pos.size() && i < acc_by_pos.size(); ++i) acc_by_pos[i] += pos[i];
    report_.batches++;
    report_.tokens += st.tokens;
    return Micro::Trained;
  }

  // After the drain: whether any drafter lost a target (collective over the drafters); lost_by_ names it.
  bool agree_on_lost_target() {
    lost_by_ = group_.agree_on_lost_target(endpoint_->target_lost());
    return lost_by_ != INT32_MAX;
  }

  // A drafter lost a target (lost_by_): every drafter checkpoints the last applied step `step` (the step in
  // progress is dropped and trained again on resume), then the job ends with LostPeer. The drafter that
  // lost it names the target; the others give its error a moment to end the job first.
  [[noreturn]] void end_on_lost_target(DrafterTrainer& trainer, DrafterCheckpointer& ckpt, int64_t step,
                                       const std::function<void()>& progress) {
    enter_collective();
    const std::string dir = ckpt.save_before_exit(step, trainer, schedule_of(trainer), progress);
    const FatalHintNote note(dir.empty() ? std::string("nothing was trained yet: nothing is lost")
                                         : "the drafter's state after step " + std::to_string(step) + " is checkpointed in " + dir +
                                               ": once the target runs again, the same command with --resume auto continues from it");
    if (endpoint_->target_lost()) endpoint_->fail_lost_target();
    mpi::Deadline grace(std::min(o_.peer_timeout_s, 10.0));
    while (!grace.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fatal(ExitCode::LostPeer, "lost peer: drafter rank " + std::to_string(lost_by_) + " lost a target",
          "its own error above names the target");
  }

  // --rebalance auto, after the checkpoint of `step` (collective over the drafters): the writer asks the
  // what-if model (auto_topology.h) with this segment's measured service times; all drafters take its answer.
  // True when the run moves to another split: job_.outcome says which, and from which checkpoint.
  bool decide_rebalance(const MetricsHub& hub, int64_t step, const std::string& checkpoint,
                        const std::function<void()>& progress) {
    int32_t to[3] = {0, 0, 0};  // targets, drafters per node, colocated (1) (all 0: keep the layout)
    if (topo_.is_metrics_writer()) {
      const std::optional<RoleMeasurements> m = hub.measurements();
      const std::string now = job_.plan.split().to_string();
      if (!m) {
        std::printf("[rebalance] step %lld: fewer than two report intervals measured on %s (--log-every %d): keep it\n",
                    static_cast<long long>(step), now.c_str(), o_.log_every);
      } else {
        const std::optional<double> budget = o_.power_budget_w > 0 ? std::optional<double>(o_.power_budget_w) : std::nullopt;
        const RebalanceChoice c = choose_rebalance(*m, job_.plan.split(), o_.rebalance_min_gain_pct / 100.0, budget);
        if (c.to) {
          to[0] = c.to->targets;
          to[1] = c.to->drafters;
          to[2] = c.to->layout == Layout::Colocated ? 1 : 0;
          std::printf("[rebalance] %s -> %s at step %lld: predicted %+.0f %% (%s)\n", now.c_str(), c.to->split().c_str(),
                      static_cast<long long>(step), 100 * c.gain, c.why.c_str());
        } else {
          std::printf("[rebalance] step %lld: %s\n", static_cast<long long>(step), c.why.c_str());
        }
      }
      std::fflush(stdout);
    }
    if (group_.size() > 1) {
      enter_collective();
      MPI_Request r = mpi::ibcast(to, 3, 0, topo_.drafter_comm);
      mpi::wait(r, o_.peer_timeout_s, [] { return std::string("drafters did not agree on a new split (one is lost)"); }, progress);
    }
    if (to[0] <= 0) return false;
    job_.outcome = SegmentEnd{kResplitCode, to[2] ? colocated_spec() : TopologySpec{to[0], to[1]}, checkpoint};
    return true;
  }

  // What a checkpoint records of the schedule: the next learning rate and every target's epoch progress.
  nlohmann::json schedule_of(const DrafterTrainer& trainer) const {
    nlohmann::json schedule = {{"next_lr", trainer.current_lr()}, {"epoch_progress", nlohmann::json::array()},
                               {"total_steps", job_.plan.schedule.total_steps},
                               {"warmup_steps", job_.plan.schedule.warmup_steps}};
    if (!best_.record().empty()) schedule["best"] = best_.record();  // OUT/drafter-best's (drafter_best.h)
    for (const TargetReport& t : endpoint_->known_targets()) schedule["epoch_progress"].push_back(t.epoch_progress);
    return schedule;
  }

  // Every drafter runs the same collectives in the same order; before each it announces a new round
  // (DrafterGroup), so a stalled one names the drafters that never reached it (else all of them).
  void enter_collective() { group_.enter(); }

  // Each drafter's gradient is d(Σw·loss / Σw_local): scaled back to d(Σw·loss) before the sum (the
  // reducer prescales each bucket by Σw_local, given to it by GradHooks::begin before the backward; with
  // --grad-accum the folded gradient is d(Σw·loss) over the step's micro-batches already, prescale 1) and
  // divided by the global Σw after, so several drafters train on one normalisation over all their batches
  // (the DFlash objective), not on a mean of per-drafter means. The buckets were launched during the
  // backward; what is left here is the exposed part of the sum, waited for together with the step's
  // numbers. The round is announced only now, so a drafter stuck before here (in its backward, say) is
  // the one named; the wait drives the endpoint and names a lost drafter at its deadline.
  // acc_by_pos (accuracy per block position) is summed with the step's other numbers.
  void reduce_gradients(DrafterTrainer& trainer, StepSums& sums, std::vector<double>& acc_by_pos,
                        const std::function<void()>& progress) {
    group_.sum_step(sums, acc_by_pos, *reducer_, progress);
    trainer.scale_grads(sums.weight_sum > 0 ? static_cast<float>(1.0 / sums.weight_sum) : 0.0f);
  }

  // Every drafter evaluates its share of the eval set; the sums over the drafters (one allreduce, counts
  // and weighted sums: the numbers of one drafter evaluating it all) make the /eval row and the [eval]
  // line. Collective over the drafters, at the same step on each (lockstep). with_tau: the drafters also
  // decode their shares of the prompts (drafter_tau.h), summed in the same allreduce. A better drafter
  // than the best so far goes to OUT/drafter-best. Returns `step`.
  int64_t evaluate(MetricsHub& hub, DrafterEval& eval, DrafterTrainer& trainer, int64_t step, const std::function<void()>& progress,
                   bool with_tau) {
    const auto t0 = mpi::Clock::now();
    std::vector<double> sums = eval.evaluate(trainer).pack();
    const size_t loss_sums = sums.size();
    if (with_tau) {
      const std::vector<double> t = tau_->measure(progress).pack();
      sums.insert(sums.end(), t.begin(), t.end());
    }
    endpoint_->pump();  // batches that arrived meanwhile complete (the targets go on while this runs)
    group_.sum(sums, "summing the eval results stalled", progress);
    EvalMetrics m = EvalSums::unpack({sums.begin(), sums.begin() + static_cast<std::ptrdiff_t>(loss_sums)},
                                     trainer.config().block_size).metrics();
    if (with_tau) DrafterTau::fill(m, TauSums::unpack(sums.data() + loss_sums));
    m.step = step;
    m.time_s = job_.elapsed();
    m.seconds = mpi::seconds_since(t0);
    report_.eval_s += m.seconds;  // its own share of the rank's time, not fwd+bwd (/ranks/eval_s)
    hub.record_eval(m);
    if (best_.offer(m) && topo_.is_metrics_writer()) best_.write(m, trainer);
    return step;
  }

  // Positions 1 .. block_size-1 of StepStats::per_pos_acc (0 is the anchor, never predicted).
  static std::vector<double> positions_after_anchor(const std::vector<double>& per_pos_acc, int block_size) {
    std::vector<double> out(static_cast<size_t>(std::max(block_size - 1, 1)), 0.0);
    for (size_t k = 1; k < per_pos_acc.size() && k - 1 < out.size(); ++k) out[k - 1] = per_pos_acc[k];
    return out;
  }

  // batches: the micro-batches summed into sums (drafters x micro-batches of the step); the metrics are
  // their means, the loss one normalisation over all of them.
  void record_step(MetricsHub& hub, int64_t step, const StepSums& sums, const std::vector<double>& acc_by_pos,
                   double grad_norm, int batches) {
    const double n = batches;
    StepMetrics m;
    m.step = step;
    m.time_s = job_.elapsed();
    m.loss = sums.weight_sum > 0 ? sums.weighted_loss / sums.weight_sum : 0.0;
    m.acc = sums.acc / n;
    m.agree = sums.agree / n;
    m.streak = sums.streak / n;
    m.lr = sums.lr / n;
    m.noise = sums.noise / n;
    m.grad_norm = grad_norm;
    m.tokens = static_cast<int64_t>(sums.tokens);
    m.anchors = static_cast<int64_t>(sums.anchors);
    for (double a : acc_by_pos) m.acc_by_pos.push_back(a / n);  // the mean over the batches, as acc
    if (sums.loss_rows > 0) {  // DFlash2: exact over every drafter's rows
      m.loss_sel = sums.weight_sum > 0 ? sums.weighted_sel / sums.weight_sum : 0.0;
      m.candidate_recall = sums.covered_rows / sums.loss_rows;
      m.selector_acc = sums.selector_correct_rows / sums.loss_rows;
      m.selector_alpha = sums.selector_alpha / n;
    }
    DF_CHECK_HINT(std::isfinite(m.loss) && std::isfinite(grad_norm), NonFiniteLoss,
                  "step " << step << ": loss " << m.loss << ", grad norm " << grad_norm,
                  "lower --lr or add --warmup-steps; check the dataset for broken records");
    hub.record_step(m, endpoint_->known_targets());
  }

  void report(MetricsHub& hub, MetricsHub::Rates rates, const std::function<void()>& progress) {
    endpoint_->pump();
    report_.rank = topo_.world_rank;
    report_.q_hs = endpoint_->queue_depth();
    report_.time_s = job_.elapsed();
    hub.report(report_, endpoint_->known_targets(), rates, progress);
  }

  JobContext& job_;
  const Options& o_;
  const Topology& topo_;
  DrafterGroup group_;  // the collectives over the drafters
  HsCodec codec_;       // a received batch's values (the fp8 wire dequantizes into its staging)
  int lost_by_ = INT32_MAX;  // world rank of the drafter that lost a target (agreed by the drafters)
  DrafterEndpoint* endpoint_ = nullptr;
  std::unique_ptr<GradientReducer> reducer_;
  DrafterBest best_;                 // OUT/drafter-best
  TestTrace trace_;                  // --inject-trace-dir (tests)
  std::unique_ptr<ReportSidecar> sidecar_;  // --report-to (the metrics writer only)
  std::unique_ptr<DrafterTau> tau_;  // --eval-tau-every
  DrafterReport report_;
};

}  // namespace

void run_drafter(JobContext& job) { DrafterLoop(job).run(); }

}  // namespace dflash
