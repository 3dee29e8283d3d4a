// What the drafters know about the job, brought to the metrics writer (the first drafter) every
// --log-every steps: metrics.h5 rows and the status line.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dflash/auto_topology.h"
#include "dflash/metrics.h"
#include "job.h"

namespace dflash {

class MetricsHub {
 public:
  // Collective over the drafters. The writer creates OUT/metrics.h5 (/steps/acc_by_pos for the drafter's
  // block_size) and stores the run's attributes.
  // selector_metrics: a DFlash2 drafter (MetricsLayout::selector_metrics).
  MetricsHub(const JobContext& job, int block_size, bool selector_metrics = false);
  ~MetricsHub();

  // Training begins (every rank loaded): rates and the first interval count from here, not from the launch.
  void training_started();
  // Every step (writer only writes and averages for the status line; others ignore). The hub fills in
  // s.epoch from the target reports this rank has seen (targets_seen, one per target) and the last
  // interval's: the status line's epoch.
  void record_step(StepMetrics s, const std::vector<TargetReport>& targets_seen);
  // One evaluation of --eval-data (writer only: an /eval row and the [eval] line; others ignore).
  void record_eval(const EvalMetrics& m);
  // A root attribute of metrics.h5 (writer only; others ignore), e.g. drafter_grad_bytes.
  void set_attribute(const std::string& name, int64_t value);
  // Collective over the drafters: gathers every drafter's counters and the target reports it has seen,
  // writes one interval (rank timings, queue depths) and, with print_status, the status line.
  // progress() keeps the caller's receives moving while it waits. The status line's rates cover the
  // interval, or the whole run for the last report (its interval may be a fraction of a step).
  enum class Rates { Interval, WholeRun };
  void report(const DrafterReport& mine, const std::vector<TargetReport>& targets_seen, Rates rates,
              const std::function<void()>& progress);
  // metrics.h5 to disk now (writer only; others ignore): before a checkpoint commits, so the rows up to
  // its step survive a crash and a run resumed from it has no gap.
  void flush();
  void close();
  // The writer: this split's measured service times over this segment's report intervals after the first
  // (the start-up), as the what-if model takes them (auto_topology.h; --rebalance auto). The colocated
  // overlap: a colocated run's own (its roles' busy times against its wall time per batch), else what
  // --topology auto measured at the run's start, else none. nullopt before two such intervals, and on the
  // other drafters.
  std::optional<RoleMeasurements> measurements() const;

 private:
  const JobContext& job_;
  std::unique_ptr<MetricsWriter> writer_;
  int64_t interval_ = 0;
  double last_time_s_ = 0;
  double train_start_s_ = 0;
  StepMetrics last_step_;
  // Steps since the last status line: it prints their mean loss/acc/streak (one step's values are noise;
  // each step's own are in metrics.h5).
  struct IntervalMeans {
    double loss = 0, acc = 0, streak = 0;
    int64_t steps = 0;
  } interval_sums_;
  std::vector<TargetReport> prev_targets_;
  std::vector<DrafterReport> prev_drafters_;
  int64_t segment_ = 0;         // this job's /segments row
  struct Evals {                // this segment's evaluations (the ETA predicts the rest from them)
    int64_t count = 0;
    double seconds = 0;
  } evals_;
  struct ServiceSums {          // this segment's report intervals after the first (measurements())
    double target_busy_s = 0, drafter_busy_s = 0, allreduce_s = 0, tokens = 0;
    double wall_s = 0;          // the intervals' length (a colocated rank's overlap: its batches' wall time)
    int64_t target_batches = 0, drafter_batches = 0, intervals = 0;
    double target_power_w = 0, drafter_power_w = 0;  // sums of readings
    int64_t target_power_n = 0, drafter_power_n = 0;
  } service_;
  std::optional<double> idle_power_w_;  // the GPUs' mean draw before any model loaded
  ColocatedFit colocated_fit_ = ColocatedFit::Unknown;  // check_colocated_fit (writer only)
  std::optional<double> auto_overlap_;  // the colocated overlap --topology auto measured (its record), if it did
  std::vector<int> gpu_ranks_;  // world rank of each /gpus column (empty: no GPU series)
};

}  // namespace dflash
