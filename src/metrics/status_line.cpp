// The operator's one-line status (docs/metrics.md "The status line"). Pure formatting, unit-tested.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "dflash/metrics.h"

namespace dflash {

namespace {

std::string printf_str(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// 950 -> "950", 25100 -> "25.1K", 3.2e6 -> "3.2M"
std::string si_count(double v) {
  if (!std::isfinite(v)) return "?";
  if (v < 1e3) return printf_str("%.0f", v);
  if (v < 1e6) return printf_str("%.1fK", v / 1e3);
  if (v < 1e9) return printf_str("%.1fM", v / 1e6);
  return printf_str("%.1fG", v / 1e9);
}

std::string power(double w) {
  if (w < 1000) return printf_str("%.0fW", w);
  return printf_str("%.1fkW", w / 1000);
}

// [3/4, 4/4] against a known capacity (a full queue reads as full at a glance), else [3, 4].
std::string depth_list(const std::vector<int>& v, int capacity) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
    if (capacity > 0) s += "/" + std::to_string(capacity);
  }
  return s + "]";
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  // Truncate (never show "60s" or "60m"): the status line says how long it has been at least.
  if (seconds < 60) return std::to_string(static_cast<int64_t>(seconds)) + "s";
  if (seconds < 3600) return std::to_string(static_cast<int64_t>(seconds / 60)) + "m";
  if (seconds < 86400) {
    const int64_t total_m = static_cast<int64_t>(seconds / 60);
    return std::to_string(total_m / 60) + "h" + std::to_string(total_m % 60) + "m";
  }
  return printf_str("%.1fd", seconds / 86400);
}

std::string format_status_line(const StatusInputs& in) {
  std::string s = "[" + format_duration(in.elapsed_s) + "]";
  s += " step=" + std::to_string(in.step);
  if (in.grad_accum > 1) s += " (x" + std::to_string(in.grad_accum) + " mb)";
  s += printf_str(" loss=%.4f", in.loss);
  s += printf_str(" acc=%.3f", in.acc);
  s += printf_str(" streak=%.2f", in.streak);  // as the [eval] line: one decimal hid everything below 0.05
  if (std::isfinite(in.candidate_recall)) s += printf_str(" recall=%.3f", in.candidate_recall);
  if (std::isfinite(in.selector_acc)) s += printf_str(" sel_acc=%.3f", in.selector_acc);
  s += printf_str(" lr=%.2e", in.lr);
  s += printf_str(" noise=%.4f", in.noise);
  // "batch/s" spelt out: "b/s" read as bits per second.
  s += printf_str(" | tgt=%.2f batch/s", in.target_batches_per_s);
  s += printf_str(" dft=%.2f batch/s", in.drafter_batches_per_s);
  s += " (" + si_count(in.tokens_per_s) + "tok/s)";
  if (in.power_w) s += " pwr=" + power(*in.power_w);
  if (in.colocated) s += " | colocated";
  s += " | q_pre=" + depth_list(in.q_pre, in.q_pre_capacity) + " q_hs=" + depth_list(in.q_hs, in.q_hs_capacity);
  s += printf_str(" | epoch~%.2f", in.epoch);
  s += " ETA=" + (in.eta_s ? format_duration(*in.eta_s) : std::string("?"));
  if (in.eta_s && in.eta_eval_s > 0) s += " (eval " + format_duration(in.eta_eval_s) + ")";
  return s;
}

std::string format_eval_line(const EvalMetrics& m) {
  std::string s = "[eval] step=" + std::to_string(m.step);
  s += printf_str(" loss=%.4f", m.loss);
  s += printf_str(" acc=%.3f", m.acc);
  s += printf_str(" streak=%.2f", m.streak);
  if (std::isfinite(m.tau)) s += printf_str(" tau=%.3f", m.tau);
  s += " (" + std::to_string(m.seqs) + " seqs, " + si_count(static_cast<double>(m.tokens)) + " tok";
  s += printf_str(", %.1f s)", m.seconds);
  return s;
}

double remaining_eval_s(const EtaInputs& in, double end_step) {
  if (in.eval_every < 0 || in.evals_done <= 0 || !(in.eval_s > 0)) return 0;
  const int64_t end = static_cast<int64_t>(std::ceil(end_step));
  if (end <= in.step) return 0;
  int64_t due = 0;
  if (in.eval_every > 0) due = end / in.eval_every - in.step / in.eval_every;
  if (in.eval_every == 0 || end % in.eval_every != 0) ++due;  // the one after the last step
  return static_cast<double>(due) * in.eval_s / static_cast<double>(in.evals_done);
}

std::optional<double> estimate_eta_s(const EtaInputs& in) {
  const int64_t done = in.step - in.segment_first_step;
  const double train_s = in.segment_train_s - std::max(0.0, in.eval_s);  // the evaluations are counted apart
  if (done <= 0 || !(train_s > 0)) return std::nullopt;
  const double steps_per_s = static_cast<double>(done) / train_s;
  std::optional<double> remaining_steps;
  if (in.max_steps > 0) remaining_steps = static_cast<double>(std::max<int64_t>(in.max_steps - in.step, 0));
  if (in.epochs > 0 && in.epoch > 0) {
    const double steps_per_epoch = static_cast<double>(in.step) / in.epoch;
    const double by_epochs = std::max(0.0, (in.epochs - in.epoch) * steps_per_epoch);
    remaining_steps = remaining_steps ? std::min(*remaining_steps, by_epochs) : by_epochs;
  }
  if (!remaining_steps) return std::nullopt;
  return *remaining_steps / steps_per_s + remaining_eval_s(in, static_cast<double>(in.step) + *remaining_steps);
}

}  // namespace dflash
