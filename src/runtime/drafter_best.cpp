// DrafterBest: src/runtime/drafter_best.h.
#include "drafter_best.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "dflash/checkpoint.h"
#include "dflash/error.h"
#include "dflash/safe_file.h"
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
    const JsonFile f = try_read_json_file(dir_of(o) + "/best.json", JsonExpect::Object, LinkPolicy::Refuse);
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
  const std::string dir = dir_of(o_);
  // A staging directory of its own, made by mkdirat under an unpredictable name (include/dflash/safe_dir.h):
  // a fixed name (.drafter-best.tmp) could be planted as a link by anyone who can write --out, and the
  // export would follow it. Its files are written through --out's descriptor; it gets the mode a new
  // directory would (mkdirat made it 0700) before it takes the place of OUT/drafter-best.
  const std::string tmp = make_temp_dir(o_.out_dir, ".drafter-best.");
  trainer.export_release(tmp, o_.export_dtype);
  write_file_atomic(tmp + "/best.json", record_.dump(1) + "\n");
  if (const DirFd staged = open_dir(tmp, MissingDirs::Refuse); staged.valid())
    ::fchmod(staged.get(), 0777 & ~current_umask());
  // One rename replaces the old directory: RENAME_EXCHANGE swaps the two (then the old one, now at tmp,
  // goes); where the filesystem cannot (EINVAL), the old one is moved aside first. Every name is renamed
  // relative to --out's descriptor, never followed: a link planted at OUT/drafter-best is swapped out and
  // removed as a link.
  struct stat st;
  int err = 0;
  if (stat_own_entry(dir, &st) == 0) {
    err = exchange_paths(tmp, dir);
    if (err == EINVAL) {
      const std::string old = make_temp_dir(o_.out_dir, ".drafter-best.");
      err = rename_path(dir, old + "/previous");
      if (err == 0) err = rename_path(tmp, dir);
      remove_tree_at(old);
    }
  } else {
    err = rename_path(tmp, dir);
  }
  DF_CHECK_HINT(err == 0, SystemFailure, "cannot move the best drafter into " << dir << ": " << std::strerror(err),
                "check that --out is writable (the trained drafter is still in memory and in the checkpoints)");
  remove_tree_at(tmp);
  char tau[32] = "not measured";
  if (std::isfinite(m.tau)) std::snprintf(tau, sizeof(tau), "%.3f", m.tau);
  std::printf("[dflash] best drafter so far (by eval %s): step %lld, tau %s, loss %.4f -> %s\n", by_name(by_),
              static_cast<long long>(m.step), tau, m.loss, dir.c_str());
  std::fflush(stdout);
}

}  // namespace dflash
