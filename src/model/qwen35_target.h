// The frozen Qwen3.5 / Qwen3.6 hybrid target forward (CPU backend, float32). TargetModel forwards to
// this class when the checkpoint's config.json describes a hybrid; its interface mirrors TargetModel's.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dflash/target.h"
#include "model/qwen35_config.h"

namespace dflash {

class Qwen35Target {
 public:
  // Loads config.json + safetensors from dir (every tensor checked before any compute). The CUDA
  // backend is refused (BadOptions): this build runs the hybrid on the CPU only.
  Qwen35Target(const std::string& dir, const Ctx& ctx, const std::vector<int>& capture_layers, int64_t max_tokens);
  ~Qwen35Target();
  Qwen35Target(const Qwen35Target&) = delete;
  Qwen35Target& operator=(const Qwen35Target&) = delete;

  const Qwen35Config& config() const;
  // Same contract as TargetModel::forward: features [k, T, H] (outputs of the capture layers, layer
  // listed twice is copied), final_norm [T, H] (may be empty); each packed sequence runs from a zero
  // conv/recurrent state and attends only to itself, positions restarting at 0.
  void forward(const PackedBatch& batch, const CaptureOut& out);
  void lm_head_forward(const Tensor& logits, const Tensor& final_norm);  // logits [T, V]
  Tensor embed_tokens() const;  // [V, H]
  Tensor lm_head() const;       // [V, H]

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
