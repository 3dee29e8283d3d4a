// OUT/drafter-best (docs/checkpoint.md "The best drafter so far"): after every evaluation (--eval-data)
// the drafters compare it with the best so far — by eval tau with --eval-tau-every (rows that measured
// it), else by eval loss — and the metrics writer exports a better drafter there: the release format, as
// OUT/drafter, plus best.json (step, tau, loss, the criterion), written into a temporary directory that
// then replaces the old one in one rename. Every checkpoint records the best so far (its schedule's
// "best"), so a resumed run goes on comparing against it.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "dflash/drafter.h"
#include "dflash/metrics.h"
#include "dflash/options.h"

namespace dflash {

class DrafterBest {
 public:
  enum class By { Tau, Loss };
  // resume_dir: the checkpoint the job resumes from ("" = a fresh start, no best yet). A checkpoint
  // without a record (a build before drafter-best) falls back on OUT/drafter-best/best.json when that is
  // of its step or earlier.
  DrafterBest(const Options& o, const std::string& resume_dir);
  By by() const { return by_; }
  // After an evaluation (the same numbers on every drafter): true when m is the new best (recorded).
  bool offer(const EvalMetrics& m);
  // The metrics writer, after offer() said yes: exports the trainer's weights into OUT/drafter-best
  // (atomically, with best.json) and says so on stdout.
  void write(const EvalMetrics& m, DrafterTrainer& trainer) const;
  // What a checkpoint records: {} before the first evaluation.
  nlohmann::json record() const { return record_; }
  static std::string dir_of(const Options& o) { return o.out_dir + "/drafter-best"; }

 private:
  bool better(const EvalMetrics& m) const;
  const Options& o_;
  By by_;
  nlohmann::json record_ = nlohmann::json::object();  // {"step", "tau", "loss", "by"}
};

}  // namespace dflash
