// The drafter part of a golden case (tests/data/golden/<case>/, layout in its README): losses, metrics,
// every gradient and two AdamW steps of DrafterTrainer against the reference numbers. Used by the unit
// tests and by dflash-selftest. Target hidden states and final_norm come from golden.safetensors, so the
// check does not depend on the target forward.
#pragma once
#include <string>
#include <vector>

#include "dflash/drafter.h"

namespace dflash::train {

struct GoldenCheck {
  std::string name;  // "loss_ce", "grad.ce.layers.0.self_attn.q_proj.weight", "after2.fc.weight", ...
  double err = 0;    // relative error ||x - ref|| / ||ref|| (absolute where the reference is 0)
  double tol = 0;
  std::vector<int64_t> shape;  // {} for scalars
  double max_abs = 0;          // max |x - ref|
  bool ok() const { return err <= tol; }
};

struct DrafterGoldenReport {
  std::vector<GoldenCheck> checks;
  bool ok() const;
  int failures() const;
};

// The inputs of a golden case as the trainer takes them: the packed batch, the features of the case's
// layer_ids [k, T, H], the target's final_norm [T, H], the anchors (global), and TrainOptions with the
// case's gamma and AdamW settings (no warmup, no schedule, no noise). Paths: case_dir/target and
// case_dir/drafter_init.
struct GoldenInputs {
  std::string target_dir, drafter_dir;
  PackedBatch batch;
  std::vector<float> features, final_norm;
  std::vector<int> layer_ids;
  int64_t num_layers = 0, hidden = 0;
  std::vector<int64_t> anchors;
  TrainOptions opt;
  FeatureBatch feature_batch() const;  // views into this object
};
GoldenInputs load_golden_inputs(const std::string& case_dir);
// Sequences [s0, s1) of g's batch as a case of their own: their tokens, loss mask, features, final norm
// and the anchors inside them (shifted), the same model and options (gradient accumulation's tests: the
// halves of a batch as micro-batches).
GoldenInputs golden_sequences(const GoldenInputs& g, int s0, int s1);

// Runs every check of the case in `case_dir` with DrafterTrainer on ctx's backend. Missing or malformed
// files are BadInput errors. CPU (float32): scalars to 1e-5, tensors and the selector schedule's losses after
// its first AdamW step to 1e-4 (drafter_golden.cpp kSteppedLossTol says why). CUDA (bf16 compute): losses
// to 1e-2 (the selector schedule's after its first step to 3e-2: kSteppedLossTolCuda), gradient norms and
// all gradients together to 3e-2, each gradient tensor to 6e-2 (the budget of
// tests/gpu/test_drafter_golden.cpp), acc/agree/streak to 0.1 (a near-tie argmax may flip under bf16),
// weight_sum (host arithmetic) to 1e-5; the weights after the two AdamW steps are not compared there (a
// gradient whose sign flips under bf16 moves its weight by 2 lr), their losses are. A DFlash2 case (its
// case.json has "objectives") on CUDA holds all gradients together to 5e-2 and each tensor to 1e-1 (the
// convs' extra bf16 roundings; drafter_golden.cpp says what was measured).
DrafterGoldenReport run_drafter_golden(const std::string& case_dir, const Ctx& ctx = cpu_ctx());

}  // namespace dflash::train
