// Loss rows, weights, D-PACE factors and metrics (see objective.h).
#include "drafter/objective.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dflash/error.h"
#include "drafter/trainer_engine.h"

namespace dflash::train {

void LossRows::clear() {
  block_row.clear();
  label.clear();
  teacher_at.clear();
  weight.clear();
  block.clear();
  offset.clear();
}

void build_loss_rows(const PackedBatch& batch, const std::vector<int32_t>& anchors,
                     const std::vector<int32_t>& seq_end, int block_size, float gamma, LossRows& rows) {
  rows.clear();
  DF_ASSERT(anchors.size() == seq_end.size());
  for (size_t n = 0; n < anchors.size(); ++n) {
    const int64_t a = anchors[n];
    for (int k = 1; k < block_size; ++k) {
      const int64_t p = a + k;
      if (p >= seq_end[n] || !batch.loss_mask[static_cast<size_t>(p)]) continue;
      rows.block_row.push_back(static_cast<int32_t>(n * block_size + k));
      rows.label.push_back(batch.tokens[static_cast<size_t>(p)]);
      rows.teacher_at.push_back(static_cast<int32_t>(p - 1));
      rows.weight.push_back(static_cast<float>(std::exp(-static_cast<double>(k - 1) / gamma)));
      rows.block.push_back(static_cast<int32_t>(n));
      rows.offset.push_back(k);
    }
  }
}

void dpace_factors(const LossRows& rows, const float* ce, int block_size, std::vector<double>& out) {
  const size_t R = rows.size();
  out.assign(R, 0.0);
  size_t r = 0;
  std::vector<double> prefix;  // prod_{j<=k} c_j over the block's rows (missing positions count as c = 1)
  while (r < R) {
    size_t e = r;
    while (e < R && rows.block[e] == rows.block[r]) ++e;
    prefix.assign(e - r, 0.0);
    double prod = 1.0;
    for (size_t i = r; i < e; ++i) {
      prod *= std::exp(-static_cast<double>(ce[i]));
      prefix[i - r] = prod;
    }
    double suffix = 0.0;  // d_k = sum_{m >= k} prefix_m
    for (size_t i = e; i-- > r;) {
      suffix += prefix[i - r];
      out[i] = suffix;
    }
    r = e;
  }
  (void)block_size;
}

void fill_metrics(const LossRows& rows, const int32_t* argmax_q, const int32_t* argmax_p, int64_t num_blocks,
                  int block_size, StepStats& st) {
  const size_t R = rows.size();
  std::vector<double> pos_ok(static_cast<size_t>(block_size), 0.0), pos_n(static_cast<size_t>(block_size), 0.0);
  double ok = 0, agree = 0, streak = 0;
  int32_t cur_block = -1;
  bool running = false;
  for (size_t r = 0; r < R; ++r) {
    const bool correct = argmax_q[r] == rows.label[r];
    ok += correct;
    if (argmax_p) agree += argmax_q[r] == argmax_p[r];
    pos_ok[static_cast<size_t>(rows.offset[r])] += correct;
    pos_n[static_cast<size_t>(rows.offset[r])] += 1;
    if (rows.block[r] != cur_block) {
      cur_block = rows.block[r];
      running = true;
    }
    if (running && correct) {
      streak += 1;
    } else {
      running = false;
    }
  }
  const double count = static_cast<double>(R);
  st.acc = count > 0 ? ok / count : 0.0;
  st.agree = argmax_p ? (count > 0 ? agree / count : 0.0) : std::numeric_limits<double>::quiet_NaN();
  st.streak = num_blocks > 0 ? streak / static_cast<double>(num_blocks) : 0.0;
  st.per_pos_acc.assign(static_cast<size_t>(block_size), 0.0);
  for (int k = 0; k < block_size; ++k) st.per_pos_acc[k] = pos_ok[k] / std::max(1.0, pos_n[k]);
  st.per_pos_rows = pos_n;
  st.per_pos_correct = pos_ok;
  st.streak_sum = streak;
}

void fill_selector_metrics(const LossRows& rows, const EngineRows& out, StepStats& st) {
  double wsum = 0, unary = 0, sel = 0, covered = 0, correct = 0;
  const size_t R = rows.size();
  for (size_t r = 0; r < R; ++r) {
    const double w = rows.weight[r];
    wsum += w;
    unary += w * out.unary[r];
    sel += w * out.sel_ce[r];
    covered += out.covered[r] != 0;
    correct += out.covered[r] != 0 && out.sel_argmax[r] == rows.label[r];
  }
  st.loss_unary = wsum > 0 ? unary / wsum : 0.0;
  st.loss_sel = wsum > 0 ? sel / wsum : 0.0;
  st.loss_rows = static_cast<double>(R);
  st.covered_rows = covered;
  st.selector_correct_rows = correct;
  st.candidate_recall = R > 0 ? covered / static_cast<double>(R) : 0.0;
  st.selector_acc = R > 0 ? correct / static_cast<double>(R) : 0.0;
}

}  // namespace dflash::train
