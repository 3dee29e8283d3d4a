// The frozen Qwen3 target forward (what target ranks run).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dflash/hf_config.h"
#include "dflash/tensor.h"

namespace dflash {

// A packed batch of whole sequences. Host memory.
struct PackedBatch {
  std::vector<int32_t> tokens;      // [T]
  std::vector<int32_t> cu_seqlens;  // [nseq + 1], cu_seqlens[0] = 0, cu_seqlens[nseq] = T
  std::vector<uint8_t> loss_mask;   // [T]
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int num_seqs() const { return static_cast<int>(cu_seqlens.size()) - 1; }
};

// Where the forward writes what it captures (on ctx.device), laid out as the wire format:
//   features   [k, T, H]  outputs of decoder layers capture_layers[0..k) (layer id l = output of layer l)
//   final_norm [T, H]     final RMSNorm of the last layer's output (for verifier logits); may be empty
struct CaptureOut {
  Tensor features;
  Tensor final_norm;
};

class TargetModel {
 public:
  // Loads config.json + safetensors from dir (every tensor checked for presence and shape before any
  // compute), weights converted to the backend's dtype. max_tokens bounds T for buffer allocation.
  TargetModel(const std::string& dir, const Ctx& ctx, std::vector<int> capture_layers, int64_t max_tokens);
  ~TargetModel();
  TargetModel(const TargetModel&) = delete;
  TargetModel& operator=(const TargetModel&) = delete;

  const Qwen3Config& config() const;
  const std::vector<int>& capture_layers() const;
  // dtype of activations and of the CaptureOut tensors: F32 on the CPU backend, BF16 on CUDA.
  DType activation_dtype() const;

  // Runs the forward over the packed batch (causal attention inside each sequence, positions restarting
  // at 0 per sequence) and writes the captured tensors into out.
  void forward(const PackedBatch& batch, const CaptureOut& out);

  // Test/verifier helper: logits [T, V] = lm_head(final_norm [T, H]). Not used on target ranks.
  void lm_head_forward(const Tensor& logits, const Tensor& final_norm);
  // Frozen tables the drafter shares (host float32 views on the CPU backend).
  Tensor embed_tokens() const;  // [V, H]
  Tensor lm_head() const;       // [V, H]

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
