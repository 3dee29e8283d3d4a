// The frozen target forward (what target ranks run): one interface over the target families, the
// target's config read once from its checkpoint, and the factory that picks the implementation.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dflash/hf_config.h"
#include "dflash/packed_batch.h"
#include "dflash/target_quant.h"
#include "dflash/tensor.h"

namespace dflash {

// The decoder stacks this build knows. Qwen3: dense, full attention in every layer (src/model/qwen3_target.*).
// Qwen35Hybrid: Qwen3.5/3.6, Gated DeltaNet layers between gated full-attention layers
// (src/model/qwen35_target.*; both backends).
enum class TargetFamily : uint8_t { Qwen3, Qwen35Hybrid };
const char* target_family_name(TargetFamily f);  // "qwen3", "qwen3.5-hybrid"

struct Qwen35Config;  // src/model/qwen35_config.h: the hybrid's own fields

// A target checkpoint's config.json, parsed and checked once.
struct TargetConfig {
  TargetFamily family = TargetFamily::Qwen3;
  // The decoder stack's sizes (hidden, vocab, layers, heads, ...): all the roles, the trainer and the data
  // checks need. For the hybrid, a copy of qwen35->text.
  Qwen3Config text;
  // Only for Qwen35Hybrid (null otherwise): layer kinds, Gated DeltaNet heads, partial RoPE.
  std::shared_ptr<const Qwen35Config> qwen35;
  // How the checkpoint stores its linears (config.json's quantization_config) and how the run executes
  // them: the checkpoint's precision, unless resolve_target_precision applied --target-precision.
  TargetQuantization quant;
};

// Reads <dir>/config.json once, decides the family, and refuses (BadInput, naming the file and field)
// anything this build cannot run, before any weight is touched.
TargetConfig load_target_config(const std::string& dir);

// Where the forward writes what it captures (on ctx.device), laid out as the wire format:
//   features   [k, T, H]  outputs of decoder layers capture_layers[0..k) (layer id l = output of layer l)
//   final_norm [T, H]     final RMSNorm of the last layer's output (for verifier logits); may be empty
struct CaptureOut {
  Tensor features;
  Tensor final_norm;
};

class TargetModel {
 public:
  virtual ~TargetModel() = default;
  TargetModel() = default;
  TargetModel(const TargetModel&) = delete;
  TargetModel& operator=(const TargetModel&) = delete;

  virtual TargetFamily family() const = 0;
  // The decoder stack's sizes (for the hybrid, its text model's).
  virtual const Qwen3Config& config() const = 0;
  virtual const std::vector<int>& capture_layers() const = 0;
  // dtype of activations and of the CaptureOut tensors: F32 on the CPU backend, BF16 on CUDA.
  virtual DType activation_dtype() const = 0;

  // Runs the forward over the packed batch (causal attention inside each sequence, positions restarting
  // at 0 per sequence, recurrent state restarting per sequence) and writes the captured tensors into out.
  virtual void forward(const PackedBatch& batch, const CaptureOut& out) = 0;

  // Test/verifier helper: logits [T, V] = lm_head(final_norm [T, H]). Not used on target ranks.
  virtual void lm_head_forward(const Tensor& logits, const Tensor& final_norm) = 0;
  // Frozen tables the drafter shares (host float32 views on the CPU backend).
  virtual Tensor embed_tokens() const = 0;  // [V, H]
  virtual Tensor lm_head() const = 0;       // [V, H]
  // How many linear projections have run as block-scaled FP8 GEMMs (ops::fp8_linear_forward) since the
  // model was made: 0 unless an FP8 target runs on a GPU that has them (docs/fp8.md). Tests read it.
  virtual int64_t fp8_gemm_calls() const { return 0; }
  // How many linear projections have run as dequantize (ops::fp8_weight_dequantize) + GEMM, their weights
  // kept as e4m3 codes (LinearMode::Fp8Dequant, docs/fp8.md). Tests read it.
  virtual int64_t fp8_dequant_calls() const { return 0; }
};

// Builds the target of cfg's family from the checkpoint at dir (cfg = load_target_config(dir)): every
// tensor checked for presence and shape before any compute, weights converted to the backend's dtype;
// max_tokens bounds T for buffer allocation. A family this build does not run on ctx's backend (the
// hybrid on CUDA) is refused (BadOptions) before any weight is loaded.
std::unique_ptr<TargetModel> make_target_model(const TargetConfig& cfg, const std::string& dir, const Ctx& ctx,
                                               std::vector<int> capture_layers, int64_t max_tokens);

}  // namespace dflash
