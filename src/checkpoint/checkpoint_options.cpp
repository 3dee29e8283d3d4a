// --checkpoint-every parsing, the save timer, and the options a resume must not change.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "dflash/checkpoint.h"
#include "dflash/clock.h"
#include "dflash/error.h"

namespace dflash {
namespace {

constexpr const char* kEveryRule = "N (steps, N >= 1), Nm (minutes, N > 0), or 0 (off): e.g. 500 or 30m";

}  // namespace

std::string CheckpointEvery::to_string() const {
  switch (unit) {
    case CheckpointUnit::Off: return "off";
    case CheckpointUnit::Steps: return std::to_string(steps);
    case CheckpointUnit::Minutes: {
      std::ostringstream os;
      os << minutes << "m";
      return os.str();
    }
  }
  return "?";
}

CheckpointEvery parse_checkpoint_every(const std::string& text) {
  CheckpointEvery e;
  if (text.empty() || text == "0" || text == "off") return e;
  const bool minutes = text.back() == 'm';
  const std::string number = minutes ? text.substr(0, text.size() - 1) : text;
  char* end = nullptr;
  errno = 0;
  if (minutes) {
    double v = number.empty() ? 0 : std::strtod(number.c_str(), &end);
    DF_CHECK_HINT(!number.empty() && end && *end == '\0' && errno == 0 && std::isfinite(v) && v > 0, BadOptions,
                  "bad value " << text << " for --checkpoint-every", kEveryRule);
    e.unit = CheckpointUnit::Minutes;
    e.minutes = v;
  } else {
    long long v = number.empty() ? 0 : std::strtoll(number.c_str(), &end, 10);
    DF_CHECK_HINT(!number.empty() && end && *end == '\0' && errno == 0 && v >= 1, BadOptions,
                  "bad value " << text << " for --checkpoint-every", kEveryRule);
    e.unit = CheckpointUnit::Steps;
    e.steps = v;
  }
  return e;
}

CheckpointTimer::CheckpointTimer(const CheckpointEvery& every) : every_(every), last_save_s_(monotonic_s()) {}

bool CheckpointTimer::due(int64_t step) const {
  switch (every_.unit) {
    case CheckpointUnit::Off: return false;
    case CheckpointUnit::Steps: return step > 0 && step % every_.steps == 0;
    case CheckpointUnit::Minutes: return monotonic_s() - last_save_s_ >= every_.minutes * 60.0;
  }
  return false;
}

void CheckpointTimer::saved() { last_save_s_ = monotonic_s(); }

// ---- resume invariants ------------------------------------------------------------------------

bool option_may_change_on_resume(const std::string& name) {
  // Everything else (model, topology, objective, data, seed, token budget, schedule, ...) must match:
  // an option nobody listed here is refused rather than silently accepted.
  static const std::set<std::string> may_change = {
      "config",           "out",              "log-every",         "metrics-flush-every",
      "checkpoint-every", "checkpoint-dir",   "keep-checkpoints",  "resume",
      "export-dtype",     "export-checkpoints", "peer-timeout",    "prefetch-depth",
      "hs-queue-depth",   "power-budget-w",   "help",              "measure-only",
      "rebalance",        "rebalance-min-gain",  // when the split changes (the split may change on a resume)
      "report-to",        "report-every",        // where the series go, not what is trained
      "data-plane",       "grad-bucket-mb",  // how bytes travel, not what is trained
      "eval-data",        "eval-every",      // what is measured, not what is trained
      "eval-max-tokens",
      "eval-tau-every",   "eval-tau-prompts", "eval-tau-max-new-tokens", "eval-tau-prompt-batch",
      // How the weights and moments are stored between steps: a checkpoint holds them in fp32 whichever it
      // was, and the other mode loads it (rounded to nearest into bf16), so a resume may switch
      // (docs/checkpoint.md "Changing the optimizer state").
      "optimizer-state",
  };
  if (may_change.count(name)) return true;
  return name.rfind("inject-", 0) == 0;  // test hooks
}

OptionMap resume_invariants(const std::vector<std::pair<std::string, std::string>>& resolved) {
  OptionMap m;
  for (const auto& [name, value] : resolved)
    if (!option_may_change_on_resume(name)) m[name] = value;
  return m;
}

std::string options_hash(const OptionMap& invariants) {
  std::string canonical;
  for (const auto& [k, v] : invariants) {
    canonical += k;
    canonical += '\0';
    canonical += v;
    canonical += '\n';
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(content_hash64(canonical.data(), canonical.size())));
  return hex;
}

// Options added after checkpoints were already being written, with the value that means what a checkpoint
// made before the option existed was trained with: such a checkpoint lacks the option, and resuming it with
// that value changes nothing (any other value is refused as a change).
bool option_absent_means(const std::string& name, const std::string& value) {
  static const std::map<std::string, std::string> before_it_existed = {
      {"anchors-per-record", "0"},   // anchors per packed batch only
      {"grad-accum", "1"},           // one packed batch per optimizer step
      {"global-batch-tokens", "0"},  // --grad-accum decides
      // The optimizer's settings before they followed the reference recipe (docs/recipe.md).
      {"adam-beta1", "0.9"},
      {"adam-beta2", "0.95"},
      {"adam-eps", "1e-08"},
      {"weight-decay", "0.01"},
      {"min-lr-ratio", "0.1"},
      // DFlash2 (issue 29): before it, every drafter was a DFlash one with the identity compute_logits.
      {"draft-arch", "dflash"},
      {"conv-kernel-size", "2"},
      {"conv-group-size", "16"},
      {"selector-top-k", "16"},
      {"selector-rank", "256"},
      {"output-multiplier", "1"},
      {"logit-softcap", "0"},
      {"selector-loss-alpha", "1"},
      {"selector-stop-gradient", "false"},
      // Issue 47: before it the selector trained on the label-inserted candidates with a constant alpha.
      {"selector-candidates", "insert"},
      {"selector-warmup-ratio", "0"},
      {"selector-ramp-ratio", "0"},
      // a fresh drafter's heads: the target's
      {"draft-heads", "0"},
      {"draft-head-dim", "0"},
      {"draft-kv-heads", "0"},
      // Issue 46: before --hs-dtype, hidden states travelled in the backend's dtype.
      {"hs-dtype", "bf16"},
  };
  const auto it = before_it_existed.find(name);
  return it != before_it_existed.end() && it->second == value;
}

bool option_extends_run(const std::string& name) { return name == "epochs" || name == "max-steps"; }

bool option_follows_split(const std::string& name) {
  return name == "topology" || name == "world-size" || name == "grad-accum";
}

namespace {
bool is_identity_key(const std::string& k) { return k.rfind(kIdentityKeyPrefix, 0) == 0; }
// "content:data" -> "the dataset (--data)".
std::string identity_subject(const std::string& k) {
  if (k == kDataIdentityKey) return "the dataset (--data)";
  if (k == kTargetIdentityKey) return "the target's weights (--target)";
  if (k == kTargetConfigIdentityKey) return "the target's config.json (--target)";
  return k;
}
// The content identities that stand for an input option's path: the path may change when they all match.
std::vector<std::string> identities_of_path(const std::string& option) {
  if (option == "target") return {kTargetIdentityKey, kTargetConfigIdentityKey};
  if (option == "data") return {kDataIdentityKey};
  return {};
}
// Whether every identity of `option`'s input is recorded on both sides, and equal: the same content at
// another path (a model staged on node-local scratch per Slurm job).
bool same_content_elsewhere(const std::string& option, const OptionMap& saved, const OptionMap& now) {
  const std::vector<std::string> keys = identities_of_path(option);
  if (keys.empty()) return false;
  for (const std::string& k : keys) {
    const auto a = saved.find(k), b = now.find(k);
    if (a == saved.end() || b == now.end() || a->second != b->second) return false;
  }
  return true;
}
}  // namespace

std::vector<std::string> check_resume_compatible(const OptionMap& saved, const OptionMap& now,
                                                 const std::string& checkpoint, ResumeSplit split) {
  std::vector<std::string> changes, content, notes;
  for (const auto& [k, v] : saved) {
    auto it = now.find(k);
    if (split == ResumeSplit::Changed && option_follows_split(k)) continue;
    if (option_extends_run(k)) continue;  // a run may be extended (or ended sooner): the schedule is re-planned
    if (is_identity_key(k)) {
      // One side without it: a checkpoint of a build before identities, or a caller that has no inputs.
      if (it != now.end() && it->second != v)
        content.push_back(identity_subject(k) + " at the same path is not what the checkpoint was trained on: " +
                          describe_identity_change(v, it->second));
    } else if (it == now.end()) {
      changes.push_back("--" + k + ": saved '" + v + "', now not set");
    } else if (it->second != v && same_content_elsewhere(k, saved, now)) {
      notes.push_back("--" + k + " moved: " + v + " -> " + it->second + ", same content");
    } else if (it->second != v) {
      changes.push_back("--" + k + ": saved '" + v + "', now '" + it->second + "'");
    }
  }
  for (const auto& [k, v] : now)
    if (!saved.count(k) && !is_identity_key(k) && !option_absent_means(k, v) &&
        !(split == ResumeSplit::Changed && option_follows_split(k)) && !option_extends_run(k))
      changes.push_back("--" + k + ": not in the checkpoint, now '" + v + "'");
  // A checkpoint of a build before config.json was fingerprinted: its weights are compared, its config
  // cannot be (docs/checkpoint.md "What a resume checks").
  if (saved.count(kTargetIdentityKey) && !saved.count(kTargetConfigIdentityKey) && now.count(kTargetConfigIdentityKey))
    notes.push_back("the checkpoint predates config.json fingerprints: the target's weights are compared, its "
                    "config.json cannot be (keep it as it was); checkpoints written from now on record it");
  if (changes.empty() && content.empty()) return notes;
  std::string list;
  for (const std::string& c : changes) list += "\n    " + c;
  for (const std::string& c : content) list += "\n    " + c;
  if (changes.empty())
    DF_FAIL(BadInput, "cannot resume from " << checkpoint << ": its inputs changed:" << list,
            "resume on the dataset and target (weights and config.json) the checkpoint was trained on (put them "
            "back at their paths), or start a new run (another --out or --checkpoint-dir, or no --resume)");
  DF_FAIL(BadOptions,
          "cannot resume from " << checkpoint << ": " << changes.size()
                                << " option(s) that must not change across a resume differ" << (content.empty() ? "" : ", and its inputs changed") << ":" << list,
          "resume with the options the checkpoint was made with, or start a new run (another --out or "
          "--checkpoint-dir, or no --resume)");
}

}  // namespace dflash
