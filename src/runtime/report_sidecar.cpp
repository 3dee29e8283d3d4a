// See report_sidecar.h.
#include "report_sidecar.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "dflash/clock.h"
#include "dflash/error.h"
#include "dflash/safe_file.h"

extern char** environ;

namespace dflash {
namespace {

bool is_executable(const std::string& p) { return !p.empty() && ::access(p.c_str(), X_OK) == 0; }

std::string self_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.find_last_of('/'));
}

}  // namespace

std::vector<ReportTarget> parse_report_to(const std::string& text) {
  std::vector<ReportTarget> out;
  if (text.empty() || text == "none") return out;
  std::stringstream ss(text);
  for (std::string word; std::getline(ss, word, ',');) {
    ReportTarget t;
    if (word == "tensorboard") t = ReportTarget::TensorBoard;
    else if (word == "csv") t = ReportTarget::Csv;
    else if (word == "wandb") t = ReportTarget::Wandb;
    else
      DF_FAIL(BadOptions, "bad value '" << word << "' in --report-to " << text,
              "a comma list of tensorboard, csv and wandb (e.g. --report-to tensorboard,csv), or none");
    bool seen = false;
    for (ReportTarget x : out) seen = seen || x == t;
    if (!seen) out.push_back(t);
  }
  return out;
}

std::string find_dflash_report() {
  if (const char* env = std::getenv("DFLASH_REPORT"); env && *env) return is_executable(env) ? env : "";
  // The build directory sits in (or next to) the source tree: BUILD/dflash-train -> SRC/tools/dflash-report.
  const std::string dir = self_dir();
  for (const std::string& cand : {dir + "/../tools/dflash-report", dir + "/../../tools/dflash-report",
                                  dir + "/dflash-report"})
    if (is_executable(cand)) return cand;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    for (std::string d; std::getline(ss, d, ':');)
      if (is_executable(d + "/dflash-report")) return d + "/dflash-report";
  }
  return "";
}

std::string check_report_to(const Options& o) {
  const std::vector<ReportTarget> targets = parse_report_to(o.report_to);
  if (targets.empty()) return "";
  const std::string program = find_dflash_report();
  DF_CHECK_HINT(!program.empty(), BadOptions, "--report-to needs tools/dflash-report, and it was not found",
                "set DFLASH_REPORT to its path (it is tools/dflash-report in the source tree), or put it on PATH");
  if (std::find(targets.begin(), targets.end(), ReportTarget::Wandb) == targets.end()) return "";
  // The program's own answer (it imports wandb the way its --wandb export will, re-running under the project
  // venv where that has it), its stdout and stderr together; the path single-quoted for the shell; at most
  // 120 s (coreutils' timeout: an import that hangs ends in exit 124, refused like any other answer).
  std::string quoted = "'";
  for (char c : program) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  std::string out;
  FILE* p = ::popen(("timeout -k 5 120 " + quoted + " --check-wandb 2>&1").c_str(), "r");
  DF_CHECK_HINT(p != nullptr, SystemFailure, "--report-to wandb: cannot run " << program << " --check-wandb",
                "drop wandb from --report-to, or check the environment");
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  DF_CHECK_HINT(WIFEXITED(status) && WEXITSTATUS(status) == 0, BadOptions,
                "--report-to wandb, but " << program << " cannot log to W&B: " << out,
                "install wandb for it (tools/setup.sh --tests puts it in the project venv), or drop wandb from --report-to");
  return "[dflash] --report-to wandb: " + out + " (" + program + ")";
}

ReportSidecar::ReportSidecar(const Options& o)
    : targets_(parse_report_to(o.report_to)), out_dir_(o.out_dir), every_s_(60.0 * o.report_every_min) {
  if (targets_.empty()) return;
  program_ = find_dflash_report();
  DF_CHECK_HINT(!program_.empty(), BadOptions, "--report-to needs tools/dflash-report, and it was not found",
                "set DFLASH_REPORT to its path (it is tools/dflash-report in the source tree), or put it on PATH");
  log_path_ = out_dir_ + "/report-to.log";
  last_start_s_ = monotonic_s();  // the first export after --report-every, when there is something to show
}

ReportSidecar::~ReportSidecar() {
  // An export still running when the job ends is left to finish on its own (it only reads metrics.h5).
  if (child_ > 0) ::waitpid(child_, nullptr, WNOHANG);
}

bool ReportSidecar::running() {
  if (child_ <= 0) return false;
  int status = 0;
  const pid_t r = ::waitpid(child_, &status, WNOHANG);
  if (r == 0) return true;
  if (r == child_) last_exit_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (r == child_ && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    std::fprintf(stderr, "[dflash] warning: --report-to: %s exited with %d (see %s); the run goes on\n",
                 program_.c_str(), WIFEXITED(status) ? WEXITSTATUS(status) : -1, log_path_.c_str());
  }
  child_ = -1;
  return false;
}

void ReportSidecar::start(bool final_export) {
  std::vector<std::string> args = {program_, out_dir_ + "/metrics.h5"};
  bool any = false;
  for (ReportTarget t : targets_) {
    if (t == ReportTarget::TensorBoard) args.insert(args.end(), {"--tensorboard", out_dir_ + "/tensorboard"});
    if (t == ReportTarget::Csv) args.insert(args.end(), {"--csv", out_dir_ + "/csv"});
    // One W&B run per export: only the job's last one makes it (a run resumed later makes the next).
    if (t == ReportTarget::Wandb && final_export) args.insert(args.end(), {"--wandb", "--wandb-dir", out_dir_});
    any = any || t != ReportTarget::Wandb || final_export;
  }
  if (!any) return;
  // The log is opened here, not by the spawn's file actions: through --out's descriptor, never through a
  // link or hard link planted at OUT/report-to.log, and without blocking on a FIFO there
  // (include/dflash/safe_file.h). The child gets it as stdout and stderr.
  const int log_fd = open_own_file(log_path_, O_WRONLY | O_CREAT | O_APPEND, new_file_mode());
  if (log_fd < 0) {
    last_unstarted_ = "cannot open its log " + log_path_ + ": " + own_file_error(errno);
    std::fprintf(stderr, "[dflash] warning: --report-to: %s; no export this time, the run goes on\n",
                 last_unstarted_.c_str());
    return;
  }
  last_unstarted_.clear();
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, log_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, log_fd, STDERR_FILENO);
  posix_spawn_file_actions_addclose(&fa, STDIN_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, program_.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(log_fd);
  if (rc != 0) {
    std::fprintf(stderr, "[dflash] warning: --report-to: cannot start %s (error %d); the run goes on\n", program_.c_str(), rc);
    last_exit_ = 127;  // as a shell says of a program it cannot start
    return;
  }
  child_ = pid;
  last_start_s_ = monotonic_s();
}

bool ReportSidecar::due() { return !targets_.empty() && !running() && monotonic_s() - last_start_s_ >= every_s_; }

void ReportSidecar::tick() {
  if (due()) start(/*final_export=*/false);
}

void ReportSidecar::finish(double wait_s) {
  if (targets_.empty()) return;
  const double t0 = monotonic_s();
  while (running() && monotonic_s() - t0 < wait_s) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (running()) return;  // the periodic one is still at it: leave it
  start(/*final_export=*/true);
  while (running() && monotonic_s() - t0 < wait_s) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (child_ <= 0 && !last_unstarted_.empty()) {  // the last export never started: never reported as exported
    std::printf("[dflash] --report-to: the last export was not started (%s): nothing new was exported to %s\n",
                last_unstarted_.c_str(), out_dir_.c_str());
    std::fflush(stdout);
  } else if (child_ <= 0 && last_exit_ != 0) {  // the last export failed: never reported as exported
    std::printf("[dflash] --report-to: the last export failed (exit %d): nothing new was exported to %s; see %s\n",
                last_exit_, out_dir_.c_str(), log_path_.c_str());
    std::fflush(stdout);
  } else if (child_ <= 0) {
    std::string where;
    for (ReportTarget t : targets_)
      where += std::string(where.empty() ? "" : ", ") +
               (t == ReportTarget::TensorBoard ? "tensorboard/" : t == ReportTarget::Csv ? "csv/" : "wandb/");
    std::printf("[dflash] --report-to: exported to %s (%s; log %s)\n", out_dir_.c_str(), where.c_str(), log_path_.c_str());
    std::fflush(stdout);
  }
}

}  // namespace dflash
