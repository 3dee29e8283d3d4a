// EvalSums: include/dflash/eval_stats.h.
#include "dflash/eval_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dflash/error.h"

namespace dflash {

EvalSums::EvalSums(int b)
    : block_size(b), pos_rows(static_cast<size_t>(b), 0.0), pos_correct(static_cast<size_t>(b), 0.0) {}

void EvalSums::add(const StepStats& st, int64_t num_seqs) {
  DF_CHECK(st.per_pos_rows.size() == pos_rows.size() && st.per_pos_correct.size() == pos_correct.size(), Internal,
           "eval batch stats for block size " << st.per_pos_rows.size() << ", expected " << block_size);
  weighted_loss += st.loss * st.weight_sum;
  weight_sum += st.weight_sum;
  for (size_t k = 0; k < pos_rows.size(); ++k) {
    pos_rows[k] += st.per_pos_rows[k];
    pos_correct[k] += st.per_pos_correct[k];
    rows += st.per_pos_rows[k];
    correct += st.per_pos_correct[k];
  }
  streak_sum += st.streak_sum;
  anchors += static_cast<double>(st.anchors);
  tokens += static_cast<double>(st.tokens);
  seqs += static_cast<double>(num_seqs);
}

std::vector<double> EvalSums::pack() const {
  std::vector<double> v = {weighted_loss, weight_sum, rows, correct, streak_sum, anchors, tokens, seqs};
  v.insert(v.end(), pos_rows.begin(), pos_rows.end());
  v.insert(v.end(), pos_correct.begin(), pos_correct.end());
  return v;
}

EvalSums EvalSums::unpack(const std::vector<double>& v, int b) {
  DF_CHECK(v.size() == 8 + 2 * static_cast<size_t>(b), Internal, "eval sums of " << v.size() << " values for block size " << b);
  EvalSums s(b);
  s.weighted_loss = v[0];
  s.weight_sum = v[1];
  s.rows = v[2];
  s.correct = v[3];
  s.streak_sum = v[4];
  s.anchors = v[5];
  s.tokens = v[6];
  s.seqs = v[7];
  for (int k = 0; k < b; ++k) {
    s.pos_rows[k] = v[8 + k];
    s.pos_correct[k] = v[8 + b + k];
  }
  return s;
}

EvalMetrics EvalSums::metrics() const {
  EvalMetrics m;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  m.loss = weight_sum > 0 ? weighted_loss / weight_sum : nan;
  m.acc = rows > 0 ? correct / rows : nan;
  m.streak = anchors > 0 ? streak_sum / anchors : nan;
  for (int k = 1; k < block_size; ++k)  // position 0 is the anchor: never predicted
    m.acc_by_pos.push_back(pos_rows[k] > 0 ? pos_correct[k] / pos_rows[k] : nan);
  m.tokens = std::llround(tokens);
  m.anchors = std::llround(anchors);
  m.seqs = std::llround(seqs);
  return m;
}

int64_t resolve_eval_every(int64_t given, int64_t checkpoint_every_steps, int64_t planned_steps) {
  if (given >= 0) return given;
  if (checkpoint_every_steps > 0) return checkpoint_every_steps;
  if (planned_steps <= 0) return 0;
  return std::max<int64_t>(1, std::llround(static_cast<double>(planned_steps) / 10.0));
}

}  // namespace dflash
