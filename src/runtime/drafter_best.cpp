// DrafterBest: src/runtime/drafter_best.h.
#include "drafter_best.h"

#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <fcntl.h>

#include <cerrno>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "dflash/checkpoint.h"
#include "dflash/error.h"
#include "dflash/safetensors.h"  // write_file_atomic
#include "io/json_file.h"

namespace dflash {
namespace {

const char* by_name(DrafterBest::By b) { return b == DrafterBest::By::Tau ? "tau" : "loss"; }

// A JSON number, or null for NaN (JSON has no NaN).
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

}  // namespace

DrafterBest::DrafterBest(const Options& o, const std::string& resume_dir)
    : o_(o), by_(o.eval_tau_every > 0 ? By::Tau : By::Loss) {
  if (resume_dir.empty()) return;  // a fresh start: the first evaluation is the best so far
  const CheckpointState st = read_checkpoint_state(resume_dir);
  nlohmann::json saved = st.schedule.value("best", nlohmann::json::object());
  if (saved.empty()) {  // a checkpoint of a build before drafter-best: the export's own record, if not newer
    const JsonFile f = try_read_json_file(dir_of(o) + "/best.json");
    if (f.ok() && f.value.value("step", INT64_MAX) <= st.step) saved = f.value;
  }
  // A record by the other criterion (--eval-tau-every given or dropped on resume) compares nothing.
  if (!saved.empty() && saved.value("by", "") == by_name(by_)) record_ = saved;
}

bool DrafterBest::better(const EvalMetrics& m) const {
  const double now = by_ == By::Tau ? m.tau : m.loss;
  if (!std::isfinite(now)) return false;  // a row that did not measure tau (or a broken loss)
  if (record_.empty()) return true;
  const auto was = record_.find(by_name(by_));
  if (was == record_.end() || !was->is_number()) return true;
  return by_ == By::Tau ? now > was->get<double>() : now < was->get<double>();
}

bool DrafterBest::offer(const EvalMetrics& m) {
  if (!better(m)) return false;
  record_ = {{"step", m.step}, {"tau", number(m.tau)}, {"loss", number(m.loss)}, {"by", by_name(by_)},
             {"tau_prompts", m.tau_prompts}, {"tau_max_new_tokens", o_.eval_tau_max_new_tokens}};
  return true;
}

void DrafterBest::write(const EvalMetrics& m, DrafterTrainer& trainer) const {
  namespace fs = std::filesystem;
  const std::string dir = dir_of(o_), tmp = o_.out_dir + "/.drafter-best.tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);  // an interrupted write's leftovers
  trainer.export_release(tmp, o_.export_dtype);
  write_file_atomic(tmp + "/best.json", record_.dump(1) + "\n");
  // One rename replaces the old directory: RENAME_EXCHANGE swaps the two (then the old one, now at tmp,
  // goes); where the filesystem cannot (EINVAL), the old one is moved aside first.
  int rc = -1;
  if (fs::exists(dir, ec)) {
    rc = ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE);
    if (rc != 0 && errno == EINVAL) {
      const std::string old = o_.out_dir + "/.drafter-best.old";
      fs::remove_all(old, ec);
      rc = std::rename(dir.c_str(), old.c_str()) == 0 ? std::rename(tmp.c_str(), dir.c_str()) : -1;
      fs::remove_all(old, ec);
    }
  } else {
    rc = std::rename(tmp.c_str(), dir.c_str());
  }
  DF_CHECK_HINT(rc == 0, SystemFailure, "cannot move the best drafter into " << dir << ": " << std::strerror(errno),
                "check that --out is writable (the trained drafter is still in memory and in the checkpoints)");
  fs::remove_all(tmp, ec);
  char tau[32] = "not measured";
  if (std::isfinite(m.tau)) std::snprintf(tau, sizeof(tau), "%.3f", m.tau);
  std::printf("[dflash] best drafter so far (by eval %s): step %lld, tau %s, loss %.4f -> %s\n", by_name(by_),
              static_cast<long long>(m.step), tau, m.loss, dir.c_str());
  std::fflush(stdout);
}

}  // namespace dflash
