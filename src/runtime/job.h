// Pieces the roles share (private to src/runtime).
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dflash/checkpoint.h"  // OptionMap
#include "dflash/data_mix.h"
#include "dflash/data_plane.h"
#include "dflash/eval_prompts.h"
#include "dflash/eval_set.h"
#include "dflash/flow_control.h"
#include "dflash/grad_reducer.h"
#include "dflash/mpi_typed.h"
#include "dflash/nvml.h"
#include "dflash/options.h"
#include "dflash/target.h"
#include "dflash/topology.h"
#include "run_plan.h"

namespace dflash {

// One row of the startup table (every rank's, allgathered).
struct RankCard {
  int32_t rank = 0;
  int32_t role = 0;  // Role
  int32_t gpu = -1;
  int32_t pid = 0;
  char host[64] = {0};
  GpuReading startup_gpu;   // this rank's GPU before any model loaded (valid = 0 without NVML)
  char gpu_note[96] = {0};  // why there is no reading ("CPU backend: no NVML", ...)
};

// The handles the inputs' check opened on this rank (validate_inputs): shared, read-only.
struct JobInputs {
  std::shared_ptr<const DatasetMix> dataset;  // targets: --data (one file or a mix), opened and checked
  std::shared_ptr<const EvalSet> eval;  // targets and drafters: --eval-data packed; null without it
  std::shared_ptr<const EvalPrompts> tau_prompts;  // drafters with --eval-tau-every: its prompts (drafter_tau.h)
};

class ColocatedMeet;  // colocated.h

// Send buffers of a target: the forward of batch n+1 overlaps the send of batch n.
constexpr int kTargetSendBuffers = 2;

// One segment's per-rank context: what was typed (opt), what the segment planned (plan, immutable), where
// this rank sits (topo), and the handles this rank holds. Nothing here is a decision of the run.
struct JobContext {
  JobContext(const Options& o, const RunPlan& p, const Topology& t, mpi::Clock::time_point started,
             std::vector<RankCard> rank_cards, JobInputs in)
      : opt(o), plan(p), topo(t), start(started), cards(std::move(rank_cards)), dataset(std::move(in.dataset)),
        eval(std::move(in.eval)), tau_prompts(std::move(in.tau_prompts)) {}
  const Options& opt;
  const RunPlan& plan;             // the segment's plan: configs, shapes, split, K, schedule, resume
  const Topology& topo;
  mpi::Clock::time_point start;
  std::vector<RankCard> cards;
  std::shared_ptr<const DatasetMix> dataset;
  std::shared_ptr<const EvalSet> eval;
  std::shared_ptr<const EvalPrompts> tau_prompts;
  Ctx ctx;                         // this rank's backend, chosen once at rank start (CPU, or its GPU's stream)
  // The role this context serves: the rank's, or on a colocated rank the thread's (Target or Drafter: each
  // has a context of its own, role_colocated.cpp; on CUDA the target's computes on a second stream).
  Role thread_role = Role::Idle;
  DataPlaneKind data_plane = DataPlaneKind::Host;  // agreed by every rank (setup_data_plane)
  std::shared_ptr<NcclPairs> nccl_pairs;           // the nccl plane's pair communicators
  std::shared_ptr<LocalSlots> local_slots;         // colocated: the batches its target and drafter share
  std::shared_ptr<ColocatedMeet> colocated_meet;   // colocated: where its two threads meet (colocated.h)
  GradReduceKind grad_reduce = GradReduceKind::HostMpi;  // drafters only
  PowerSampler* gpu_sampler = nullptr;  // this rank's GPU through NVML (run_job owns it)
  // How the drafters end this segment (they decide; the others learn it at the end of the run): code
  // ExitCode::Requeue after a stop signal's checkpoint, or kResplitCode with the split --rebalance auto chose.
  SegmentEnd outcome;
  // The run goes on after this segment (a requeue, or a new split in place): no final evaluation,
  // checkpoint or export.
  bool run_goes_on() const { return outcome.code != 0; }
  // What this rank tells the end of the run (shutdown.cpp): 0, ExitCode::Requeue or kResplitCode.
  int32_t own_end_code() const { return outcome.code; }
  double elapsed() const { return mpi::seconds_since(start); }
};

// This rank's GPU now (valid = 0 without NVML); a reading younger than max_age_s is reused (targets
// sample once per batch, at most this often).
inline GpuReading sample_gpu(const JobContext& job, double max_age_s = 0) {
  if (!job.gpu_sampler) return GpuReading{};
  return max_age_s > 0 ? job.gpu_sampler->sample_at_most_every(max_age_s) : job.gpu_sampler->sample();
}

// A drafter's own counters, cumulative since its start (gathered to the metrics writer).
struct DrafterReport {
  int32_t rank = -1;
  int32_t q_hs = 0;          // slots holding a batch not yet trained on
  int64_t batches = 0;       // batches trained on
  int64_t tokens = 0;
  double data_wait_s = 0;    // waiting for a batch (starved by the targets)
  double compute_s = 0;      // forward + backward
  double allreduce_s = 0;    // lockstep agreement + gradient allreduce (includes waiting for slower drafters)
  double optimizer_s = 0;
  double eval_s = 0;         // evaluating --eval-data (and decoding --eval-tau-every's prompts)
  double time_s = 0;
  GpuReading gpu;            // this rank's GPU when the report was made (valid = 0 without NVML)
};

// What a role's data plane is made of: the job's plane kind, its communicators, the world, the rank's
// context and the batch shape (the role adds its slots or send buffers).
inline DataPlaneSpec data_plane_spec(const JobContext& job) {
  DataPlaneSpec ps;
  ps.kind = job.data_plane;
  ps.nccl = job.nccl_pairs.get();
  ps.local = job.local_slots;
  ps.comm = MPI_COMM_WORLD;
  ps.ctx = job.ctx;
  ps.shape = job.plan.slot_shape;
  return ps;
}

// Test hook: this rank fails at `step` when it is the --inject-fail-rank.
void maybe_inject_failure(const JobContext& job, int64_t step);

void run_target(JobContext& job);
void run_drafter(JobContext& job);
void run_colocated(JobContext& job);  // role_colocated.cpp: both, a thread each

// After loading: every rank waits here until all have loaded (a long deadline: loading is slow). On a
// colocated rank its drafter thread passes the barrier for the process, once its target thread arrived.
void wait_all_loaded(const JobContext& job);
// --eval-data: every rank (idle ones too) waits here until the targets have sent every eval batch and the
// drafters hold their shares, so training starts together (a deadline like loading's: the forwards of the
// whole eval set come first). poll keeps the caller's messages moving. No-op without --eval-data.
void wait_eval_features(const JobContext& job, const std::function<void()>& poll = {});

// The end of the job (shutdown.cpp), on every rank once its role is done: the job's exit code (0, or 75
// after a stop signal). Working ranks not done within 10 x --peer-timeout: fatal LostPeer naming them;
// an idle rank that does not answer within --peer-timeout: a warning naming it, and every rank ends with
// the run's code through MPI_Abort (never returns).
int end_of_run(const JobContext& job);
// end_of_run's code when the drafters chose another split (--rebalance auto): not an exit code; every rank
// then takes its role on the new split in place (run_job). Above every exit code, so the shutdown's max
// carries it.
constexpr int32_t kResplitCode = 1000;

// Every input this rank reads, checked before anything is written (job_inputs.cpp): the paths, the
// job's model plan (the target's config.json, --drafter or --draft-layers against the target), and on
// target ranks the dataset: its format, records against --token-budget / --long-record, and that it has
// something to train on. Fatal (BadInput/BadOptions) on the first defect; run_job makes every rank wait
// for every other's checks before --out is touched, so a bad input never costs an earlier run's files.
// Returns the model plan (planned: --topology auto's, else plan_job's) and the handles it opened.
struct CheckedInputs {
  ModelPlan model;
  JobInputs handles;
};
CheckedInputs validate_inputs(const Options& o, const Topology& topo, const std::vector<RankCard>& cards,
                              std::optional<ModelPlan> planned);

// The input checks the dry run repeats (job_inputs.cpp), so a job queued for hours does not die of them in a
// second: records longer than --token-budget under --long-record error (or none left under skip), with
// `length(r)` the length of record r of `records`; --draft-layers against the target's depth (print_note:
// say where the default layer ids repeat a layer).
void check_record_lengths(const Options& o, const std::string& path, const std::function<int64_t(size_t)>& length,
                          size_t records);
void check_draft_layers(const Options& o, const ModelPlan& plan, bool print_note);

// The segment's plan (segment_plan.cpp), in three collective steps around the run directory's lock and
// log: the resolved record with what the segment resolved (K; the split and checkpoint of a re-split),
// where it resumes from (the inputs' identities shared, --resume resolved), then the rest (the checkpoint
// read and checked, where the data resumes, the lr schedule, the eval cadence).
std::vector<std::pair<std::string, std::string>> segment_record(const Options& o, const SegmentStart& seg, int grad_accum);
ResumeFrom find_resume(const Options& o, const SegmentStart& seg, const Topology& topo, const JobInputs& in,
                       const std::vector<std::pair<std::string, std::string>>& resolved);
RunPlan plan_segment(const Options& o, const SegmentStart& seg, const Topology& topo, const JobInputs& in,
                     ModelPlan model, int grad_accum, std::vector<std::pair<std::string, std::string>> resolved,
                     ResumeFrom resume);

// World rank 0: an exclusive lock on --out (and on --checkpoint-dir when it lies outside --out) held
// until the process ends; fatal BadOptions naming the holder (pid, host, since when) when another job
// has it. Creates the directories.
void lock_run_dirs(const Options& o);

// Every rank, before it writes: --out (and an explicit --checkpoint-dir) made and held open by descriptor for
// the process's life; every later write under them is resolved from it (include/dflash/safe_dir.h).
void hold_run_dirs(const Options& o);

// What a run writes that a full disk would cost: the final export, one checkpoint, and how many
// checkpoints exist at once (1 without periodic checkpoints: a stop signal still writes one); with
// --eval-data, OUT/drafter-best too (two exports while a better one replaces it: drafter_best.h).
struct DiskNeed {
  double export_bytes = 0, checkpoint_bytes = 0, best_bytes = 0;
  double metrics_reserve_bytes = 0;  // OUT/.metrics.h5.reserve, at least (include/dflash/metrics.h)
  int checkpoints_kept = 1;
};
DiskNeed disk_need(size_t drafter_params, const Options& o);
// World rank 0, after lock_run_dirs: fatal SystemFailure when the filesystem of --out cannot hold the
// final export and metrics.h5's reserve (and one checkpoint when they share it), or that of
// --checkpoint-dir one checkpoint; a warning when all the checkpoints --keep-checkpoints keeps may not fit.
void check_disk_space(const Options& o, const DiskNeed& need);

}  // namespace dflash
