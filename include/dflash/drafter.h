// The DFlash drafter and its training step (what drafter ranks run).
#pragma once
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dflash/drafter_model.h"
#include "dflash/hf_config.h"
#include "dflash/optim.h"  // OptimizerState
#include "dflash/packed_batch.h"
#include "dflash/tensor.h"

namespace dflash {

enum class LossKind : uint8_t { CE, KL };

struct TrainOptions {
  LossKind loss = LossKind::CE;
  bool dpace = false;          // D-PACE position weights on top of the decay weights
  float gamma = 7.0f;          // decay weights exp(-(k-1)/gamma)
  int max_anchors = 512;       // per packed batch (the buffers' bound)
  int anchors_per_record = 0;  // > 0: up to this many per record (sequence), still <= max_anchors (anchors.h)
  float hs_noise = 0.0f;       // std of Gaussian noise on the fused target features (training only)
  // AdamW
  float lr = 6e-4f;
  // The reference's AdamW (SpecForge's BF16Optimizer: torch.optim.AdamW's betas and eps, no weight decay).
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;
  float clip = 1.0f;           // global-norm clip; <= 0 disables
  // --optimizer-state: fp32 master weights and moments, or bf16 ones updated with stochastic rounding
  // keyed by seed (include/dflash/optim.h).
  OptimizerState optimizer_state = OptimizerState::Fp32;
  int warmup_steps = 0;
  int64_t total_steps = 0;     // cosine decay to min_lr_ratio * lr at total_steps (0 = constant after warmup)
  float min_lr_ratio = 0.0f;  // SpecForge's cosine decays to 0
  uint64_t seed = 0;
  // A fresh drafter (no drafter_dir): block size and mask token (-1 = the target family's unused id:
  // Qwen3 vocab 151936 -> 151669, Qwen3.5/3.6 vocab 248320 -> 248070, otherwise vocab_size - 1).
  int block_size = 16;
  int mask_token_id = -1;
  // The rest of a fresh drafter's shape (dflash-train's --target-layers, --draft-layer-types,
  // --draft-sliding-window; the Qwen3.6-27B recipe: 4 sliding layers of 2048 keys + 1 full):
  // empty / 0 = DFlash's defaults, the layer-id rule and full attention in every layer.
  std::vector<int> target_layer_ids;
  std::vector<std::string> layer_types;  // "full_attention" | "sliding_attention", one per drafter layer
  int sliding_window = 0;
  // A fresh drafter's attention heads (--draft-heads, --draft-head-dim, --draft-kv-heads; 0 = the target's):
  // the Qwen3.8-27B release has 32 x 128 with 8 KV heads on a 24 x 256 target.
  int draft_heads = 0, draft_head_dim = 0, draft_kv_heads = 0;
  // DFlash2 (docs/dflash2.md 3): the architecture of a fresh drafter (a --drafter DIR's config decides
  // otherwise), its shape, and the objective L = (sum w l_unary + alpha sum w l_sel) / sum w.
  DraftArch draft_arch = DraftArch::DFlash;
  DFlash2Shape d2;
  float output_multiplier = 1.0f;  // a fresh drafter's compute_logits (DFlash2 releases carry both)
  float logit_softcap = 0.0f;      // 0 = off
  float selector_loss_alpha = 1.0f;
  bool selector_stop_gradient = false;  // the selector's inputs (unary logits, hidden) detached
  // The selector's training candidates (SpecForge now: the strict top-K) and alpha's schedule over the run's
  // total_steps (selector_alpha_schedule, include/dflash/optim.h): 0 for the first warmup_ratio of the
  // steps, a linear ramp over the next ramp_ratio, then alpha. Doubles: int(total * ratio) as Python's.
  SelectorCandidates selector_candidates = SelectorCandidates::Strict;
  double selector_warmup_ratio = 0.0, selector_ramp_ratio = 0.0;
};

// The config of a fresh drafter for `target`: num_layers Qwen3 layers with the target's widths, full
// attention, default target_layer_ids, the given block size and mask token (-1 = see TrainOptions).
DrafterConfig fresh_drafter_config(const Qwen3Config& target, int num_layers, int block_size, int mask_token_id);
// The same with every fresh-drafter field of opt (block size, mask token, target layer ids, layer types,
// sliding window); a shape that cannot be built is a BadOptions error naming the option.
DrafterConfig fresh_drafter_config(const Qwen3Config& target, int num_layers, const TrainOptions& opt);
// The drafter a run trains: drafter_dir's config.json when one is given, else the fresh one above.
DrafterConfig drafter_config_for(const Qwen3Config& target, const std::string& drafter_dir, int num_layers,
                                 const TrainOptions& opt);

// What a DrafterTrainer is built from: both configs, parsed once by the caller (dflash-train's ModelPlan,
// src/runtime/run_plan.h), and where the weights are.
struct DrafterSource {
  Qwen3Config target;       // the target's decoder sizes (checked against the drafter)
  std::string target_dir;   // its checkpoint: the frozen embed_tokens and lm_head are read from it
  DrafterConfig drafter;
  std::string drafter_dir;  // a release-format drafter's weights to start from; "" = a fresh seeded init
  // Both config.json files parsed here (tools and tests that start from directories).
  static DrafterSource from_dirs(const std::string& target_dir, const std::string& drafter_dir, int num_layers,
                                 const TrainOptions& opt);
};

// Per-step numbers (one drafter's batch).
struct StepStats {
  double loss = 0, acc = 0, agree = 0, streak = 0;
  double weight_sum = 0;
  double grad_norm = 0;   // before clipping
  double lr = 0, noise = 0;
  int64_t tokens = 0, anchors = 0;
  std::vector<double> per_pos_acc;  // [block_size]
  // The counts behind acc, streak and per_pos_acc, so batches (and drafters) can be summed exactly
  // (evaluation, --eval-data): loss rows and correct rows per block position [block_size], and the sum
  // over blocks of the leading correct run (streak = streak_sum / anchors).
  std::vector<double> per_pos_rows, per_pos_correct;
  double streak_sum = 0;
  // DFlash2 (NaN / 0 for DFlash): the two terms of the loss (each / sum w), candidate recall (the gold
  // within the unary top-K) and the selector's teacher-forced accuracy over rows, with their row counts.
  double loss_unary = 0, loss_sel = std::numeric_limits<double>::quiet_NaN();
  double candidate_recall = std::numeric_limits<double>::quiet_NaN();
  double selector_acc = std::numeric_limits<double>::quiet_NaN();
  double covered_rows = 0, selector_correct_rows = 0, loss_rows = 0;
  // DFlash2: the selector term's weight at this step (--selector-loss-alpha through its warmup and ramp).
  double selector_alpha = std::numeric_limits<double>::quiet_NaN();
};

// A feature batch as the drafter receives it (wire layout of TargetModel's CaptureOut). The tensors live
// on the trainer's backend: F32 host memory on the CPU, BF16 device memory on CUDA.
struct FeatureBatch {
  const PackedBatch* batch = nullptr;  // tokens, cu_seqlens, loss_mask (host)
  Tensor features;    // [k, T, H]
  Tensor final_norm;  // [T, H]; needed by LossKind::KL (and for the agree metric: NaN without it)
};

// "[begin, end) of the flat gradient (elements) is final": the one event from the backward's kernels to the
// gradient reducer (GradHooks::ready, the engines' DrafterBatch::ready, the CUDA step, and
// GradientReducer::ready at the end of the line, grad_reducer.h).
using GradReady = std::function<void(size_t begin, size_t end)>;

// What forward_backward tells its caller while it enqueues the backward, so that the sum of the gradients
// over the drafters can start on the parts that are final while the rest is still being computed
// (grad_reducer.h; the buckets of PyTorch DDP). Either may be empty.
struct GradHooks {
  // Once per call, before any of the step's gradient work is enqueued: the factor that turns grads() into
  // the unnormalised gradient of Σw·loss, the allreduce's prescale. For MicroBatch::Whole the batch's loss
  // weight sum Σw (= StepStats::weight_sum; 0 for a batch without loss rows, whose gradient is zero); for
  // MicroBatch::Last 1 (the folded gradient is already weighted). Not called for MicroBatch::Accumulate.
  std::function<void(double prescale)> begin;
  // [begin, end) of grads() (elements) holds its final value once the work enqueued so far on the
  // trainer's context has run. Reported in the backward's order (the final norm and the drafter's last
  // layer first, fc and hidden_norm last; parameter by parameter, on the CPU at the end of each layer);
  // every element of [0, P) exactly once per call, all before forward_backward returns.
  GradReady ready;
};

// Where a training batch sits in its optimizer step (gradient accumulation, --grad-accum K: K micro-batches
// per step, one large batch's normalisation Σ w·loss / Σ w over all of them; docs/pipeline.md).
enum class MicroBatch : uint8_t {
  // The step's only batch (K = 1): grads() = the gradient of this batch's loss normalised by its own Σw.
  Whole,
  // One of the first K-1: its normalised gradient times its Σw goes into the accumulator (F32 [P] on the
  // trainer's device, allocated on first use; the step's first micro-batch overwrites it). grads() is
  // scratch afterwards and GradHooks are not called: nothing is summed over the drafters yet.
  Accumulate,
  // The K-th: grads() = Σ over the step's micro-batches of Σw_i × (normalised gradient)_i, the gradient of
  // Σ w·loss unnormalised (divide by the Σw of every micro-batch on every drafter). Each range is folded
  // (ops::grad_fold) before GradHooks::ready reports it, so the allreduce still overlaps this backward;
  // GradHooks::begin gets prescale 1.
  Last,
};

class DrafterTrainer {
 public:
  // source: the configs (parsed by the caller) and where the weights are: source.target_dir supplies the
  // frozen embedding and lm_head, source.drafter_dir a release-format drafter's weights to start from,
  // or empty for a fresh seeded init of source.drafter. A drafter that does not fit the target is a
  // BadInput error (exit 3). max_tokens bounds T of a batch,
  // TrainOptions::max_anchors the anchors of a batch (buffers are allocated once, here).
  // ctx picks the backend: CPU (float32 reference) or CUDA (bf16 compute, fp32 master weights, gradients
  // and AdamW state on the device; BadOptions in a build without CUDA). Weights are initialised or loaded
  // on the host the same way on both; anchors, loss rows and metrics are computed the same way too.
  DrafterTrainer(const DrafterSource& source, const TrainOptions& opt, const Ctx& ctx, int64_t max_tokens);
  // The same from the directories (DrafterSource::from_dirs: drafter_dir's config, or a fresh one of
  // `num_layers` layers from the target's).
  DrafterTrainer(const std::string& target_dir, const std::string& drafter_dir, int num_layers,
                 const TrainOptions& opt, const Ctx& ctx, int64_t max_tokens);
  ~DrafterTrainer();
  DrafterTrainer(const DrafterTrainer&) = delete;
  DrafterTrainer& operator=(const DrafterTrainer&) = delete;

  const DrafterConfig& config() const;
  // Where each parameter sits in master_weights()/grads()/adam_m()/adam_v() (release-format names).
  const std::vector<ParamSpec>& param_layout() const;
  // Learning rate the next optimizer_step() will use.
  double current_lr() const;

  // Forward + backward on one batch: anchors sampled (or given), loss, metrics; gradients left in
  // grads() (overwritten). Anchors: positions within the packed batch (global token index), empty =
  // sample. The loss is normalised by this batch's weight sum (StepStats::weight_sum); with several
  // drafter ranks, scale grads() by weight_sum / (sum over ranks) before summing them for one global
  // normalisation. Objectives (TrainOptions::loss):
  //   CE: sum_w w * -log q(label) / sum w     KL: sum w * KL(p || q) / sum w, p = softmax(lm_head(final_norm))
  //   w = [a+k < end of sequence] [k > 0] loss_mask[a+k] exp(-(k-1)/gamma)
  // D-PACE (TrainOptions::dpace): w is further multiplied per block position k by the (detached)
  // gradient of the expected accepted length E = sum_m prod_{j<=m} c_j with respect to log c_k,
  //   d_k = sum_{m>=k} prod_{j<=m} c_j,  c_j = q_j(label_j) (c_j = 1 where w_j = 0),
  // so positions that currently limit acceptance carry the training signal. StepStats::loss stays the
  // decay-weighted objective (comparable with and without D-PACE).
  // Gaussian noise (TrainOptions::hs_noise) is added to the fused features hidden_norm(fc(ctx)) in training
  // (the CPU and CUDA draw different numbers of the same distribution).
  StepStats forward_backward(const FeatureBatch& fb, const std::vector<int64_t>& anchors = {});
  // The same, reporting the gradient's progress to `hooks` as the backward is enqueued.
  StepStats forward_backward(const FeatureBatch& fb, const GradHooks& hooks, const std::vector<int64_t>& anchors = {});
  // One micro-batch of an accumulated step (see MicroBatch); Whole is the call above.
  StepStats forward_backward(const FeatureBatch& fb, MicroBatch micro, const GradHooks& hooks,
                             const std::vector<int64_t>& anchors = {});
  // The data ended inside an accumulated step (after at least one MicroBatch::Accumulate, before its Last):
  // grads() = the accumulator, the unnormalised gradient of the micro-batches the step saw (what Last would
  // leave, without a last batch). Nothing is reported to hooks: the caller sums it as one piece.
  void finish_accumulation();
  // Flat fp32 gradient buffer [P] of every trainable parameter (param_layout() places them), on the
  // trainer's backend (device memory on CUDA).
  Tensor grads();
  // grads() *= s on the trainer's backend (the global loss normalisation over drafter ranks).
  void scale_grads(float s);
  // Clip (global norm over grads()), AdamW step, advance the schedule. Returns the pre-clip grad norm.
  double optimizer_step();
  // Forward only (evaluation, no noise): metrics and loss.
  StepStats evaluate(const FeatureBatch& fb, const std::vector<int64_t>& anchors = {});
  // Speculative decoding's draft (spec_decode.h): the drafter's greedy guesses (argmax over the lm_head)
  // for positions 1..V-1 of the block of V = block_rows rows (2..B) anchored at `anchor` (global token
  // index in fb's batch), conditioned, as DFlash's inference is, on the features of the anchor's sequence
  // strictly before it. V < B is the official loop's last block, shortened to the tokens left: the
  // drafter then runs as one of block size V would (its block attention sees V rows: BlockAttnSpec::
  // block_rows). The batch must hold all B positions of the block inside the anchor's sequence with
  // loss_mask 1 after the anchor (the ids there are not read as inputs). Returns V-1 token ids. Forward
  // only: no noise, no gradient.
  std::vector<int32_t> draft_block(const FeatureBatch& fb, int64_t anchor, int block_rows);
  // The same for several anchors in one forward (speculative decoding of several prompts: each anchor in its
  // own sequence of fb's batch, every block of block_rows rows): each anchor's V-1 drafts, in anchors' order.
  // At most max_anchors() anchors and max_tokens() tokens.
  std::vector<std::vector<int32_t>> draft_blocks(const FeatureBatch& fb, const std::vector<int64_t>& anchors,
                                                 int block_rows);
  int max_anchors() const;     // TrainOptions::max_anchors: the most anchors one forward takes
  int64_t max_tokens() const;  // the constructor's: the most tokens of one batch
  // DFlash2 at temperature T > 0 (dflash-eval's sampled decoding): the same forward, then the selector's
  // sampled walk (docs/dflash2.md 2.4): returns the V-1 draws; q [V-1, K] the walk's distribution over cand
  // [V-1, K] (the strict unary top-K, the draft probabilities rejection sampling needs).
  std::vector<int32_t> draft_block_sampled(const FeatureBatch& fb, int64_t anchor, int block_rows, float temperature,
                                           const std::function<double()>& uniform, std::vector<float>& q,
                                           std::vector<int32_t>& cand);
  // The same for several anchors in one forward (as draft_blocks): anchor a's walk draws from uniforms[a];
  // q[a], cand[a] its [V-1, K] as above.
  std::vector<std::vector<int32_t>> draft_blocks_sampled(const FeatureBatch& fb, const std::vector<int64_t>& anchors,
                                                         int block_rows, float temperature,
                                                         const std::vector<std::function<double()>>& uniforms,
                                                         std::vector<std::vector<float>>& q,
                                                         std::vector<std::vector<int32_t>>& cand);
  // The final-normed hidden states [N B, H] of the last draft_block(s) forward, block after block in anchors'
  // order (the trainer's device and dtype; rows V.. of a block of V rows mean nothing): a DFlash drafter's
  // logits at T > 0 are the target's lm_head over each block's rows 1..V-1 (then compute_logits' transform).
  Tensor draft_hidden();

  // Release-format I/O: config.json + model.safetensors (dtype F32 or BF16), atomic.
  void export_release(const std::string& dir, DType dtype) const;
  // Flat fp32 master weights and optimizer state [P] (checkpointing), always host memory: on the CPU the
  // live buffers; on CUDA host mirrors refreshed from the device on each call (a download and a sync).
  // After writing into them (a restore), call state_loaded() to make them the trainer's state.
  Tensor master_weights();
  Tensor adam_m();
  Tensor adam_v();
  // Pushes the host mirrors back to the device and refreshes the bf16 weights (a no-op on the CPU).
  void state_loaded();
  // sum_i (i % 7 + 1) * w_i over the master weights, in double on the host: drafter ranks compare it to
  // check that they start from identical weights.
  double weights_checksum();
  int64_t step() const;
  void set_step(int64_t s);
  std::string rng_state() const;
  void set_rng_state(const std::string& s);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
