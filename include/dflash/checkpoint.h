// Checkpoints, resume and stop signals for multi-day runs (docs/checkpoint.md).
//
// On disk, one directory per checkpoint:
//   CHECKPOINT_DIR/step-00001200/state.safetensors   drafter fp32 master weights, AdamW m and v, every
//                                                     rank's RNG state (U8 bytes)
//   CHECKPOINT_DIR/step-00001200/drafter/            optional release-format export (--export-checkpoints)
//   CHECKPOINT_DIR/step-00001200/manifest.json       written LAST, atomically: the commit point
// The manifest holds the step, the schedule position, every target's data position, the resume-invariant
// options (and their hash), and the size and content hash of every tensor. A directory without a complete,
// parseable manifest whose files have the recorded sizes is never picked for a resume.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/data.h"     // DataPosition
#include "dflash/data_mix.h" // DatasetMix
#include "dflash/drafter.h"  // DrafterTrainer
#include "dflash/tensor.h"

namespace dflash {

// ---- when to save (--checkpoint-every) ------------------------------------------------------------

enum class CheckpointUnit : uint8_t { Off, Steps, Minutes };

struct CheckpointEvery {
  CheckpointUnit unit = CheckpointUnit::Off;
  int64_t steps = 0;     // Steps: every this many optimizer steps
  double minutes = 0;    // Minutes: this long after the start or the last save
  std::string to_string() const;  // "off", "500", "30m"
};
// "" or "0" = off, "N" = every N steps, "Nm" = every N minutes (N may be fractional for minutes).
// Fatal BadOptions naming --checkpoint-every on anything else.
CheckpointEvery parse_checkpoint_every(const std::string& text);

// A rank's local opinion of whether a checkpoint is due after `step`. Minute-based decisions differ
// between ranks by clock skew, so the drafters OR them (agree_step_decision) and all save at one step.
class CheckpointTimer {
 public:
  explicit CheckpointTimer(const CheckpointEvery& every);  // the minute clock starts now
  bool due(int64_t step) const;
  void saved();  // restarts the minute clock
  const CheckpointEvery& every() const { return every_; }

 private:
  CheckpointEvery every_;
  double last_save_s_;  // steady clock, seconds
};

// ---- options that must not change across a resume ---------------------------------------------

using OptionMap = std::map<std::string, std::string>;

// Options that may differ between a run and its resume: they change how the run is observed, paced or
// stored, never which numbers it computes (log/flush/checkpoint intervals, output and checkpoint
// paths, --resume itself, timeouts, queue depths, test hooks, export format), and --optimizer-state: it
// changes how the state is rounded between steps, not what a checkpoint holds (fp32 either way).
bool option_may_change_on_resume(const std::string& name);
// The resolved "name = value" options minus those that may change.
OptionMap resume_invariants(const std::vector<std::pair<std::string, std::string>>& resolved);
// 16 hex digits over the canonical (sorted) text of the map.
std::string options_hash(const OptionMap& invariants);
// Whether a resume keeps the checkpoint's split (--topology, the world size, the targets and drafters).
// Changed lets --topology, world-size and --grad-accum differ (docs/checkpoint.md "Changing the split").
enum class ResumeSplit { Same, Changed };
// The option keys a change of split may change.
bool option_follows_split(const std::string& name);
// --epochs and --max-steps: they may change on any resume (extending a run, or ending it sooner); the lr
// schedule's tail is then re-planned from the checkpoint's step (docs/checkpoint.md "Extending a run").
bool option_extends_run(const std::string& name);
// Fatal BadOptions listing every option that differs ("--loss: saved ce, now kl"), added or dropped; when only
// content identities differ (below), fatal BadInput naming the input and what changed. An identity that one
// side lacks (a checkpoint of a build before them) is not compared. --target or --data at another path is
// accepted when every content identity of that input is recorded on both sides and equal (a model staged on
// node-local scratch per job). Returns what the resume should say ("--target moved: /a -> /b, same content",
// an identity the checkpoint predates), one line each.
std::vector<std::string> check_resume_compatible(const OptionMap& saved, const OptionMap& now, const std::string& checkpoint,
                             ResumeSplit split = ResumeSplit::Same);

// ---- what the inputs were (src/checkpoint/input_identity.cpp) -------------------------------------

// The resume invariants also hold content identities of the inputs, under these keys: a dataset or target
// regenerated at the same path must not resume silently. Cheap fingerprints (sizes, headers, offsets,
// sampled content), "k=v k=v ..." text.
constexpr const char* kIdentityKeyPrefix = "content:";
constexpr const char* kDataIdentityKey = "content:data";
constexpr const char* kTargetIdentityKey = "content:target";
// The target's config.json (a key of its own: checkpoints written before it existed lack it, and keep
// resuming with the weights alone compared; the resume says so).
constexpr const char* kTargetConfigIdentityKey = "content:target-config";
// bytes, records, tokens, vocab_size, a hash of every record offset, a hash of 64 records spread over the file.
std::string dataset_identity(const TokenDataset& data);
// --data: one file's identity as above (a job on one file records what it recorded before mixing existed);
// a mix: datasets, slots, a hash of the slot table (which record of which file each slot is: the weights
// and --seed at work), the weights, and each file's fields prefixed "dI." (d0.bytes=.., d1.offsets=..).
std::string dataset_identity(const DatasetMix& data);
// Per shard: size, safetensors header, first and last MiB of tensor data.
std::string target_weights_identity(const std::string& target_dir);
// config.json without the fields no computation reads (transformers_version, _name_or_path): "fields=N" and
// a hash of each top-level field's parsed value ("rope_theta=..."), so formatting and key order do not count.
std::string target_config_identity(const std::string& target_dir);
// "bytes 1000 -> 2000, sampled_records differ" (the fields that differ).
std::string describe_identity_change(const std::string& saved, const std::string& now);

// ---- where each target's data resumes ------------------------------------------------------------

// Targets run ahead of the drafters (prefetch queue, batches in flight, several drafters taking from one
// target), so "the position after the last batch sent" would skip batches nobody trained on. Instead
// the drafters record every batch they trained on; per target, the resume point is the loader position
// after the longest run of consecutive batches trained on, plus the later ones already trained on
// (a resumed target drops those instead of sending them again). Every batch is trained on exactly once.
struct ConsumedBatch {  // trivially copyable: travels over MPI as is
  int32_t target = -1;   // target index (0 .. targets-1, = DataPosition::shard_index)
  int64_t index = -1;    // the target's loader batch index
  DataPosition next;     // loader position right after that batch
};
struct DataResumePoint {
  DataPosition position;                                      // the loader restarts here
  std::vector<std::pair<int64_t, DataPosition>> done_after;   // (index, position after) already trained on
  bool already_trained(int64_t index) const;
};
// Folds batches trained on (from every drafter, any order) into the per-target resume points. A batch
// trained on twice, or of an unknown target, is fatal Internal.
void advance_resume_points(std::vector<DataResumePoint>& points, const std::vector<ConsumedBatch>& consumed);

// Data resume points as JSON (the manifest's "data"): [{"position": "dflash-data-pos v1 ...",
// "done_after": [[index, "..."], ...]}]. Malformed: fatal BadInput naming `where`.
nlohmann::json data_points_to_json(const std::vector<DataResumePoint>& data);
std::vector<DataResumePoint> data_points_from_json(const nlohmann::json& a, const std::string& where);

// ---- where this job's targets start (src/checkpoint/data_resume.cpp) ---------------------------

// Every target's start, decided once for the job. A fresh start: the data's beginning. A resume on the
// checkpoint's number of targets: its points (and the epochs an earlier split began) as saved. A resume on
// another number ("a resplit", docs/checkpoint.md "Changing the split"): the records the checkpoint's
// targets consumed in the epochs they had begun -- every batch before each one's position, and the later
// batches listed as trained, found by replaying its loader's packing -- join those epochs' consumed sets,
// and this job's targets start at the first unfinished epoch, dealing out its other records. No record
// of an epoch is trained twice or skipped across the two splits.
struct DataResume {
  std::vector<DataResumePoint> points;  // one per target of this job
  ConsumedRecords consumed;             // epochs begun under an earlier split (empty when none)
  bool resplit = false;                 // the checkpoint had another number of targets
  int64_t first_epoch = 0;              // where the targets start (the lowest points[i].position.epoch)
  std::string summary;                  // a line for the log (resplit only)
};
DataResume fresh_data_resume(int num_targets, uint64_t seed);
// saved, saved_consumed: the checkpoint's; base: this job's loader options (seed, budget, policy, epochs).
// A saved point of another seed, or a listed batch the replay does not reach: fatal BadInput.
DataResume plan_data_resume(const RecordSource& ds, const LoaderOptions& base, int max_epochs,
                            const std::vector<DataResumePoint>& saved, const ConsumedRecords& saved_consumed,
                            int num_targets);
// The batches this job's targets will still send from d's points to the end of max_epochs (> 0), those listed
// as already trained left out: what the lr schedule's re-plan divides over the drafters.
int64_t data_batches_left(const RecordSource& ds, const LoaderOptions& base, int max_epochs, const DataResume& d);
// The epochs of `consumed` a save must keep: those at or after the lowest epoch any point is still in.
ConsumedRecords consumed_still_needed(const ConsumedRecords& consumed, const std::vector<DataResumePoint>& points);
// A DataResume as bytes and back (it travels from the first target to every rank).
std::string serialize_data_resume(const DataResume& d);
DataResume deserialize_data_resume(const std::string& bytes);

// ---- what a checkpoint holds ------------------------------------------------------------------

struct CheckpointState {
  int64_t step = 0;                                       // optimizer steps completed
  nlohmann::json schedule = nlohmann::json::object();     // epoch progress, tokens seen... (runtime's)
  std::vector<DataResumePoint> data;                      // one per target (target index order)
  ConsumedRecords consumed;                               // epochs begun under an earlier split (DataResume)
  std::vector<std::string> rng_states;                    // one per drafter (drafter index order); a
                                                          // target's whole RNG state is its data position
  OptionMap options;                                      // resume_invariants() at save time
  std::string run_id;  // the run's lineage: made at a fresh start, inherited by every resume ("" in
                       // checkpoints of builds before run ids). A run prunes only checkpoints of its own.
};

// Flat fp32 CPU views of the drafter's trainable state, all of one length n.
struct CheckpointTensors {
  Tensor master;  // [n] fp32 master weights
  Tensor adam_m;  // [n]
  Tensor adam_v;  // [n]
};

struct CheckpointSaveOptions {
  int keep_last = 3;  // complete checkpoints kept after this one is committed (>= 1)
  // Called with the step directory before the manifest is written (e.g. a release-format export into
  // STEP_DIR/drafter), so whatever it writes is part of the commit.
  std::function<void(const std::string& step_dir)> also_write;
};

// "CHECKPOINT_DIR/step-00001200".
std::string checkpoint_step_dir(const std::string& checkpoint_dir, int64_t step);

// Writes a checkpoint of `state` (creating checkpoint_dir if needed), commits it with the manifest,
// then deletes, among the checkpoints of state.run_id only, all but the newest keep_last complete ones
// and its interrupted saves older than this one; another run's checkpoints and damaged ones are never
// deleted. A complete checkpoint of this run already present for this step is kept as is (the state of
// a step is a pure function of the run); one of another run there is set aside (renamed). Returns the
// step directory. Filesystem failure: SystemFailure.
std::string save_checkpoint(const std::string& checkpoint_dir, const CheckpointState& state,
                            const CheckpointTensors& tensors, const CheckpointSaveOptions& opt);

// True when step_dir holds a committed checkpoint: manifest.json parses, says it is complete, and every
// file it lists has the recorded size. `why` (optional) says what is missing otherwise.
bool checkpoint_is_complete(const std::string& step_dir, std::string* why = nullptr);
// The newest complete checkpoint in checkpoint_dir ("" when there is none). Directories without a
// manifest (saves interrupted before their commit) are skipped with a note on stderr; a newer one whose
// manifest is there but damaged (not JSON, files missing or of other sizes) is a fatal BadInput.
std::string find_latest_checkpoint(const std::string& checkpoint_dir);

// --resume: "" = no resume; "auto" = the newest complete checkpoint in checkpoint_dir, or "" (start
// fresh) when there is none; otherwise a step directory, or a checkpoint directory (its newest complete
// one). An explicit path that is missing or incomplete, and a damaged newest checkpoint (see
// find_latest_checkpoint), are fatal BadInput. Prints what it chose.
std::string resolve_resume(const std::string& resume, const std::string& checkpoint_dir);

// Reads and validates step_dir's manifest. Fatal BadInput naming the file on any defect.
CheckpointState read_checkpoint_state(const std::string& step_dir);
// Copies the tensors into `into` (their lengths must match the checkpoint's: BadInput naming both) and
// verifies their content hashes (BadInput: corrupt checkpoint).
void load_checkpoint_tensors(const std::string& step_dir, const CheckpointTensors& into);

// Content hash used for tensors and options (not cryptographic: it catches corruption, not malice).
uint64_t content_hash64(const void* data, size_t nbytes);

// ---- stop signals -----------------------------------------------------------------------------

// SIGUSR1 and SIGTERM set a flag and nothing else (MPI and I/O are not async-signal-safe); the training
// loop polls it once per step. Idempotent.
void install_stop_signal_handlers();
int stop_signal_received();  // 0, or the number of the first stop signal received
void clear_stop_signal();    // tests

// What the drafters do after a step, OR'ed over them so every drafter acts at the same step.
enum StepDecision : int32_t {
  kStepContinue = 0,
  kStepCheckpoint = 1,  // save a checkpoint and go on
  kStepStop = 2,        // save a checkpoint and exit with ExitCode::Requeue
};
// Collective over comm: bitwise OR of every member's `local` decision.
int32_t agree_step_decision(MPI_Comm comm, int32_t local);

// A stop signal that reached a target or an idle rank only (a scheduler signalling one task, a container
// stop of one process) would be lost: only the drafters decide when to stop. Those ranks call
// forward_stop_signal(first drafter) while they wait or work; the first time it sees the flag it sends the
// signal's number to that drafter (once, non-blocking). The drafters' step decision counts
// peer_stop_signal() (0, or the first number a peer passed on) as a signal of their own.
void forward_stop_signal(int first_drafter);
int peer_stop_signal();

// ---- the drafters' side (src/checkpoint/drafter_checkpoint.cpp) ------------------------------------

// What the drafters' checkpointer takes of the job (the runtime fills it from its options and plan:
// src/runtime/run_resume.h): plain values, so this floor needs nothing of the runtime's.
struct CheckpointerConfig {
  std::string dir;                   // where checkpoints go: --checkpoint-dir, default OUT/checkpoints
  CheckpointEvery every;             // --checkpoint-every
  int keep = 3;                      // --keep-checkpoints (>= 1)
  bool export_drafter = false;       // --export-checkpoints: also a release-format export in each
  DType export_dtype = DType::BF16;  // --export-dtype
  int grad_accum = 1;                // micro-batches per optimizer step (the job's, resolved)
  double peer_timeout_s = 120;       // --peer-timeout: every wait on another drafter
  int64_t inject_stop_step = -1;     // test hook: act as on a stop signal after this step
};

// The drafters' part, called by every drafter rank of the job (collective over drafter_comm).
class DrafterCheckpointer {
 public:
  // invariants: the runtime's resume_invariants_of(), recorded in every checkpoint and checked on restore.
  // data: where the job's targets start (DataResume); split: whether the checkpoint resumed from was made
  // on another split (its RNG states then continue round-robin over this job's drafters).
  DrafterCheckpointer(CheckpointerConfig config, MPI_Comm drafter_comm, OptionMap invariants, const DataResume& data,
                      std::string resume_dir, ResumeSplit split);
  // Resuming: checks the options, loads master weights, AdamW state, step and this drafter's RNG into
  // trainer. Returns the step to continue from (0 when starting fresh).
  int64_t restore(DrafterTrainer& trainer);
  // Runs at the start of every save, before anything is written (the runtime flushes metrics.h5 there,
  // so a run resumed from the checkpoint finds every row up to its step).
  void before_save(std::function<void()> f) { before_save_ = std::move(f); }
  // The step's bookkeeping: step_begins() before its first micro-batch (with --grad-accum > 1 it keeps the
  // RNG state the step starts from), trained_on() for each batch this drafter trained on in it (its
  // header's target, batch index and next position), step_applied() once the optimizer applied it. A
  // checkpoint covers applied steps only: the batches of a step cut short are trained on again on resume.
  void step_begins(const DrafterTrainer& trainer);
  void trained_on(int target_index, int64_t batch_index, const DataPosition& next);
  void step_applied();
  // After optimizer step `step`: the drafters agree (stop signal anywhere, checkpoint due anywhere),
  // save if so, and say whether to stop now for a requeue. progress() runs while waiting on peers.
  // Saved: a checkpoint of `step` was just written and the run goes on (where --rebalance auto decides).
  enum class Next { Continue, Saved, StopForRequeue };
  // The step directory of the last checkpoint written or resumed from ("" when none).
  // This run's lineage (a fresh one's, or the checkpoint's once restored).
  const std::string& run_id() const { return run_id_; }
  std::string last_checkpoint() const { return saved_step_ > 0 ? checkpoint_step_dir(dir_, saved_step_) : std::string(); }
  Next after_step(int64_t step, DrafterTrainer& trainer, const nlohmann::json& schedule,
                  const std::function<void()>& progress);
  // The end of training, before the export: a checkpoint of the final state (unless the last save, or the
  // checkpoint resumed from, is already of `step`; none at step 0), so the trained weights survive an
  // export that fails. Collective over the drafters. Returns the checkpoint's step directory ("" if none).
  std::string save_final(int64_t step, DrafterTrainer& trainer, const nlohmann::json& schedule,
                         const std::function<void()>& progress);
  // Before the job ends on a lost peer: a checkpoint of the last applied step `step` (a step in progress
  // is dropped: its batches and its RNG draws), unless one of it exists; none at step 0. Collective over
  // the drafters. Returns the checkpoint's step directory ("" if none).
  std::string save_before_exit(int64_t step, DrafterTrainer& trainer, const nlohmann::json& schedule,
                               const std::function<void()>& progress);

 private:
  // rng: this drafter's RNG state as of `step`.
  void save(int64_t step, DrafterTrainer& trainer, const std::string& rng, const nlohmann::json& schedule,
            const std::function<void()>& progress);
  const CheckpointerConfig config_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::string dir_, resume_dir_;
  std::string run_id_;  // this run's lineage (CheckpointState::run_id)
  int64_t saved_step_ = -1;  // step of the last checkpoint written or resumed from (-1: none)
  std::function<void()> before_save_;
  OptionMap invariants_;
  CheckpointTimer timer_;
  ResumeSplit split_ = ResumeSplit::Same;
  std::vector<DataResumePoint> points_;      // drafter 0: resume points as of the last save
  ConsumedRecords consumed_records_;          // epochs begun under an earlier split (saved with the points)
  std::vector<ConsumedBatch> consumed_;       // this drafter's batches of applied steps since the last save
  std::vector<ConsumedBatch> pending_;        // ... of the step in progress
  std::string step_rng_;                      // the RNG state the step in progress began with (--grad-accum > 1)
};

}  // namespace dflash
