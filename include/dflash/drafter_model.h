// The DFlash drafter network: parameter layout (one flat fp32 buffer), forward and hand-written backward.
//
// Matches z-lab's DFlashDraftModel (dflash/model.py): a Qwen3 decoder stack whose attention reads
// keys/values from the fused target features (fc + hidden_norm over the concatenated target layers)
// followed by the block's own keys/values; queries are the blocks [anchor, MASK x (B-1)] embedded with the
// target's frozen embedding. The lm_head and the loss live in the trainer (src/drafter/).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dflash/hf_config.h"
#include "dflash/tensor.h"

namespace dflash {

// One trainable tensor inside the flat buffer. Names are the release format's (= the official
// module's named_parameters()): fc.weight, hidden_norm.weight, layers.N.self_attn.q_proj.weight, ...
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // in floats
  size_t numel() const;
  bool is_norm() const;  // RMSNorm weights (initialised to 1)
  // A DFlash2 conv's base_kernel [2, k, H] (initialised to the identity: tap 0 = 1, the others 0) or
  // kernel_projection [2kG, H] (initialised to 0), so a fresh DFlash2 backbone starts as the DFlash one.
  bool is_conv_base() const;
  bool is_conv_projection() const;
};
std::vector<ParamSpec> drafter_param_layout(const DrafterConfig& c);
size_t drafter_param_count(const DrafterConfig& c);

// ---- release format (z-lab DFlash: config.json + model.safetensors) -------------------------------------
// Loads every tensor of the layout from dir/model.safetensors (or a sharded index) into flat, converted
// to fp32; a missing tensor or a wrong shape is a BadInput error naming it.
void load_drafter_weights(const std::string& dir, const DrafterConfig& c, float* flat);
// Seeded fresh init: normal(0, 0.02) for linear weights, 1 for norm weights.
void init_drafter_weights(const DrafterConfig& c, uint64_t seed, float* flat);
// Writes dir/model.safetensors (F32 or BF16) then dir/config.json, each atomically (temp, fsync, rename);
// creates dir if needed.
void export_drafter(const std::string& dir, const DrafterConfig& c, const float* flat, DType dtype);

struct DrafterLayerViews {
  Tensor input_norm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm, post_norm, gate_proj, up_proj, down_proj;
  // DFlash2 only (empty for DFlash): the two grouped dynamic causal convs, base [2, k, H] and
  // kernel_projection [2kG, H] each.
  Tensor attn_conv_base, attn_conv_proj, mlp_conv_base, mlp_conv_proj;
};
// Views of every tensor of the layout over a flat buffer (weights, or gradients with the same layout).
struct DrafterViews {
  Tensor fc, hidden_norm, norm;
  std::vector<DrafterLayerViews> layers;
  // DFlash2 only: candidate_selector.hidden_projection [r, H], predecessor/successor codebooks [V, r].
  Tensor sel_hidden_proj, sel_pred_codebook, sel_succ_codebook;
};
DrafterViews bind_drafter_views(const DrafterConfig& c, float* flat);

// What one forward needs besides the weights. Host memory on CPU.
struct DrafterStepInput {
  Tensor features;                 // [k, T, H] target layer outputs, layer-major (wire layout)
  const int32_t* tokens = nullptr;  // [T]
  std::vector<int32_t> anchors;    // [N] global token index of each block's anchor
  std::vector<int32_t> seq_begin;  // [N] global index of the first token of the anchor's sequence
  std::vector<int32_t> ctx_pos;    // [T] position of each token within its sequence
  float noise_std = 0.f;           // Gaussian noise on the fused features (training only)
  // Forward only: every block keeps its first block_rows rows (ops::BlockAttnSpec::block_rows: the block's
  // later keys are hidden from its attention); 0 = the whole block. Speculative decoding's last block
  // (src/eval/spec_decode.cpp); a backward after such a forward is refused.
  int block_rows = 0;
};

class Rng;

// Forward/backward of the drafter network for up to max_tokens context tokens and max_blocks blocks.
// All activations are allocated once here.
class DrafterNet {
 public:
  DrafterNet(const DrafterConfig& c, const Ctx& ctx, int64_t max_tokens, int64_t max_blocks);
  ~DrafterNet();
  DrafterNet(const DrafterNet&) = delete;
  DrafterNet& operator=(const DrafterNet&) = delete;

  // Runs the network; returns the final-normed hidden states [N*B, H] (valid until the next forward).
  // embed [V, H] is the target's frozen embedding. `rng` draws the noise when in.noise_std > 0.
  Tensor forward(const DrafterViews& w, const Tensor& embed, const DrafterStepInput& in, Rng* rng);
  // Backward of the last forward: d_out [N*B, H] is the gradient at the final-normed hidden states;
  // parameter gradients are ACCUMULATED into g (same layout as w). ready, when given, is called with
  // each tensor of g once this backward is done with it (drafter.h's GradReady, by tensor; norm first,
  // then layer by layer from the last, hidden_norm and fc last): the trainer starts summing those over
  // the drafters meanwhile.
  void backward(const DrafterViews& w, const DrafterViews& g, const Tensor& d_out,
                const std::function<void(const Tensor& grad)>& ready = {});
  // Scratch [N*B, H] for the caller's gradient at the output (valid with this net's sizes).
  Tensor d_out_buffer(int64_t rows);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
