// The drafters' side of checkpointing: their agreement on when to save or stop, gathering every drafter's
// trained batches and RNG state to the first drafter, which writes the checkpoint on a helper thread while
// its main thread keeps MPI moving.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "dflash/checkpoint.h"
#include "dflash/drafter_model.h"
#include "dflash/error.h"
#include "dflash/mpi_typed.h"

namespace dflash {
namespace {

// Variable-length gather of trivially copyable items to rank 0 of comm, driving progress() while waiting.
template <class T>
std::vector<T> gather_to_first(const std::vector<T>& mine, MPI_Comm comm, int rank, int size, double timeout_s,
                               const std::function<void()>& progress, const char* what) {
  static_assert(std::is_trivially_copyable<T>::value, "gathered items travel as bytes");
  auto why = [what] { return std::string("drafters did not complete the checkpoint's gather of ") + what + " (one is lost)"; };
  std::vector<int64_t> counts(rank == 0 ? size : 1);
  int64_t n = static_cast<int64_t>(mine.size());
  MPI_Request r = mpi::igather(&n, 1, counts.data(), 0, comm);
  mpi::wait(r, timeout_s, why, progress);
  std::vector<int> byte_counts(size, 0), displs(size, 0);
  std::vector<T> all;
  if (rank == 0) {
    int64_t total = 0;
    for (int i = 0; i < size; ++i) {
      byte_counts[i] = mpi::count_of<char>(static_cast<size_t>(counts[i]) * sizeof(T));
      displs[i] = mpi::count_of<char>(static_cast<size_t>(total) * sizeof(T));
      total += counts[i];
    }
    all.resize(static_cast<size_t>(total));
  }
  DF_MPI(MPI_Igatherv(mine.data(), mpi::count_of<char>(mine.size() * sizeof(T)), MPI_BYTE, all.data(),
                      byte_counts.data(), displs.data(), MPI_BYTE, 0, comm, &r));
  mpi::wait(r, timeout_s, why, progress);
  return all;
}

// A fresh run's lineage id: 16 hex digits, different for every start (its checkpoints carry it; a run
// prunes only its own).
std::string new_run_id() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                     static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^
                     (static_cast<uint64_t>(::getpid()) << 16);
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(r));
  return buf;
}

// The trainer's state staged in host memory (a download on CUDA; the live buffers on the CPU).
CheckpointTensors trainer_tensors(DrafterTrainer& trainer) {
  return CheckpointTensors{trainer.master_weights(), trainer.adam_m(), trainer.adam_v()};
}

}  // namespace

DrafterCheckpointer::DrafterCheckpointer(CheckpointerConfig config, MPI_Comm drafter_comm, OptionMap invariants,
                                         const DataResume& data, std::string resume_dir, ResumeSplit split)
    : config_(std::move(config)), comm_(drafter_comm), dir_(config_.dir), resume_dir_(std::move(resume_dir)),
      invariants_(std::move(invariants)), timer_(config_.every), split_(split),
      points_(data.points), consumed_records_(data.consumed) {
  DF_MPI(MPI_Comm_rank(comm_, &rank_));
  DF_MPI(MPI_Comm_size(comm_, &size_));
  DF_CHECK_HINT(config_.keep >= 1, BadOptions, "bad value " << config_.keep << " for --keep-checkpoints",
                "--keep-checkpoints must be >= 1");
  run_id_ = new_run_id();  // replaced by the checkpoint's when resuming
}

int64_t DrafterCheckpointer::restore(DrafterTrainer& trainer) {
  if (resume_dir_.empty()) return 0;
  CheckpointState st = read_checkpoint_state(resume_dir_);
  (void)check_resume_compatible(st.options, invariants_, resume_dir_, split_);  // its notes: plan_segment prints them
  DF_CHECK_HINT(split_ == ResumeSplit::Changed || st.rng_states.size() == static_cast<size_t>(size_), BadInput,
                resume_dir_ << " was written by " << st.rng_states.size() << " drafters, this job has " << size_,
                "the checkpoint is damaged: its options name this split");
  DF_CHECK_HINT(!st.rng_states.empty(), BadInput, resume_dir_ << " holds no drafter's RNG state", "the checkpoint is damaged: resume from an older one");
  load_checkpoint_tensors(resume_dir_, trainer_tensors(trainer));
  trainer.state_loaded();  // the staged tensors become the trainer's state (uploaded on CUDA)
  trainer.set_step(st.step);
  // On another split every drafter holds the same weights and optimizer state; the RNG streams go on
  // round-robin (a fresh run's drafters all start from --seed's stream too).
  trainer.set_rng_state(st.rng_states[static_cast<size_t>(rank_) % st.rng_states.size()]);
  // points_: the job's (data_resume: the checkpoint's, or re-partitioned for this split).
  run_id_ = st.run_id;  // the resumed run continues its lineage (and may prune its earlier checkpoints)
  timer_.saved();
  saved_step_ = st.step;
  return st.step;
}

void DrafterCheckpointer::step_begins(const DrafterTrainer& trainer) {
  DF_ASSERT(pending_.empty());
  // With one micro-batch per step the step's batch is applied before anything can cut it short, so the
  // RNG state at a cut is the step's own (the text state is tens of KB: not copied every step for nothing).
  if (config_.grad_accum > 1) step_rng_ = trainer.rng_state();
}

void DrafterCheckpointer::trained_on(int target_index, int64_t batch_index, const DataPosition& next) {
  pending_.push_back(ConsumedBatch{target_index, batch_index, next});
}

void DrafterCheckpointer::step_applied() {
  consumed_.insert(consumed_.end(), pending_.begin(), pending_.end());
  pending_.clear();
}

DrafterCheckpointer::Next DrafterCheckpointer::after_step(int64_t step, DrafterTrainer& trainer,
                                                          const nlohmann::json& schedule,
                                                          const std::function<void()>& progress) {
  int32_t decision = kStepContinue;
  if (stop_signal_received() != 0 || peer_stop_signal() != 0 || step == config_.inject_stop_step) decision |= kStepStop;
  if (timer_.due(step)) decision |= kStepCheckpoint;
  if (size_ > 1) {
    MPI_Request r = mpi::iallreduce(&decision, 1, MPI_BOR, comm_);
    mpi::wait(r, config_.peer_timeout_s, [] { return std::string("drafters did not agree on checkpointing (one is lost)"); },
              progress);
  }
  if (decision == kStepContinue) return Next::Continue;
  save(step, trainer, trainer.rng_state(), schedule, progress);
  if (!(decision & kStepStop)) return Next::Saved;
  if (rank_ == 0) {
    if (step == config_.inject_stop_step && !stop_signal_received() && !peer_stop_signal())
      std::printf("[dflash] test hook --inject-stop-step %lld: checkpointed at step %lld, exiting with code %d for a requeue\n",
                  static_cast<long long>(config_.inject_stop_step), static_cast<long long>(step), static_cast<int>(ExitCode::Requeue));
    else
      std::printf("[dflash] stop signal (%d) received: checkpointed at step %lld, exiting with code %d for a requeue\n",
                  stop_signal_received() ? stop_signal_received() : peer_stop_signal(), static_cast<long long>(step),
                  static_cast<int>(ExitCode::Requeue));
    std::fflush(stdout);
  }
  return Next::StopForRequeue;
}

void DrafterCheckpointer::save(int64_t step, DrafterTrainer& trainer, const std::string& rng,
                               const nlohmann::json& schedule, const std::function<void()>& progress) {
  DF_ASSERT(pending_.empty());  // a checkpoint holds applied steps only
  const auto t0 = mpi::Clock::now();
  if (before_save_) before_save_();
  std::vector<ConsumedBatch> consumed =
      gather_to_first(consumed_, comm_, rank_, size_, config_.peer_timeout_s, progress, "trained batches");
  consumed_.clear();
  std::vector<char> rng_bytes(rng.begin(), rng.end());
  std::vector<int64_t> rng_len = gather_to_first(std::vector<int64_t>{static_cast<int64_t>(rng.size())}, comm_, rank_,
                                                 size_, config_.peer_timeout_s, progress, "RNG sizes");
  std::vector<char> all_rng = gather_to_first(rng_bytes, comm_, rank_, size_, config_.peer_timeout_s, progress, "RNG states");

  if (rank_ == 0) {
    advance_resume_points(points_, consumed);
    CheckpointState st;
    st.step = step;
    st.schedule = schedule;
    st.data = points_;
    st.consumed = consumed_still_needed(consumed_records_, points_);
    st.options = invariants_;
    st.run_id = run_id_;
    size_t off = 0;
    for (int64_t len : rng_len) {
      st.rng_states.emplace_back(all_rng.data() + off, static_cast<size_t>(len));
      off += static_cast<size_t>(len);
    }
    CheckpointSaveOptions so;
    so.keep_last = config_.keep;
    // Staged here, on the thread that owns the trainer's device; the helper thread only reads host memory.
    const CheckpointTensors tensors = trainer_tensors(trainer);
    if (config_.export_drafter)
      so.also_write = [&](const std::string& step_dir) {
        export_drafter(step_dir + "/drafter", trainer.config(), tensors.master.ptr<float>(), config_.export_dtype);
      };
    // File I/O only on the helper thread (no MPI there); this thread keeps the targets' messages moving.
    std::atomic<bool> done{false};
    std::string written;
    std::thread writer([&] {
      written = save_checkpoint(dir_, st, tensors, so);
      done = true;
    });
    mpi::Backoff backoff(20000);
    while (!done) {
      progress();
      backoff.idle();
    }
    writer.join();
    std::printf("[dflash] checkpoint step %lld -> %s (%.1f s)\n", static_cast<long long>(step), written.c_str(),
                mpi::seconds_since(t0));
    std::fflush(stdout);
  }
  // Nobody goes on (or exits for a requeue) before the checkpoint is committed.
  MPI_Request r;
  DF_MPI(MPI_Ibarrier(comm_, &r));
  mpi::wait(r, 10 * config_.peer_timeout_s,
            [] { return std::string("the first drafter did not finish writing the checkpoint in time"); }, progress);
  timer_.saved();
  saved_step_ = step;
}

std::string DrafterCheckpointer::save_final(int64_t step, DrafterTrainer& trainer, const nlohmann::json& schedule,
                                            const std::function<void()>& progress) {
  if (step > 0 && step != saved_step_) save(step, trainer, trainer.rng_state(), schedule, progress);
  return step > 0 ? checkpoint_step_dir(dir_, step) : std::string();
}

std::string DrafterCheckpointer::save_before_exit(int64_t step, DrafterTrainer& trainer, const nlohmann::json& schedule,
                                                  const std::function<void()>& progress) {
  // The step cut short: its batches are not in the checkpoint, its RNG draws are undone.
  const bool cut = !pending_.empty();
  DF_ASSERT(!cut || config_.grad_accum > 1);
  if (cut) {
    std::printf("[dflash] drafter %d: step %lld was cut short after %zu of %d micro-batches: dropped, trained again on resume\n",
                rank_, static_cast<long long>(step + 1), pending_.size(), config_.grad_accum);
    std::fflush(stdout);
  }
  pending_.clear();
  const std::string rng = cut ? step_rng_ : trainer.rng_state();
  if (step > 0 && step != saved_step_) save(step, trainer, rng, schedule, progress);
  return step > 0 ? checkpoint_step_dir(dir_, step) : std::string();
}

}  // namespace dflash
