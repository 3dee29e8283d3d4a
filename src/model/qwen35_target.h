// The frozen Qwen3.5 / Qwen3.6 hybrid target forward (CPU backend, float32). Built through
// make_target_model (include/dflash/target.h), which refuses the CUDA backend for it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dflash/target.h"
#include "model/qwen35_config.h"

namespace dflash {

class Qwen35Target final : public TargetModel {
 public:
  // cfg: the checkpoint's parsed config (*load_target_config(dir).qwen35). Loads the safetensors from
  // dir, every tensor checked before any compute; onto ctx's device (bf16 on CUDA).
  Qwen35Target(const Qwen35Config& cfg, const std::string& dir, const Ctx& ctx, std::vector<int> capture_layers,
               int64_t max_tokens);
  ~Qwen35Target() override;

  TargetFamily family() const override { return TargetFamily::Qwen35Hybrid; }
  const Qwen3Config& config() const override;   // the text model's sizes
  const Qwen35Config& hybrid_config() const;     // layer kinds, Gated DeltaNet heads, partial RoPE
  const std::vector<int>& capture_layers() const override;
  DType activation_dtype() const override;
  // Each packed sequence runs from a zero conv/recurrent state and attends only to itself.
  void forward(const PackedBatch& batch, const CaptureOut& out) override;
  void lm_head_forward(const Tensor& logits, const Tensor& final_norm) override;
  Tensor embed_tokens() const override;
  Tensor lm_head() const override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
