// The frozen dense Qwen3 target forward (CPU float32 and CUDA bf16 backends). Built through
// make_target_model (include/dflash/target.h); the forward itself is in qwen3_target.cpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dflash/target.h"

namespace dflash {

class Qwen3Target final : public TargetModel {
 public:
  // cfg: the checkpoint's parsed config (load_target_config(dir).text). Loads the safetensors from dir,
  // every tensor checked for presence and shape before any compute.
  Qwen3Target(const Qwen3Config& cfg, const std::string& dir, const Ctx& ctx, std::vector<int> capture_layers,
              int64_t max_tokens);
  ~Qwen3Target() override;

  TargetFamily family() const override { return TargetFamily::Qwen3; }
  const Qwen3Config& config() const override;
  const std::vector<int>& capture_layers() const override;
  DType activation_dtype() const override;
  void forward(const PackedBatch& batch, const CaptureOut& out) override;
  void lm_head_forward(const Tensor& logits, const Tensor& final_norm) override;
  Tensor embed_tokens() const override;
  Tensor lm_head() const override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
