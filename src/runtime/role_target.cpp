// Target rank: loader thread -> frozen target forward -> send against a credit (docs/pipeline.md).
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "dflash/backend.h"
#include "dflash/checkpoint.h"
#include "dflash/data.h"
#include "dflash/data_plane.h"
#include "dflash/device_async.h"
#include "dflash/error.h"
#include "dflash/eval_set.h"
#include "dflash/hf_config.h"
#include "dflash/hs_wire.h"
#include "dflash/target.h"
#include "job.h"
#include "target_endpoint.h"
#include "test_trace.h"

namespace dflash {
namespace {

class TargetRank {
 public:
  explicit TargetRank(JobContext& job) : job_(job), o_(job.opt), topo_(job.topo), codec_(job.plan.slot_shape) {}

  void run() {
    const std::shared_ptr<const DatasetMix> dataset = job_.dataset;  // opened and checked by validate_inputs
    model_ = make_target_model(job_.plan.target, o_.target_dir, job_.ctx, job_.plan.capture_layers, o_.token_budget);
    DataPlaneSpec ps = data_plane_spec(job_);
    ps.num_send_buffers = kTargetSendBuffers;
    TargetEndpoint endpoint(job_, make_data_plane(ps));
    endpoint_ = &endpoint;
    for (int b = 0; b < kTargetSendBuffers; ++b) {
      forward_timing_[b][0] = Event(job_.ctx, /*timing=*/true);
      forward_timing_[b][1] = Event(job_.ctx, /*timing=*/true);
    }

    LoaderOptions lo = job_.plan.loader;
    const int target_index = topo_.target_index_of(topo_.world_rank);
    lo.shard_index = target_index;
    lo.num_shards = static_cast<int>(topo_.targets.size());
    lo.consumed = job_.plan.resume.consumed;  // epochs an earlier split began (a resume on another split)
    wait_all_loaded(job_);
    // Resuming: the loader restarts where the checkpoint says; batches trained on after that are dropped.
    const DataResumePoint& resume = job_.plan.resume.data.points.at(static_cast<size_t>(target_index));
    Loader loader(dataset, lo, resume.position);
    end_index_ = resume.position.batches;
    const auto& nt = topo_.node_targets;
    const int my_node_index = topo_.node_target_index_of(topo_.world_rank);

    // --eval-data: this target's eval forwards go out first (the loader prefetches meanwhile), then every
    // rank waits until every drafter holds its share: training starts together.
    report_.rank = topo_.world_rank;  // the headers name their sender
    if (job_.eval) send_eval_batches();
    wait_eval_features(job_, [&] { endpoint.pump(); });
    report_ = TargetReport{};  // the eval forwards are not training work
    report_.rank = topo_.world_rank;
    TestTrace trace(o_.inject_trace_dir, topo_.world_rank, job_.plan.resume.step);
    LoadedBatch lb;
    while (!endpoint.stopped()) {
      // 1. the next packed batch from the loader thread
      auto t0 = mpi::Clock::now();
      PopResult got = PopResult::Timeout;
      while (!endpoint.stopped() && (got = loader.pop(lb, std::chrono::milliseconds(2))) == PopResult::Timeout) endpoint.pump();
      report_.data_wait_s += mpi::seconds_since(t0);
      if (endpoint.stopped() || got == PopResult::EndOfData) break;
      end_index_ = lb.index + 1;
      if (resume.already_trained(lb.index)) continue;
      // 2. a free send buffer (its previous batch fully sent)
      const int buf = next_send_buffer("sending a batch");
      // 3. forward into the buffer (the wire layout: features [k, T, H], final_norm [T, H]). On a GPU it is
      //    only enqueued: the plane's send waits for it by an event, the host goes on to the credits.
      HsBatch& b = forward_into(buf, lb.batch);
      // 4. a credit: a free slot of some drafter of this node
      // --batch-order fixed: only the drafter the rule names may take this batch.
      int fixed_to = -1;
      if (o_.batch_order == BatchOrder::Fixed)
        fixed_to = topo_.node_drafters[FixedBatchOrder::drafter_of(static_cast<int>(nt.size()), static_cast<int>(topo_.node_drafters.size()),
                                                                   my_node_index, lb.index)];
      t0 = mpi::Clock::now();
      const std::optional<Credit> c = endpoint.take_credit(fixed_to);
      report_.credit_wait_s += mpi::seconds_since(t0);
      if (!c) break;  // the drafters have their steps; this batch is not needed
      report_.batches++;
      report_.tokens += lb.batch.num_tokens();
      report_.q_pre = loader.queue_depth();
      report_.epoch_progress = lb.epoch_progress;
      report_.time_s = job_.elapsed();
      report_.gpu = sample_gpu(job_, 1.0);
      b.header.batch_index = lb.index;
      b.header.kind = BatchKind::Train;
      b.header.next_position = lb.next;
      b.header.report = report_;
      endpoint.send(buf, job_.ctx, *c);
      trace.sent(topo_.world_rank, lb.index, lb.epoch, lb.records);
      // Test hook: fail with this batch mid-transfer (posted, not yet delivered), the worst moment.
      maybe_inject_failure(job_, report_.batches - 1);
    }
    loader.stop();
    // End-of-data to every drafter of the node (with the count it should have), then wait for their Fin.
    wait_all_sent("sending the last batches");
    endpoint.finish(end_index_);
    endpoint_ = nullptr;
  }

 private:
  // The next send buffer, once its previous batch is fully sent (that wait counts as send_wait_s).
  int next_send_buffer(const char* what) {
    const int buf = endpoint_->next_buffer();
    const auto t0 = mpi::Clock::now();
    endpoint_->wait_sent(buf, what);
    report_.send_wait_s += mpi::seconds_since(t0);
    forward_finished(buf);
    return buf;
  }

  void wait_all_sent(const char* what) {
    for (int buf = 0; buf < endpoint_->num_send_buffers(); ++buf) {
      endpoint_->wait_sent(buf, what);
      forward_finished(buf);
    }
  }

  // Enqueues the forward of `batch` into send buffer `buf` (header sizes filled; the caller completes it).
  HsBatch& forward_into(int buf, const PackedBatch& batch) {
    HsBatch& b = endpoint_->send_buffer(buf);
    b.fill_from(batch);
    forward_timing_[buf][0].record(job_.ctx);
    CaptureOut out;
    const HsValues into = codec_.forward_into(b);
    out.features = into.features;
    out.final_norm = into.final_norm;
    model_->forward(b.batch, out);
    codec_.encode(job_.ctx, b);  // --hs-dtype fp8: quantized into the send buffer, on the forward's stream
    if (o_.inject_delay_target_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.inject_delay_target_ms));
    forward_timing_[buf][1].record(job_.ctx);
    forward_pending_[buf] = true;
    return b;
  }

  // --eval-data: forwards the eval batches Topology::eval_routes gives this target, in batch order, each
  // sent to its drafter against a credit of that drafter (DrafterEndpoint::receive_eval grants one per
  // batch, in batch order, so the oldest credit of that drafter is this batch's). Same wire layout as a
  // training batch; the header says Eval and carries the eval batch index.
  void send_eval_batches() {
    const EvalSet& eval = *job_.eval;
    for (const EvalRoute& r : topo_.eval_routes(static_cast<int64_t>(eval.batches.size()))) {
      if (r.target != topo_.world_rank) continue;
      const int buf = next_send_buffer("sending a batch");
      HsBatch& b = forward_into(buf, eval.batches[static_cast<size_t>(r.batch)]);
      const Credit c = *endpoint_->take_credit(r.drafter, r.batch);
      b.header.batch_index = r.batch;
      b.header.kind = BatchKind::Eval;
      b.header.next_position = DataPosition{};
      b.header.report = report_;
      endpoint_->send(buf, job_.ctx, c);
    }
    wait_all_sent("sending eval batches");
  }

  // The forward that filled send buffer `buf` has finished (its send completed, and the send waits for it):
  // its time counts as compute (GPU time on CUDA, measured by events), and what its kernels flagged
  // (a token id outside the vocabulary) is reported now.
  void forward_finished(int buf) {
    if (!forward_pending_[buf]) return;
    forward_pending_[buf] = false;
    // A forward whose batch was never sent (the drafters stopped the run meanwhile) may still be running:
    // it is this rank's own work, so waiting for it cannot hang on a peer.
    if (!forward_timing_[buf][1].done()) synchronize(job_.ctx);
    report_.compute_s += Event::elapsed_ms(forward_timing_[buf][0], forward_timing_[buf][1]) / 1000.0;
    check_device_errors(job_.ctx);
  }

  JobContext& job_;
  const Options& o_;
  const Topology& topo_;
  HsCodec codec_;  // where the forward writes (the fp8 wire's staging, or the send buffer itself)
  std::unique_ptr<TargetModel> model_;
  TargetEndpoint* endpoint_ = nullptr;
  Event forward_timing_[kTargetSendBuffers][2];  // begin, end of the forward that filled each send buffer
  bool forward_pending_[kTargetSendBuffers] = {false, false};
  TargetReport report_;
  int64_t end_index_ = 0;  // loader batch index after the last batch popped (EndOfData, --batch-order fixed)
};

}  // namespace

void run_target(JobContext& job) { TargetRank(job).run(); }

}  // namespace dflash
