// The CUDA engine of DrafterTrainer (see src/drafter/trainer_engine.h): cuda::DrafterStepCuda with the
// trainer's weights, the target's frozen tables in bf16 on the device, and host mirrors of the state in
// fp32 for checkpoints (the bf16 state, --optimizer-state bf16, converted exactly on the way down and
// rounded to nearest on the way up). Host C++ of the CUDA library (built only with a toolkit), which links the base library
// alone: it calls the CUDA library and the base (tensor, error), nothing of the core.
#include <algorithm>
#include <cstring>
#include <vector>

#include "adamw.cuh"
#include "backend.cuh"
#include "cuda_check.cuh"
#include "drafter_step.cuh"
#include "drafter/trainer_engine.h"

namespace dflash::train {
namespace {

// dst (BF16 [n], device) = src (F32 [n], host), converted on the host in slices (bounded staging).
void upload_bf16(const Ctx& ctx, const Tensor& dst, const float* src) {
  constexpr size_t kSlice = size_t{1} << 24;
  std::vector<uint16_t> staged(std::min(kSlice, dst.numel()));
  uint16_t* d = static_cast<uint16_t*>(dst.data);
  for (size_t i0 = 0, n = dst.numel(); i0 < n; i0 += kSlice) {
    const size_t m = std::min(kSlice, n - i0);
    for (size_t i = 0; i < m; ++i) staged[i] = f32_to_bf16(src[i0 + i]);
    cuda::copy_bytes(ctx, d + i0, staged.data(), m * sizeof(uint16_t));
    cuda::synchronize_stream(ctx);  // staged is reused by the next slice
  }
}

class CudaEngine final : public TrainerEngine {
 public:
  explicit CudaEngine(EngineSetup s)
      : ctx_(s.ctx), objective_(s.loss == LossKind::KL ? ops::LossObjective::KL : ops::LossObjective::CE),
        step_(s.cfg, s.layout, s.ctx, s.max_tokens, s.max_anchors, s.chunk_rows, s.optimizer_state, s.sr_seed),
        params_h_(std::move(s.params)) {
    DF_CHECK(ctx_.device == Device::CUDA, Internal, "CUDA drafter engine on a non-CUDA context");
    const int64_t H = s.cfg.layers.hidden_size, V = s.cfg.layers.vocab_size;
    DF_CHECK(params_h_.numel() == step_.params_bf16().numel(), Internal,
             "CUDA drafter engine: " << params_h_.numel() << " initial weights for " << step_.params_bf16().numel());
    embed_ = Buffer(Device::CUDA, DType::BF16, {V, H});
    upload_bf16(ctx_, embed_.t(), s.embed.ptr<float>());
    if (!s.tied) {
      lm_head_ = Buffer(Device::CUDA, DType::BF16, {V, H});
      upload_bf16(ctx_, lm_head_.t(), s.lm_head.ptr<float>());
    }
    step_.set_frozen(embed_.t(), s.tied ? embed_.t() : lm_head_.t());
    step_.set_selector_objective(s.selector_candidates, s.selector_stop_gradient);
    // Upload the weights (the fp32 masters, or the bf16 state rounded to nearest); reset_from_params writes
    // the bf16 copy (fp32 state) and zeroes m and v.
    upload_weights();
    step_.reset_from_params();
    cuda::synchronize_stream(ctx_);
  }

  DType feature_dtype() const override { return DType::BF16; }

  EngineRows forward(const DrafterBatch& b, bool with_grad) override {
    res_ = with_grad ? step_.forward_backward(b, objective_) : step_.forward_loss(b, objective_);
    EngineRows out;
    out.loss = res_.row_loss.data();
    out.ce = res_.row_ce.data();
    out.argmax_q = res_.argmax_q.data();
    out.argmax_p = res_.argmax_p.empty() ? nullptr : res_.argmax_p.data();
    if (!res_.sel_ce.empty()) {  // DFlash2
      out.unary = res_.unary.data();
      out.sel_ce = res_.sel_ce.data();
      out.covered = res_.covered.data();
      out.sel_argmax = res_.sel_token.data();
      out.topk_ids = res_.topk_ids.data();
      out.topk_vals = res_.topk_vals.data();
      out.u = res_.u.data();
    }
    return out;
  }

  void backward(const DrafterBatch& b, const std::vector<float>& weight) override {
    step_.backward_rows(b, weight, objective_);
  }

  void zero_grads() override {
    const Tensor& g = step_.grads();
    DF_CUDA(cudaMemsetAsync(g.data, 0, g.nbytes(), cuda::stream_of(ctx_)));
  }
  Tensor grads() override { return step_.grads(); }
  void scale_grads(float s) override { cuda::scale_inplace(ctx_, step_.grads(), s); }

  double optimizer_step(const ops::AdamWHyper& hyper, int64_t step, float clip) override {
    // One fused pass (clip on the device); the trainer checks the norm read after it.
    params_h_current_ = false;
    return step_.optimizer_step(hyper, step, clip);
  }

  Tensor last_hidden() override { return step_.hidden(); }
  // Downloaded only when the device's weights changed since the last download (an optimizer step, a
  // state_loaded): a DFlash2 drafter's every draft reads its selector codebooks here, and dflash-eval drafts
  // ~100 times a run (the whole mirror, ~0.8 GB at hidden 2048, came down each time: bench/results/
  // h100-quality-20261207b, a DFlash2 eval's drafter time 12 s against DFlash's 1.4 s).
  Tensor master_weights() override {
    if (!params_h_current_) download(bf16_state() ? step_.params_bf16() : step_.params(), params_h_);
    params_h_current_ = true;
    return params_h_.t();
  }
  Tensor adam_m() override { return download(step_.adam_m(), m_h_); }
  Tensor adam_v() override { return download(step_.adam_v(), v_h_); }

  void state_loaded() override {
    // A moment never staged was not written by the caller: keep the device's (reset_from_params zeroes it).
    if (m_h_.t().empty()) adam_m();
    if (v_h_.t().empty()) adam_v();
    upload_weights();
    params_h_current_ = false;  // the bf16 state holds them rounded: the next read downloads what it holds
    step_.reset_from_params();  // bf16 weights from the new masters; zeroes m and v, uploaded next
    upload_state(step_.adam_m(), m_h_);
    upload_state(step_.adam_v(), v_h_);
    cuda::synchronize_stream(ctx_);
  }

 private:
  bool bf16_state() const { return step_.optimizer_state() == OptimizerState::Bf16; }

  // The host F32 mirror of a device F32 or BF16 [P] tensor (BF16 converted exactly), allocated on first use
  // (m and v only when checkpointing).
  Tensor download(const Tensor& dev, Buffer& host) {
    if (host.t().empty()) host = Buffer(Device::CPU, DType::F32, {static_cast<int64_t>(dev.numel())});
    if (dev.dtype == DType::F32) {
      cuda::copy_bytes(ctx_, host.t().data, dev.data, dev.nbytes());
      return host.t();
    }
    constexpr size_t kSlice = size_t{1} << 24;  // bounded staging, as upload_bf16
    std::vector<uint16_t> staged(std::min(kSlice, dev.numel()));
    float* h = host.ptr<float>();
    for (size_t i0 = 0, n = dev.numel(); i0 < n; i0 += kSlice) {
      const size_t m = std::min(kSlice, n - i0);
      cuda::copy_bytes(ctx_, staged.data(), static_cast<const uint16_t*>(dev.data) + i0, m * sizeof(uint16_t));
      for (size_t i = 0; i < m; ++i) h[i0 + i] = bf16_to_f32(staged[i]);
    }
    return host.t();
  }
  // A host F32 [P] mirror onto the device tensor: copied (F32) or rounded to nearest (BF16).
  void upload_state(const Tensor& dev, const Buffer& host) {
    if (dev.dtype == DType::F32) cuda::copy_bytes(ctx_, dev.data, host.t().data, host.t().nbytes());
    else upload_bf16(ctx_, dev, host.ptr<float>());
  }
  // The weights in params_h_ onto the device: the fp32 masters, or the bf16 state itself.
  void upload_weights() { upload_state(bf16_state() ? step_.params_bf16() : step_.params(), params_h_); }

  Ctx ctx_;
  ops::LossObjective objective_;
  bool params_h_current_ = false;  // params_h_ holds the device's weights as they are now
  cuda::DrafterStepCuda step_;
  Buffer embed_, lm_head_;       // BF16 [V, H] on the device (lm_head_ empty when tied to embed_)
  Buffer params_h_, m_h_, v_h_;  // F32 [P] host mirrors
  cuda::DrafterStepResult res_;
};

std::unique_ptr<TrainerEngine> make_engine(EngineSetup setup) { return std::make_unique<CudaEngine>(std::move(setup)); }

}  // namespace

MakeCudaTrainerEngine* const make_cuda_trainer_engine = &make_engine;

}  // namespace dflash::train
