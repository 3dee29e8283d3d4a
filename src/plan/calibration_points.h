// The measurements the calibration (src/plan/gpu_calibration.cpp) is fitted to and checked against, each with
// the shape the bench ran and where the number is recorded, and the model shapes of the project's recipes
// (Qwen3-8B, Qwen3.6-27B hybrid, its DFlash2 drafter). tests/unit/test_cost_model.cpp holds the model to
// +-15 % of every point (issue 44's bar); docs/cost_model.md prints the same table.
#pragma once
#include <string>
#include <vector>

#include "plan/cost_model.h"

namespace dflash::plan {

// ---- model shapes --------------------------------------------------------------------------------------
// Qwen3-8B (hidden 4096, 36 layers); layers_run 36 with the final norm, 34 for a CE job (captures 1..33).
TargetShape qwen3_8b_target(int layers_run = 36);
// Qwen3.6-27B / Qwen3.8-27B text (64 layers, every 4th full attention: 3, 7, ..., 63); layers_run 64, or 62
// for a CE job (captures 1..61).
TargetShape qwen36_27b_target(int layers_run = 64);
// Their drafters as bench/drafter_bench.cpp builds them: 5 layers with the target's widths; 27B: 4 sliding
// (2048) + 1 full. DFlash2: block 8, convs of 2 taps over groups of 16, top-16 selector of rank 256.
DrafterShape qwen3_8b_drafter(LossObjective objective = LossObjective::CE, OptimizerState state = OptimizerState::Fp32);
DrafterShape qwen36_27b_drafter(OptimizerState state = OptimizerState::Fp32);
DrafterShape qwen36_27b_dflash2_drafter(OptimizerState state = OptimizerState::Fp32);

// ---- measurements --------------------------------------------------------------------------------------
enum class MeasuredRole : uint8_t { TargetForward, DrafterStep };

struct CalibrationPoint {
  std::string label;    // "8B forward 4x4096"
  std::string gpu;      // "h200"
  std::string source;   // where the number is recorded
  MeasuredRole role = MeasuredRole::TargetForward;
  TargetShape target;
  PackedBatchShape target_batch;
  DrafterShape drafter;
  DrafterBatchShape drafter_batch;
  double measured_ms = 0;
};
const std::vector<CalibrationPoint>& calibration_points();

// The model's time for a point (ms), from the builtin table's entry for its GPU.
double predicted_ms(const CalibrationPoint& p);

}  // namespace dflash::plan
