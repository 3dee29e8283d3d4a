// Target rank: loader thread -> frozen target forward -> send against a credit (docs/pipeline.md).
#include <unistd.h>

#include <algorithm>
#include <map>
#include <thread>

#include "dflash/checkpoint.h"
#include "dflash/data.h"
#include "dflash/error.h"
#include "dflash/hf_config.h"
#include "dflash/target.h"
#include "job.h"

namespace dflash {
namespace {

std::string ranks_str(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

// A record longer than --token-budget: refused (Error), cut or skipped; and skipping everything is refused.
void check_records_fit(const Options& o, const TokenDataset& ds) {
  size_t longest = 0, fitting = 0;
  for (size_t r = 0; r < ds.num_records(); ++r) {
    if (ds.record_length(r) > ds.record_length(longest)) longest = r;
    if (ds.record_length(r) <= o.token_budget) ++fitting;
  }
  const int64_t len = ds.record_length(longest);
  DF_CHECK_HINT(o.long_record != LongRecordPolicy::Error || len <= o.token_budget, BadOptions,
                "--token-budget " << o.token_budget << " is smaller than record " << longest << " of " << ds.path()
                                  << " (" << len << " tokens), and --long-record is error",
                "raise --token-budget to at least " + std::to_string(len) + ", or pass --long-record cut (keep the first " +
                    std::to_string(o.token_budget) + " tokens) or --long-record skip (drop such records)");
  DF_CHECK_HINT(o.long_record != LongRecordPolicy::Skip || fitting > 0, BadOptions,
                "--long-record skip drops every record of " << ds.path() << ": all are longer than --token-budget "
                                                            << o.token_budget,
                "raise --token-budget");
}

class TargetRank {
 public:
  explicit TargetRank(JobContext& job) : job_(job), o_(job.opt), topo_(job.topo) {}

  void run() {
    const Qwen3Config cfg = load_qwen3_config(o_.target_dir + "/config.json");
    auto dataset = std::make_shared<TokenDataset>(o_.data_path, cfg.vocab_size);
    check_records_fit(o_, *dataset);
    const std::vector<int> layers = capture_layer_ids(o_);
    auto model = make_target_model(load_target_config(o_.target_dir), o_.target_dir, cpu_ctx(), layers, o_.token_budget);
    SlotShape shape{o_.token_budget, static_cast<int64_t>(layers.size()), cfg.hidden_size, o_.train.loss == LossKind::KL};
    plane_ = make_host_mpi_data_plane(MPI_COMM_WORLD, shape, 0, 2);
    for (int d : topo_.node_drafters) last_credit_[d] = mpi::Clock::now();

    LoaderOptions lo;
    lo.token_budget = o_.token_budget;
    lo.prefetch_depth = o_.prefetch_depth;
    lo.max_epochs = o_.epochs;
    lo.seed = o_.train.seed;
    lo.long_record = o_.long_record == LongRecordPolicy::Skip ? LongRecord::Skip : LongRecord::Cut;
    lo.shard_index = topo_.role_index;
    lo.num_shards = topo_.role_count;
    wait_all_loaded(job_);
    // Resuming: the loader restarts where the checkpoint says; batches trained on after that are dropped.
    const DataResumePoint resume = target_resume_point(job_.resume_dir, topo_.role_index, topo_.role_count, o_.train.seed);
    Loader loader(dataset, lo, resume.position);
    end_index_ = resume.position.batches;
    const auto& nt = topo_.node_targets;
    const int my_node_index = static_cast<int>(std::find(nt.begin(), nt.end(), topo_.world_rank) - nt.begin());
    control_req_ = mpi::irecv(&control_in_, 1, MPI_ANY_SOURCE, kTagToTarget, MPI_COMM_WORLD);

    report_.rank = topo_.world_rank;
    int next_buf = 0;
    LoadedBatch lb;
    while (!stop_) {
      // 1. the next packed batch from the loader thread
      auto t0 = mpi::Clock::now();
      PopResult got = PopResult::Timeout;
      while (!stop_ && (got = loader.pop(lb, std::chrono::milliseconds(2))) == PopResult::Timeout) pump();
      report_.data_wait_s += mpi::seconds_since(t0);
      if (stop_ || got == PopResult::EndOfData) break;
      end_index_ = lb.index + 1;
      if (resume.already_trained(lb.index)) continue;
      // 2. a free send buffer (its previous batch fully sent)
      const int buf = next_buf;
      next_buf = (next_buf + 1) % plane_->num_send_buffers();
      t0 = mpi::Clock::now();
      wait_until([&] { return plane_->send_done(buf); },
                 [&] { return "sending a batch to drafter rank " + std::to_string(buf_dest_[buf]) + " did not complete"; });
      report_.send_wait_s += mpi::seconds_since(t0);
      // 3. forward into the buffer (the wire layout: features [k, T, H], final_norm [T, H])
      t0 = mpi::Clock::now();
      forward_into(*model, lb, plane_->send_buffers(buf));
      if (o_.inject_delay_target_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.inject_delay_target_ms));
      report_.compute_s += mpi::seconds_since(t0);
      maybe_inject_failure(job_, report_.batches);
      // 4. a credit: a free slot of some drafter of this node
      // --batch-order fixed: only the drafter the rule names may take this batch.
      int fixed_to = -1;
      if (o_.batch_order == BatchOrder::Fixed)
        fixed_to = topo_.node_drafters[FixedBatchOrder::drafter_of(static_cast<int>(nt.size()), static_cast<int>(topo_.node_drafters.size()),
                                                                   my_node_index, lb.index)];
      t0 = mpi::Clock::now();
      wait_until([&] { return stop_ || (fixed_to >= 0 ? wallet_.held_from(fixed_to) > 0 : !wallet_.empty()); }, [&] {
        std::vector<int> silent;  // drafters that granted nothing within the deadline
        for (int d : topo_.node_drafters)
          if (mpi::seconds_since(last_credit_[d]) > o_.peer_timeout_s) silent.push_back(d);
        return "lost peer: no credit from drafter rank(s) " + ranks_str(silent.empty() ? topo_.node_drafters : silent) +
               " (they stopped consuming batches)";
      }, 1.5 * o_.peer_timeout_s);  // the drafters know which of them is silent: they get the first word
      report_.credit_wait_s += mpi::seconds_since(t0);
      if (stop_) break;  // the drafters have their steps; this batch is not needed
      // A credit unused for a quarter of the deadline goes first, whoever granted it.
      const Credit c = fixed_to >= 0 ? wallet_.take_from(fixed_to) : wallet_.take(job_.elapsed(), o_.peer_timeout_s / 4);
      WireBuffers& b = plane_->send_buffers(buf);
      report_.batches++;
      report_.tokens += lb.batch.num_tokens();
      report_.q_pre = loader.queue_depth();
      report_.epoch_progress = lb.epoch_progress;
      report_.time_s = job_.elapsed();
      report_.gpu = sample_gpu(job_, 1.0);
      b.header.batch_index = lb.index;
      b.header.next_position = lb.next;
      b.header.report = report_;
      b.header.seq = sent_to_[c.drafter];
      plane_->post_send(buf, c.drafter, c.slot);
      buf_dest_[buf] = c.drafter;
      sent_to_[c.drafter]++;
    }
    loader.stop();
    finish();
  }

 private:
  void forward_into(TargetModel& model, const LoadedBatch& lb, WireBuffers& b) {
    const PackedBatch& pb = lb.batch;
    const int64_t T = pb.num_tokens();
    const int64_t k = b.shape.num_layers, H = b.shape.hidden;
    DF_ASSERT(T > 0 && T <= b.shape.max_tokens);
    std::copy(pb.tokens.begin(), pb.tokens.end(), b.tokens.begin());
    std::copy(pb.cu_seqlens.begin(), pb.cu_seqlens.end(), b.cu_seqlens.begin());
    std::copy(pb.loss_mask.begin(), pb.loss_mask.end(), b.loss_mask.begin());
    CaptureOut out;
    out.features = Tensor(b.features.data(), DType::F32, Device::CPU, {k, T, H});
    if (b.shape.final_norm) out.final_norm = Tensor(b.final_norm.data(), DType::F32, Device::CPU, {T, H});
    model.forward(pb, out);
    BatchHeader& h = b.header;
    h.num_tokens = T;
    h.num_seqs = pb.num_seqs();
    h.num_layers = k;
    h.hidden = H;
    h.has_final_norm = b.shape.final_norm ? 1 : 0;
  }

  // Handles every control message that has arrived (credits, stop, fin).
  void pump() {
    MPI_Status st;
    while (control_req_ != MPI_REQUEST_NULL && mpi::test(control_req_, &st)) {
      const int from = st.MPI_SOURCE;
      switch (control_in_.kind) {
        case ControlKind::Credit:
          if (!finishing_) wallet_.add(Credit{from, control_in_.slot, job_.elapsed()});
          last_credit_[from] = mpi::Clock::now();
          break;
        case ControlKind::Stop: stop_ = true; break;
        case ControlKind::Fin: fins_++; break;
        default: DF_FAIL(Internal, "target got control message " << static_cast<int>(control_in_.kind) << " from rank " << from, "");
      }
      control_req_ = mpi::irecv(&control_in_, 1, MPI_ANY_SOURCE, kTagToTarget, MPI_COMM_WORLD);
    }
  }

  template <class Done, class Why> void wait_until(Done done, Why why, double timeout_s = 0) {
    mpi::Deadline deadline(timeout_s > 0 ? timeout_s : o_.peer_timeout_s);
    mpi::Backoff backoff;
    for (;;) {
      pump();
      if (done()) return;
      if (deadline.expired())
        fatal(ExitCode::LostPeer, why() + " (waited " + std::to_string(static_cast<int>(deadline.elapsed())) + " s)",
              "a drafter rank died or hangs; see its own error above, or raise --peer-timeout if it is just slow");
      backoff.idle();
    }
  }

  // End-of-data to every drafter of the node (with the count it should have), then wait for their Fin.
  void finish() {
    finishing_ = true;
    for (int buf = 0; buf < plane_->num_send_buffers(); ++buf)
      wait_until([&] { return plane_->send_done(buf); },
                 [&] { return "sending the last batches to drafter rank " + std::to_string(buf_dest_[buf]) + " did not complete"; });
    std::vector<ControlMsg> eod(topo_.node_drafters.size());
    std::vector<MPI_Request> reqs(eod.size());
    for (size_t i = 0; i < eod.size(); ++i) {
      const int d = topo_.node_drafters[i];
      eod[i] = ControlMsg{ControlKind::EndOfData, -1, sent_to_[d], end_index_};
      reqs[i] = mpi::isend(&eod[i], 1, d, kTagToDrafter, MPI_COMM_WORLD);
    }
    const int want = static_cast<int>(topo_.node_drafters.size());
    wait_until([&] {
      bool sent = true;
      for (auto& r : reqs) sent = mpi::test(r) && sent;
      return sent && fins_ == want;
    }, [&] { return "drafter rank(s) " + ranks_str(topo_.node_drafters) + " did not acknowledge end-of-data"; });
    mpi::cancel(control_req_);
  }

  JobContext& job_;
  const Options& o_;
  const Topology& topo_;
  std::unique_ptr<DataPlane> plane_;
  CreditWallet wallet_;
  ControlMsg control_in_;
  MPI_Request control_req_ = MPI_REQUEST_NULL;
  std::map<int, int64_t> sent_to_;
  std::map<int, mpi::Clock::time_point> last_credit_;
  int buf_dest_[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  TargetReport report_;
  int64_t end_index_ = 0;  // loader batch index after the last batch popped (EndOfData, --batch-order fixed)
  bool stop_ = false, finishing_ = false;
  int fins_ = 0;
};

}  // namespace

void run_target(JobContext& job) { TargetRank(job).run(); }

}  // namespace dflash
