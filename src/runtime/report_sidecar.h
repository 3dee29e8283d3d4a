// --report-to tensorboard,csv,wandb (issue 31): the run's series in the user's own tools while it trains.
// The metrics writer (the first drafter) runs tools/dflash-report on OUT/metrics.h5 in the background every
// --report-every minutes (after a flush) and once more when the job ends: TensorBoard event files in
// OUT/tensorboard, CSV in OUT/csv, and at the end of each job a W&B run (offline unless WANDB_MODE says
// otherwise) under OUT/wandb. Its output goes to OUT/report-to.log; a failed export is a warning there and on
// the status line's stream, never the job's end. docs/metrics.md "Your own tools while it trains".
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

#include "dflash/options.h"

namespace dflash {

enum class ReportTarget { TensorBoard, Csv, Wandb };
// "tensorboard,csv,wandb" (any order, any subset; "" or "none" = none). Fatal BadOptions on another word.
std::vector<ReportTarget> parse_report_to(const std::string& text);
// The dflash-report program the job runs: $DFLASH_REPORT, else tools/dflash-report of the source tree the
// binary was built from (next to its build directory), else the one on PATH; "" when none is found.
std::string find_dflash_report();
// --report-to's exporters, checked before the job trains (world rank 0, with the other input checks) and in
// --dry-run: dflash-report must be found, and with wandb, its Python must import wandb (`dflash-report
// --check-wandb`). Fatal BadOptions naming what is missing; the W&B line ("" without wandb) otherwise.
std::string check_report_to(const Options& o);

class ReportSidecar {
 public:
  // Off (every call a no-op) without --report-to. Fatal BadOptions when dflash-report cannot be found.
  explicit ReportSidecar(const Options& o);
  ~ReportSidecar();
  ReportSidecar(const ReportSidecar&) = delete;
  ReportSidecar& operator=(const ReportSidecar&) = delete;
  bool on() const { return !targets_.empty(); }
  // Whether an export is due (--report-every passed, none running): flush metrics.h5, then tick().
  bool due();
  void tick();
  // The job's last export (W&B included), after the metrics file is closed; waits up to `wait_s` for it.
  void finish(double wait_s);

 private:
  void start(bool final_export);
  bool running();  // reaps a finished export (and warns when it failed)
  std::vector<ReportTarget> targets_;
  std::string program_, out_dir_, log_path_;
  double every_s_ = 600, last_start_s_ = 0;
  pid_t child_ = -1;
  int last_exit_ = 0;  // the exit status of the last export that ended (-1: killed by a signal)
  std::string last_unstarted_;  // why the last export was not started at all ("" when it was)
};

}  // namespace dflash
