// The backend half of DrafterTrainer (src/drafter/trainer.cpp): the drafter network, the loss rows through
// the frozen lm_head, the gradient and optimizer state on one device. The trainer keeps everything that
// must mean the same on every backend (batch checks, anchors, loss rows and their weights, D-PACE
// factors, metrics, schedule, RNG state) and drives an engine:
//   CPU  (trainer_engine_cpu.cpp): DrafterNet + ops::lm_loss + ops::adamw, float32, host buffers;
//   CUDA (cuda/trainer_engine_cuda.cpp, in the CUDA library; make_cuda_trainer_engine is its slot,
//        below): cuda::DrafterStepCuda, bf16 compute with fp32 master weights,
//        gradients and AdamW state on the device (--optimizer-state bf16: bf16 weights and moments).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dflash/drafter.h"
#include "dflash/drafter_model.h"
#include "dflash/error.h"
#include "dflash/optim.h"
#include "dflash/rng.h"
#include "drafter/objective.h"

namespace dflash::train {

// What an engine is built from (host side). The trainer has checked the config against the target.
struct EngineSetup {
  DrafterConfig cfg;
  std::vector<ParamSpec> layout;
  Ctx ctx;
  LossKind loss = LossKind::CE;
  int64_t max_tokens = 0, max_anchors = 0;
  int64_t chunk_rows = 0;   // lm_head rows per chunk of logits
  Buffer params;            // F32 [P] host: the initial (or loaded) master weights; the engine takes it
  // --optimizer-state and the key of its stochastic rounding (Bf16 only; derived from --seed by the trainer).
  OptimizerState optimizer_state = OptimizerState::Fp32;
  uint64_t sr_seed = 0;
  Buffer embed, lm_head;    // F32 [V, H] host: the target's frozen tables; the engine takes them
  bool tied = false;        // lm_head is a copy of embed (tie_word_embeddings)
  // DFlash2's selector term (cfg.arch == DFlash2): its training candidates and whether its inputs are
  // detached (its weight comes with each batch: DrafterBatch::selector_alpha).
  SelectorCandidates selector_candidates = SelectorCandidates::Strict;
  bool selector_stop_gradient = false;
};

// The drafter's batch as the engines and the CUDA step read it: views of what the trainer built (the
// features on the engine's device, everything else host-side), nothing copied.
struct DrafterBatch {
  const FeatureBatch* fb = nullptr;
  const DrafterStepInput* in = nullptr;  // anchors, seq_begin, ctx_pos, tokens (features unused)
  const LossRows* rows = nullptr;        // R >= 1 rows
  float noise_std = 0.f;                 // training noise on the fused features (0 = none)
  Rng* noise_rng = nullptr;              // the CPU's generator
  float selector_alpha = 1.f;            // DFlash2: the selector term's weight at this step (its schedule)
  uint64_t noise_seed = 0, noise_counter = 0;  // the CUDA's counter-based noise (feature_noise.cuh)
  // Called by the backward as ranges of grads() become final (GradHooks::ready); may be empty. An engine
  // need not report everything: the trainer reports what is left once the engine returns.
  GradReady ready;
};

// Per-row results of a loss pass, host memory valid until the next pass.
struct EngineRows {
  const float* loss = nullptr;        // [R] the objective's loss (CE or KL)
  const float* ce = nullptr;          // [R] CE (D-PACE's acceptance estimate)
  const int32_t* argmax_q = nullptr;  // [R]
  const int32_t* argmax_p = nullptr;  // [R] or null without a teacher (final_norm)
  // DFlash2 (null for DFlash): loss = unary + alpha * sel_ce per row; the selector's CE over the training
  // candidates (0 for a row without a selector term: strict candidates, label not among them), whether the
  // gold is in the unary top-K, and the selector's teacher-forced pick (a token).
  const float* unary = nullptr;         // [R] the unary term (CE or KL)
  const float* sel_ce = nullptr;        // [R]
  const uint8_t* covered = nullptr;     // [R]
  const int32_t* sel_argmax = nullptr;  // [R] token id
  // The serving walk's inputs (draft_block): the strict unary top-K [R, K] (ids, transformed logits) and
  // u = h W_h^T [R, r].
  const int32_t* topk_ids = nullptr;
  const float* topk_vals = nullptr;
  const float* u = nullptr;
};

class TrainerEngine {
 public:
  virtual ~TrainerEngine() = default;
  // The dtype the features and final_norm must have on ctx's device.
  virtual DType feature_dtype() const = 0;
  // Forward and loss rows. with_grad: also the loss gradient with the rows' decay weights normalised by
  // their sum, fused into the same pass, and the drafter backward: grads() overwritten.
  virtual EngineRows forward(const DrafterBatch& b, bool with_grad) = 0;
  // After forward(b, false) on the same batch: the gradient of sum_r weight[r] loss_r (weights [R],
  // normalised), logits recomputed, then the drafter backward: grads() overwritten.
  virtual void backward(const DrafterBatch& b, const std::vector<float>& weight) = 0;
  virtual void zero_grads() = 0;
  virtual Tensor grads() = 0;  // F32 [P] on ctx's device
  virtual void scale_grads(float s) = 0;
  // Global-norm clip + AdamW (1-based step); returns the pre-clip norm. The trainer checks it
  // (check_grad_norm); the CPU engine checks it too, before the weights move (CUDA clips on the device
  // and reads the norm afterwards: a non-finite one has reached the weights, the run ends either way).
  virtual double optimizer_step(const ops::AdamWHyper& hyper, int64_t step, float clip) = 0;
  // Host F32 [P] views of the master weights and AdamW moments: the live buffers on the CPU, mirrors
  // on CUDA (the bf16 state converted exactly): the moments refreshed from the device on each call, the
  // weights when an optimizer step or state_loaded changed them since the last call. After writing them,
  // state_loaded() makes them current (the bf16 state: rounded to the nearest bf16).
  // The final-normed hidden states [N*B, H] of the last forward (the engine's device and activation dtype).
  virtual Tensor last_hidden() = 0;
  virtual Tensor master_weights() = 0;
  virtual Tensor adam_m() = 0;
  virtual Tensor adam_v() = 0;
  virtual void state_loaded() = 0;
};

// Fatal (NonFiniteLoss, with a hint) unless the gradient norm is finite (0-based step).
void check_grad_norm(double norm, int64_t step);

std::unique_ptr<TrainerEngine> make_cpu_trainer_engine(EngineSetup setup);
// The CUDA engine's factory: a slot the CUDA library defines (cuda/trainer_engine_cuda.cpp), null in a
// build without it (no_cuda.cpp beside this file; core/cuda_entry.h tells the mechanism).
using MakeCudaTrainerEngine = std::unique_ptr<TrainerEngine>(EngineSetup setup);
extern MakeCudaTrainerEngine* const make_cuda_trainer_engine;

}  // namespace dflash::train
