// Loss rows, position weights and metrics of the DFlash objective (host side).
//
// Block n (anchor a, sequence [s0, s1)) position k predicts token a + k. A position becomes a loss row
// only if its weight is positive:  w = [a+k < s1] [k > 0] loss_mask[a+k] exp(-(k-1)/gamma).
// Rows with zero weight never reach the lm_head: they contribute nothing to loss, accuracy or gradients
// (the streak skips them as the reference does).
#pragma once
#include <cstdint>
#include <vector>

#include "dflash/drafter.h"

namespace dflash::train {

struct LossRows {
  std::vector<int32_t> block_row;   // [R] row in the block stream (n * B + k)
  std::vector<int32_t> label;       // [R] tokens[a + k]
  std::vector<int32_t> teacher_at;  // [R] global token a + k - 1 whose target logits predict a + k
  std::vector<float> weight;        // [R] decay weight w (before normalisation)
  std::vector<int32_t> block;       // [R] n
  std::vector<int32_t> offset;      // [R] k
  void clear();
  size_t size() const { return label.size(); }
};

// Fills rows for the anchors (global indices; seq_end[n] = end of anchor n's sequence).
void build_loss_rows(const PackedBatch& batch, const std::vector<int32_t>& anchors,
                     const std::vector<int32_t>& seq_end, int block_size, float gamma, LossRows& rows);

// D-PACE factors d_k = sum_{m>=k} prod_{j<=m} c_j per row (see drafter.h), c = exp(-ce) of each row.
// Rows of one block are consecutive and in increasing k (as build_loss_rows makes them).
void dpace_factors(const LossRows& rows, const float* ce, int block_size, std::vector<double>& out);

// Metrics exactly as the reference's losses(): acc and agree over rows, streak = mean over blocks of
// the leading run of correct rows (skipping positions without a row), per-position accuracy.
// argmax_p may be null (agree = NaN).
void fill_metrics(const LossRows& rows, const int32_t* argmax_q, const int32_t* argmax_p, int64_t num_blocks,
                  int block_size, StepStats& st);

struct EngineRows;
// DFlash2's loss terms and selector metrics into st (docs/dflash2.md 3.1): loss_unary and loss_sel
// (each sum_r w_r term_r / sum w), candidate recall and the selector's teacher-forced accuracy over rows
// (correct only where the gold is in the strict unary top-K: there the training candidates are that top-K).
void fill_selector_metrics(const LossRows& rows, const EngineRows& out, StepStats& st);

}  // namespace dflash::train
