// The DFlash drafter's training step on CUDA: the twin of DrafterNet (src/drafter/drafter_net.cpp) plus the
// trainer's loss and optimizer, with bf16 activations and weights for compute and fp32 master weights,
// gradients and AdamW state. Built from the CUDA ops only (cuBLAS(Lt) GEMMs, kernels/*.cu), so it lives
// in the CUDA library; the caller supplies the parameter layout (drafter_param_layout) and the loss rows
// (train::build_loss_rows), both host-side.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "dflash/drafter_model.h"
#include "dflash/drafter_ops.h"
#include "dflash/hf_config.h"
#include "dflash/optim.h"
#include "dflash/tensor.h"
#include "drafter/trainer_engine.h"  // train::DrafterBatch

namespace dflash::cuda {

struct DrafterStepResult {
  double loss = 0, weight_sum = 0;
  std::vector<float> row_loss;     // [R] CE or KL per row (the objective's)
  std::vector<float> row_ce;       // [R] CE per row (D-PACE's acceptance estimate needs it under KL too)
  std::vector<int32_t> argmax_q;   // [R]
  std::vector<int32_t> argmax_p;   // [R] the teacher's argmax when the batch has final_norm, else empty
  // DFlash2 (empty for DFlash): row_loss = unary + alpha * sel_ce; unary [R]; the selector's CE [R]; the gold
  // in the unary top-K [R]; the selector's teacher-forced pick (token) [R]; the strict top-K ids and
  // transformed logits [R, K] and u = h W_h^T [R, r] (the serving walk's inputs).
  std::vector<float> unary, sel_ce, topk_vals, u;
  std::vector<uint8_t> covered;
  std::vector<int32_t> sel_token, topk_ids;
};

class DrafterStepCuda {
 public:
  // layout = drafter_param_layout(c). Allocates every buffer once (max_tokens context tokens,
  // max_anchors blocks, lm_head rows in chunks of chunk_rows). state (--optimizer-state): Fp32 keeps fp32
  // master weights and moments beside the bf16 weights; Bf16 keeps the bf16 weights as the state and bf16
  // moments, updated with stochastic rounding seeded by sr_seed (ops::adamw_step_bf16state; DFlash2's conv
  // base kernels and codebooks, which its ops read as fp32, get fp32 copies refreshed after each update).
  DrafterStepCuda(const DrafterConfig& c, const std::vector<ParamSpec>& layout, const Ctx& ctx, int64_t max_tokens,
                  int64_t max_anchors, int64_t chunk_rows, OptimizerState state = OptimizerState::Fp32,
                  uint64_t sr_seed = 0);
  ~DrafterStepCuda();
  DrafterStepCuda(const DrafterStepCuda&) = delete;
  DrafterStepCuda& operator=(const DrafterStepCuda&) = delete;

  // Flat fp32 master weights / gradients / moments [P] and the bf16 weights the forward reads. With the
  // bf16 state, params() is empty (no fp32 copy exists), adam_m() and adam_v() are BF16 [P].
  OptimizerState optimizer_state() const;
  const Tensor& params() const;
  const Tensor& grads() const;
  const Tensor& params_bf16() const;
  const Tensor& adam_m() const;
  const Tensor& adam_v() const;
  // After writing the weights (params() with the fp32 state, params_bf16() with the bf16 state): refresh the
  // bf16 copy (fp32 state) and zero the optimizer state.
  void reset_from_params();
  // The target's frozen embedding and lm_head, BF16 [V, H] on the device (not owned).
  void set_frozen(const Tensor& embed, const Tensor& lm_head);
  // DFlash2: the selector's training candidates and whether its inputs are detached (docs/dflash2.md 3);
  // the term's weight comes with each batch (DrafterBatch::selector_alpha, the schedule's value).
  void set_selector_objective(SelectorCandidates candidates, bool stop_gradient);

  // The batch (train::DrafterBatch, read in place): fb->features [k, T, H] BF16 on the device (wire
  // layout), fb->final_norm [T, H] BF16 or empty (the KL objective needs it); in->tokens, ctx_pos, anchors,
  // seq_begin; rows (loss rows with a positive weight only: block-stream row, label, teacher token, decay
  // weight, not normalised); noise_std / noise_seed / noise_counter: training noise on the fused features
  // th = hidden_norm(fc(ctx)) (feature_noise.cuh), std 0 = none. b.ready (may be empty) is called with
  // each parameter's range [begin, end) of grads() right after the last kernel that writes it is enqueued:
  // the range is final once the work enqueued so far on the context's stream has run (the gradient sum over
  // drafters starts on it; grad_reducer.h). Order: norm, then each layer from the last (down_proj first,
  // input_layernorm last), hidden_norm and fc last.

  // Forward + backward: gradients of sum_r w_r loss_r / sum_r w_r left in grads() (overwritten).
  // With final_norm in the batch the teacher logits are computed too (argmax_p; the KL objective's p).
  // A batch without loss rows leaves grads() zero and reports nothing.
  DrafterStepResult forward_backward(const train::DrafterBatch& b, ops::LossObjective objective);
  // Forward and loss rows only (evaluation, or the first pass of D-PACE); grads() untouched.
  DrafterStepResult forward_loss(const train::DrafterBatch& b, ops::LossObjective objective);
  // After forward_loss() on b (its activations are still here): the gradient of sum_r row_weight[r] loss_r
  // (row_weight [R] already normalised) with the logits recomputed chunk by chunk, then the drafter backward
  // into grads() (overwritten), reporting to b.ready. D-PACE's weights depend on the forward.
  void backward_rows(const train::DrafterBatch& b, const std::vector<float>& row_weight, ops::LossObjective objective);
  // Global-norm clip + AdamW (1-based step) + bf16 weight refresh in one pass (the bf16 state: the
  // stochastically rounded update of the bf16 weights and moments). Returns the pre-clip norm
  // (synchronizes to read it).
  double optimizer_step(const ops::AdamWHyper& hyper, int64_t step, float clip);
  // The final-normed hidden states [N*B, H] (BF16) of the last forward.
  Tensor hidden() const;

  // Time breakdown (benchmarks): with profiling on, every op is bracketed by CUDA events and its time is
  // added to its phase; phase_ms() synchronizes and returns the sums since the last call, by DrafterPhase.
  enum class Phase : int { Gemm, Attention, Loss, Optimizer, Other, Count };
  void set_profiling(bool on);
  std::vector<double> phase_ms();

  struct Impl;

 private:
  Impl* impl_;
};

}  // namespace dflash::cuda
