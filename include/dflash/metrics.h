// metrics.h5 (one writer rank) and the operator's status line. Layout and h5py/xarray snippets: docs/metrics.md.
//
//   /steps/{step, time_s, loss, acc, agree, streak, lr, noise, grad_norm, tokens, anchors, epoch}  [step]
//   /steps/acc_by_pos [step, block_position], /steps/block_position = 1 .. block_size-1     one row per step
//   /ranks/{interval, segment, time_s, rank, role, batches, busy_s, wait_s, compute_s, credit_wait_s,
//           data_wait_s, allreduce_s, optimizer_s}                                  [row], one per (interval, rank)
//   /queues/{time_s [sample], q_pre [sample, target], q_hs [sample, drafter]}
//   /gpus/{time_s [sample], power_w, util_pct, mem_used_mib [sample, gpu]}  + attributes available, reason
//   /segments/{first_step, kind, nodes, targets_per_node, drafters_per_node, world_size, grad_accum,
//              unix_time_s} [row], one per job start; /segments/K/{queues,gpus}: an earlier split's samples
//   attributes of /: whatever the job sets (options, topology, hosts, versions, ...) + format_version;
//   /options: one typed attribute per option
//
// Every series is an extendible chunked dataset (H5S_UNLIMITED, grown with H5Dset_extent) whose axes carry
// netCDF-4 dimension scales ([step], [sample, target], ...: xarray names its dimensions after them); the
// role is the HDF5 enum /ranks/role_t. No SWMR: the file is flushed (H5Fflush) every flush_every appends
// and at close, so a killed job leaves a file that h5py opens as usual, holding everything up to the last
// flush (docs/metrics.md says why not SWMR).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dflash {

// One training step (written by the drafter-0 / writer rank).
struct StepMetrics {
  int64_t step = 0;
  double time_s = 0;     // since the job started
  double loss = 0, acc = 0, agree = 0, streak = 0, lr = 0, noise = 0, grad_norm = 0;
  int64_t tokens = 0;    // tokens in the step's batch(es)
  int64_t anchors = 0;   // anchors trained on
  double epoch = 0;      // fractional epochs done (the status line's epoch~), absolute across resumes
  // Accuracy at block positions 1 .. block_size-1 (position 0 is the anchor, never predicted); empty:
  // not known (stored as NaN).
  std::vector<double> acc_by_pos;
  // DFlash2 drafters (NaN otherwise; written only where MetricsLayout::selector_metrics): the selector term of
  // the loss, candidate recall (the gold within the unary top-K) and the selector's teacher-forced accuracy.
  double loss_sel = std::nan(""), candidate_recall = std::nan(""), selector_acc = std::nan("");
  double selector_alpha = std::nan("");  // the selector term's weight at the step (warmup, ramp)
};

// Stored as the HDF5 enum /ranks/role_t (int8 base: target 0, drafter 1, idle 2).
enum class MetricsRole : int { Target = 0, Drafter = 1, Idle = 2 };
const char* metrics_role_name(MetricsRole r);

// One rank's time split over one report interval. Fields that do not apply to the role are 0:
// targets fill compute_s, credit_wait_s, data_wait_s; drafters data_wait_s, compute_s, allreduce_s,
// optimizer_s. busy_s = time doing work, wait_s = time blocked (busy_s + wait_s ~ interval length).
struct RankTiming {
  int64_t interval = 0;  // report interval index (0, 1, ...)
  int64_t segment = 0;   // the /segments row of the job that measured it (MetricsWriter::begin_segment)
  double time_s = 0;     // end of the interval, since the job started
  int rank = 0;          // world rank
  MetricsRole role = MetricsRole::Idle;
  int64_t batches = 0;   // batches finished in the interval
  double busy_s = 0, wait_s = 0;
  double compute_s = 0, credit_wait_s = 0, data_wait_s = 0, allreduce_s = 0, optimizer_s = 0;
  // drafters: evaluating --eval-data (and decoding the --eval-tau-every prompts): neither busy_s (it trains
  // no batch, so the service rates leave it out) nor wait_s; busy_s + wait_s + eval_s ~ interval length
  double eval_s = 0;
};

// Fixed at creation: the widths of the 2-D series.
struct MetricsLayout {
  int num_targets = 1;    // columns of /queues/q_pre
  int num_drafters = 1;   // columns of /queues/q_hs
  int num_gpus = 0;       // columns of /gpus/* (0 = no GPU series)
  bool gpu_available = false;          // NVML readings will be appended
  std::string gpu_unavailable_reason;  // e.g. "CPU backend: no NVML" (stored when !gpu_available)
  int flush_every = 10;   // H5Fflush after this many appends (any series); --metrics-flush-every
  int block_size = 16;    // the drafter's: /steps/acc_by_pos has block_size - 1 columns (at least 2)
  bool selector_metrics = false;  // a DFlash2 drafter: /steps/loss_sel, candidate_recall, selector_acc, selector_alpha
};

// One job start on the file (/segments, one row each): a run and each of its resumes is a segment. The
// split may differ between segments; /queues and /gpus (one column per target, drafter or GPU) then hold
// the current split's samples only, the earlier split's having moved to /segments/K/{queues,gpus} (K =
// that split's first segment). dflash-report reads service times per segment, never mixed.
enum class SegmentKind : int64_t { Start = 0, Resume = 1, Resplit = 2, Rebalance = 3 };
struct SegmentInfo {
  int64_t first_step = 0;  // the step it continues from (0, or the checkpoint's)
  SegmentKind kind = SegmentKind::Start;
  int64_t nodes = 1, targets_per_node = 1, drafters_per_node = 1, world_size = 2, grad_accum = 1;
  double unix_time_s = 0;  // wall clock at its start
};

enum class MetricsOpen {
  Create,  // a new file; an existing one that holds steps is first renamed to DIR/metrics.N.h5 (N = one
           // more than the highest there), one without steps (a failed start) is replaced
  Append,  // continue an existing file (resume); its layout must match (fatal BadInput otherwise);
           // creates the file if it does not exist
};

struct EvalMetrics;

// The space the writer keeps allocated next to metrics.h5 (.metrics.h5.reserve, docs/metrics.md "A full
// disk") for `num_series` series flushed every `flush_every` steps; fewer than 40 series count as 40, so
// (flush_every, 0) is what any writer reserves at least (the startup disk check counts it).
size_t metrics_reserve_bytes(int flush_every, size_t num_series);

class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, const MetricsLayout& layout, MetricsOpen mode = MetricsOpen::Create);
  ~MetricsWriter();  // close()
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends this job's /segments row; returns its index (RankTiming::segment).
  int64_t begin_segment(const SegmentInfo& seg);
  void append_step(const StepMetrics& s);
  void append_rank_timing(const RankTiming& r);
  // q_pre has num_targets entries, q_hs num_drafters (fatal Internal otherwise).
  void append_queues(double time_s, const std::vector<int>& q_pre, const std::vector<int>& q_hs);
  // Each vector has num_gpus entries; only call when gpu_available (never invent readings).
  void append_gpus(double time_s, const std::vector<double>& power_w, const std::vector<double>& util_pct,
                   const std::vector<double>& mem_used_mib);

  // Attributes of the root group (overwritten if present). Use JSON text for structured values
  // (options, hosts, topology).
  void set_attribute(const std::string& name, const std::string& value);
  void set_attribute(const std::string& name, double value);
  void set_attribute(const std::string& name, int64_t value);
  // Attributes of the group /`group` (created when missing), typed as given: /options holds one per option.
  void set_group_attribute(const std::string& group, const std::string& name, const std::string& value);
  void set_group_attribute(const std::string& group, const std::string& name, double value);
  void set_group_attribute(const std::string& group, const std::string& name, int64_t value);

  // Resume: drops /steps rows whose step > last_step (they were written after the checkpoint the job
  // resumed from and will be written again).
  void drop_steps_after(int64_t last_step);
  // --eval-data: one /eval row (the group is made by the first; acc_by_pos has one column per position
  // 1 .. block_size-1). Flushed at once: evaluations are rare. drop_eval_after: as drop_steps_after.
  void append_eval(const EvalMetrics& m);
  void drop_eval_after(int64_t last_step);

  int64_t num_steps() const;
  const std::string& path() const { return path_; }
  void flush();  // H5Fflush now
  void close();  // flush + close; idempotent

  struct Impl;

 private:
  void count_append();
  std::string path_;
  MetricsLayout layout_;
  std::unique_ptr<Impl> impl_;
  int appends_since_flush_ = 0;
};

// Reads a metrics file back (tests, dflash-report). Fatal BadInput naming the file/series on error.
class MetricsReader {
 public:
  explicit MetricsReader(const std::string& path);
  ~MetricsReader();
  MetricsReader(const MetricsReader&) = delete;
  MetricsReader& operator=(const MetricsReader&) = delete;

  bool has(const std::string& series) const;                 // "steps/loss", "gpus", ...
  std::vector<double> series(const std::string& name) const;  // a 1-D series, converted to double (enums too)
  // A 2-D series as rows x cols (row-major); cols is set.
  std::vector<double> matrix(const std::string& name, int64_t* cols) const;
  int64_t rows(const std::string& name) const;
  // The dimension of each axis of a series, as xarray names it: the attached scale dataset's name
  // ("step", "sample", "target"); "" for an axis without one (a file of format_version 1).
  std::vector<std::string> dimensions(const std::string& name) const;
  bool has_attribute(const std::string& object, const std::string& name) const;  // object: "/" or "/gpus"
  std::string attribute_string(const std::string& object, const std::string& name) const;
  double attribute_number(const std::string& object, const std::string& name) const;
  std::vector<std::string> attribute_names(const std::string& object) const;

 private:
  std::string path_;
  int64_t file_ = -1;  // hid_t
};

// ---- held-out evaluation (--eval-data) ------------------------------------------------------------

// One evaluation of the fixed eval set (every --eval-every steps and at the end): sums over every drafter's
// share, so the numbers are those of one drafter evaluating the whole set. /eval, one row each.
struct EvalMetrics {
  int64_t step = 0;       // optimizer steps done when it ran
  double time_s = 0;      // since the job started
  double loss = 0;        // position-weighted loss over every loss row of the set (nats)
  double acc = 0;         // share of loss rows whose drafter argmax equals the label
  double streak = 0;      // mean leading run of correct predictions per block
  // Accuracy at block positions 1 .. block_size-1 (position 0 is the anchor, never predicted); NaN where the
  // set has no row at that position.
  std::vector<double> acc_by_pos;
  int64_t tokens = 0, anchors = 0, seqs = 0;
  double seconds = 0;     // wall time the evaluation took (the first drafter's, which waits for the others)
  // --eval-tau-every: dflash-eval's tau over the decoded prompts (include/dflash/eval_prompts.h), NaN in
  // a row that did not measure it; the prompts, tokens generated, target verifications, and the decoding
  // seconds summed over the drafters (0 / NaN when not measured).
  double tau = std::numeric_limits<double>::quiet_NaN();
  int64_t tau_prompts = 0, tau_new_tokens = 0, tau_steps = 0;
  double tau_seconds = std::numeric_limits<double>::quiet_NaN();
};

// [eval] step=200 loss=4.1234 acc=0.123 streak=0.45 tau=1.83 (12 seqs, 3.1K tok, 0.4 s)   (tau= only in a
// row that measured it)
std::string format_eval_line(const EvalMetrics& m);

// ---- the status line -------------------------------------------------------------------------------

// "42s", "5m", "3h12m", "1.2d" (under 60 s: seconds; under 1 h: minutes; under 1 d: h+m; else days).
std::string format_duration(double seconds);

struct StatusInputs {
  double elapsed_s = 0;
  int64_t step = 0;
  double loss = 0, acc = 0, streak = 0, lr = 0, noise = 0;
  // DFlash2: the last step's candidate recall and selector accuracy (NaN for DFlash: not printed)
  double candidate_recall = std::nan(""), selector_acc = std::nan("");
  double target_batches_per_s = 0;   // all targets together
  double drafter_batches_per_s = 0;  // all drafters together
  double tokens_per_s = 0;
  std::optional<double> power_w;     // total power of the job's GPUs when NVML knows it
  std::vector<int> q_pre;            // one per target
  std::vector<int> q_hs;             // one per drafter
  int q_pre_capacity = 0;            // --prefetch-depth: q_pre=[3/4]; 0 = unknown, q_pre=[3]
  int q_hs_capacity = 0;             // --hs-queue-depth: q_hs=[3/4]; 0 = unknown, q_hs=[3]
  double epoch = 0;                  // fractional epochs done
  std::optional<double> eta_s;       // unknown (infinite epochs, no rate yet): "ETA=?"
  double eta_eval_s = 0;             // the part of eta_s that is evaluation: "ETA=4.7d (eval 3h10m)" when > 0
  int grad_accum = 1;                // micro-batches per optimizer step: "step=58 (x4 mb)" when > 1
  bool colocated = false;            // --topology colocated: "| colocated" after the throughput group (tgt and
                                     // dft are then the same ranks' two threads)
};

// [5m] step=58 loss=2.2577 acc=0.029 streak=0.04 lr=9.84e-06 noise=0.1000 | tgt=0.88 batch/s dft=0.81 batch/s
// (25.1Ktok/s) | q_pre=[50/64, 49/64] q_hs=[20/32] | epoch~0.01 ETA=4.7d     (one line; pwr=4.2kW after
// the throughput group when power_w is set; step=58 (x4 mb) with --grad-accum 4: steps are optimizer steps
// of 4 micro-batches each, dft=... batch/s counts micro-batches; "| colocated" before the queues on a colocated run). loss, acc and streak are whatever the caller passes: the job
// passes their means over the logging interval (per-step values are in metrics.h5).
std::string format_status_line(const StatusInputs& in);

// The status line's ETA. Progress (step, epoch) is absolute — it continues across a resume — while the
// rate is this segment's own: steps done since it started over the time it has trained. Mixing the two
// (absolute epochs over this segment's time) was the bug of a resumed run's ETA.
struct EtaInputs {
  int64_t step = 0;                // last step trained (absolute)
  int64_t segment_first_step = 0;  // the step this segment started from (the resumed checkpoint's, or 0)
  double segment_train_s = 0;      // seconds this segment has been training
  int64_t max_steps = 0;           // --max-steps (0 = none)
  int epochs = 0;                  // --epochs (0 = forever)
  double epoch = 0;                // fractional epochs done (absolute)
  // --eval-data: the evaluations this segment has run and their seconds (inside segment_train_s), and
  // --eval-every (0: only the one after the last step; -1: no eval set).
  int64_t evals_done = 0;
  double eval_s = 0;
  int64_t eval_every = -1;
};
// Seconds left: the nearer of the --max-steps and the --epochs ends, at this segment's training steps per
// second (its time less its evaluations; steps per epoch = step / epoch, both absolute), plus the
// evaluations still due (remaining_eval_s). None until this segment has trained a step, or when neither
// end is known.
std::optional<double> estimate_eta_s(const EtaInputs& in);
// The evaluations due after `in.step` up to the end `end_step` (every --eval-every step, and the one after
// the last step when that is not on the schedule) times the mean of this segment's measured ones; 0 before
// one is measured.
double remaining_eval_s(const EtaInputs& in, double end_step);

}  // namespace dflash
