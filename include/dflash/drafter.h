// The DFlash drafter and its training step (what drafter ranks run).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dflash/hf_config.h"
#include "dflash/target.h"
#include "dflash/tensor.h"

namespace dflash {

enum class LossKind : uint8_t { CE, KL };

struct TrainOptions {
  LossKind loss = LossKind::CE;
  bool dpace = false;          // D-PACE position weights on top of the decay weights
  float gamma = 7.0f;          // decay weights exp(-(k-1)/gamma)
  int max_anchors = 512;       // per packed batch
  float hs_noise = 0.0f;       // std of Gaussian noise on the fused target features (training only)
  // AdamW
  float lr = 6e-4f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.01f;
  float clip = 1.0f;           // global-norm clip; <= 0 disables
  int warmup_steps = 0;
  int64_t total_steps = 0;     // cosine decay to min_lr_ratio * lr at total_steps (0 = constant after warmup)
  float min_lr_ratio = 0.1f;
  uint64_t seed = 0;
};

// Per-step numbers (one drafter's batch).
struct StepStats {
  double loss = 0, acc = 0, agree = 0, streak = 0;
  double weight_sum = 0;
  double grad_norm = 0;   // before clipping
  double lr = 0, noise = 0;
  int64_t tokens = 0, anchors = 0;
  std::vector<double> per_pos_acc;  // [block_size]
};

// A feature batch as the drafter receives it (wire layout of TargetModel's CaptureOut).
struct FeatureBatch {
  const PackedBatch* batch = nullptr;  // tokens, cu_seqlens, loss_mask (host)
  Tensor features;    // [k, T, H]
  Tensor final_norm;  // [T, H]; needed by LossKind::KL only
};

class DrafterTrainer {
 public:
  // `target_dir` supplies the frozen embedding and lm_head (and the target config to check against);
  // `drafter_dir` a release-format drafter to start from, or empty to create a fresh one from the
  // target config with `num_layers` layers (seeded init).
  DrafterTrainer(const std::string& target_dir, const std::string& drafter_dir, int num_layers,
                 const TrainOptions& opt, const Ctx& ctx, int64_t max_tokens);
  ~DrafterTrainer();

  const DrafterConfig& config() const;

  // Forward + backward on one batch: anchors sampled (or given), loss, metrics; gradients left in
  // grads(). Anchors: positions within the packed batch (global token index), empty = sample.
  StepStats forward_backward(const FeatureBatch& fb, const std::vector<int64_t>& anchors = {});
  // Flat fp32 gradient buffer of every trainable parameter (one bucket for one allreduce).
  Tensor grads();
  // Clip (global norm over grads()), AdamW step, advance the schedule. Returns the pre-clip grad norm.
  double optimizer_step();
  // Forward only (evaluation, no noise): metrics and loss.
  StepStats evaluate(const FeatureBatch& fb, const std::vector<int64_t>& anchors = {});

  // Release-format I/O: config.json + model.safetensors (dtype F32 or BF16), atomic.
  void export_release(const std::string& dir, DType dtype) const;
  // Flat fp32 master weights and optimizer state (checkpointing).
  Tensor master_weights();
  Tensor adam_m();
  Tensor adam_v();
  int64_t step() const;
  void set_step(int64_t s);
  std::string rng_state() const;
  void set_rng_state(const std::string& s);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
