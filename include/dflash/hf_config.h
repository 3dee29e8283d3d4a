// Hugging Face config.json for Qwen3 targets and DFlash drafters.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash {

// Qwen3 dense decoder stack (target, and the drafter's layers).
struct Qwen3Config {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;              // may differ from hidden_size / num_attention_heads
  float rms_norm_eps = 1e-6f;
  float rope_theta = 1e6f;       // from rope_theta or rope_parameters.rope_theta
  bool tie_word_embeddings = false;
  std::string weight_prefix = "model.";  // "model.language_model." for VLM checkpoints
  std::vector<std::string> layer_types;  // "full_attention" / "sliding_attention", one per layer
  int sliding_window = 0;                // 0 = none
  int max_position_embeddings = 40960;   // written to the exported drafter config; not used by the math
  // config.json's word for its weights' dtype ("dtype" or "torch_dtype", at the top, else in text_config;
  // "" when it has none): what Checkpoint::check_dtype_label holds the shards to.
  std::string dtype_label;
};

// Parses a Qwen3 config (accepts a nested text_config). Fatal BadInput naming the file and field on a
// missing or invalid field. layer_types may also hold "linear_attention" (Qwen3.5/3.6 hybrids): a model
// that cannot run such layers must reject them itself.
Qwen3Config parse_qwen3_config(const nlohmann::json& j, const std::string& source);
Qwen3Config load_qwen3_config(const std::string& config_json_path);

// Refuses (fatal BadInput naming the field) a target config.json that describes a model this build does
// not implement, which would otherwise load and train silently wrong: a model_type or architectures
// entry of another family or an MoE (hybrid: whether it is a Qwen3.5/3.6 hybrid, is_qwen35_config),
// attention_bias or mlp_bias true, hidden_act other than silu, a quantization_config other than the FP8
// formats parse_target_quantization reads (dflash/target_quant.h). Absent fields pass.
void check_target_config_supported(const nlohmann::json& root, const std::string& source, bool hybrid);

// A config.json read as a JSON object (fatal BadInput when it cannot be opened, parsed, or is not an
// object): for readers that look at the file before choosing a parser (load_target_config).
nlohmann::json read_config_json(const std::string& config_json_path);

// The drafter architectures this build trains (docs/dflash2.md): DFlash (z-lab DFlashDraftModel) and
// DFlash2 (DFlash2DraftModel: grouped dynamic causal convolutions around every attention and MLP sublayer,
// and a candidate selector over the unary top-K).
enum class DraftArch : uint8_t { DFlash, DFlash2 };
const char* draft_arch_name(DraftArch a);         // "dflash" / "dflash2" (the --draft-arch words)
const char* draft_arch_architecture(DraftArch a);  // "DFlashDraftModel" / "DFlash2DraftModel" (config.json)

// DFlash2's training candidates for the selector's CE (docs/dflash2.md 3): Strict = the unary top-K as
// serving sees it, a row whose label is not among them has no selector term (SpecForge now); Insert = the
// label put into slot K-1 when missing (speculators; this project's objective before issue 47).
enum class SelectorCandidates : uint8_t { Strict, Insert };
const char* selector_candidates_name(SelectorCandidates c);  // "strict" / "insert" (the option's words)

// DFlash2's extra shape (dflash_config in config.json; unused for DFlash).
struct DFlash2Shape {
  int conv_kernel_size = 2;   // k taps of each grouped dynamic causal conv
  int conv_group_size = 16;   // channels per group: G = hidden_size / conv_group_size
  int selector_top_k = 16;    // K candidates the selector reranks per block position
  int selector_rank = 256;    // r of the predecessor/successor codebooks [V, r] and hidden_projection [r, H]
};

// DFlash / DFlash2 drafter (z-lab release format): a Qwen3 stack + dflash fields.
struct DrafterConfig {
  DraftArch arch = DraftArch::DFlash;
  DFlash2Shape d2;  // DFlash2 only
  // compute_logits: z = c tanh(m lm_head(h) / c) (m = output_multiplier; softcap c, 0 = off). DFlash
  // releases have neither field (the identity); DFlash2 releases carry both in dflash_config.
  float output_multiplier = 1.0f;
  float final_logit_softcapping = 0.0f;
  // The official generate scales the noise embedding by this (dflash_config.input_embedding_scale, default 1).
  float input_embedding_scale = 1.0f;
  // config.json's is_causal: absent (-1) = sliding layers causal within the block, full layers not (the
  // DFlash rule); 0 = every layer sees its whole block; 1 = every layer causal within the block.
  int is_causal = -1;
  Qwen3Config layers;               // vocab_size = target's vocab; no embedding/lm_head of its own;
                                    // weight_prefix "" (keys are "layers.N.*", "fc.weight", "norm.weight")
  int block_size = 16;
  int num_target_layers = 0;
  int mask_token_id = 0;
  std::vector<int> target_layer_ids;  // layer id l = output of target decoder layer l
  std::string torch_dtype = "bfloat16";  // config.json "dtype": the dtype the weights are exported in
};
DrafterConfig parse_drafter_config(const nlohmann::json& j, const std::string& source);
DrafterConfig load_drafter_config(const std::string& config_json_path);
nlohmann::json drafter_config_to_json(const DrafterConfig& c);  // the release format's config.json

// Default ids, as the official build_target_layer_ids: round(1 + i·(L−4)/(n−1)), i = 0..n−1, Python's
// round (half to even); n = 1: [L // 2], the middle layer.
std::vector<int> default_target_layer_ids(int num_target_layers, int num_draft_layers);

// Rejects a drafter that does not fit the target (hidden size, layer ids out of range, block size < 2,
// mask token outside the vocab) with a BadInput error that says which.
void check_drafter_fits_target(const DrafterConfig& d, const Qwen3Config& t);

}  // namespace dflash
