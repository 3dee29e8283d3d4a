// Drafter release-format I/O and fresh initialisation (see include/dflash/drafter_model.h).
#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "dflash/drafter.h"
#include "dflash/drafter_model.h"
#include "dflash/error.h"
#include "dflash/safe_dir.h"
#include "dflash/rng.h"
#include "dflash/safetensors.h"

namespace dflash {

DrafterConfig fresh_drafter_config(const Qwen3Config& target, int num_layers, int block_size, int mask_token_id) {
  DF_CHECK_HINT(num_layers >= 1, BadOptions, "a fresh drafter needs at least one layer (got " << num_layers << ")",
                "set --draft-layers (DFlash drafters typically have 5)");
  DrafterConfig d;
  d.layers = target;
  d.layers.num_hidden_layers = num_layers;
  d.layers.layer_types.assign(static_cast<size_t>(num_layers), "full_attention");
  d.layers.sliding_window = 0;
  d.layers.weight_prefix = "";
  d.layers.tie_word_embeddings = false;
  d.block_size = block_size;
  d.num_target_layers = target.num_hidden_layers;
  d.target_layer_ids = default_target_layer_ids(target.num_hidden_layers, num_layers);
  if (mask_token_id >= 0) {
    d.mask_token_id = mask_token_id;
  } else if (target.vocab_size == 151936) {
    d.mask_token_id = 151669;  // Qwen3: an unused id inside the vocabulary (docs/pipeline.md --mask-token)
  } else if (target.vocab_size == 248320) {
    d.mask_token_id = 248070;  // Qwen3.5 / 3.6
  } else {
    d.mask_token_id = target.vocab_size - 1;
  }
  return d;
}

DrafterConfig fresh_drafter_config(const Qwen3Config& target, int num_layers, const TrainOptions& opt) {
  DrafterConfig d = fresh_drafter_config(target, num_layers, opt.block_size, opt.mask_token_id);
  DF_CHECK_HINT(opt.block_size >= 2, BadOptions, "--block-size " << opt.block_size << ": a block is the anchor and at least one guess",
                "DFlash drafters use 16");
  if (!opt.target_layer_ids.empty()) d.target_layer_ids = opt.target_layer_ids;
  for (int l : d.target_layer_ids)
    DF_CHECK_HINT(l >= 0 && l < target.num_hidden_layers, BadOptions,
                  "--target-layers: layer " << l << " is not one of the target's " << target.num_hidden_layers << " layers",
                  "layer l is the output of decoder layer l, 0 .. " + std::to_string(target.num_hidden_layers - 1));
  if (!opt.layer_types.empty()) {
    DF_CHECK_HINT(static_cast<int>(opt.layer_types.size()) == num_layers, BadOptions,
                  "--draft-layer-types names " << opt.layer_types.size() << " layers for a drafter of " << num_layers,
                  "give one type per --draft-layers layer, e.g. sliding,sliding,sliding,sliding,full");
    d.layers.layer_types = opt.layer_types;
  }
  const bool any_sliding = std::count(d.layers.layer_types.begin(), d.layers.layer_types.end(), "sliding_attention") > 0;
  DF_CHECK_HINT(!any_sliding || opt.sliding_window > 0, BadOptions, "sliding drafter layers need --draft-sliding-window",
                "the Qwen3.6-27B recipe uses --draft-sliding-window 2048");
  DF_CHECK_HINT(any_sliding || opt.sliding_window == 0, BadOptions,
                "--draft-sliding-window " << opt.sliding_window << " without a sliding layer does nothing",
                "name the sliding layers with --draft-layer-types, or drop --draft-sliding-window");
  d.layers.sliding_window = any_sliding ? opt.sliding_window : 0;
  // The heads are the drafter's own (its attention reads the fused context through its own k/v projections):
  // any shape the block attention takes, the target's by default.
  if (opt.draft_heads > 0) d.layers.num_attention_heads = opt.draft_heads;
  if (opt.draft_head_dim > 0) d.layers.head_dim = opt.draft_head_dim;
  if (opt.draft_kv_heads > 0) d.layers.num_key_value_heads = opt.draft_kv_heads;
  const Qwen3Config& L = d.layers;
  DF_CHECK_HINT(L.num_key_value_heads >= 1 && L.num_attention_heads % L.num_key_value_heads == 0, BadOptions,
                "a fresh drafter's " << L.num_attention_heads << " query heads are not a multiple of its "
                                     << L.num_key_value_heads << " KV heads",
                "give --draft-heads a multiple of --draft-kv-heads (the Qwen3.8-27B release: 32 and 8)");
  DF_CHECK_HINT(L.head_dim >= 2 && L.head_dim % 2 == 0, BadOptions,
                "--draft-head-dim " << L.head_dim << ": RoPE rotates pairs of channels, the head dim must be even",
                "the Qwen3.8-27B release uses 128");
  d.arch = opt.draft_arch;
  d.output_multiplier = opt.output_multiplier;
  d.final_logit_softcapping = opt.logit_softcap;
  if (d.arch == DraftArch::DFlash2) {
    d.d2 = opt.d2;
    // The releases say is_causal false: every row sees its whole block, in sliding layers too (the window then
    // bounds the context only: BlockAttnSpec::full_block).
    d.is_causal = 0;
    // Positive before the division: 0 divided (SIGFPE) and a negative size passed it (SIGSEGV later).
    DF_CHECK_HINT(d.d2.conv_group_size >= 1, BadOptions,
                  "bad value " << d.d2.conv_group_size << " for --conv-group-size: channels per conv group must be >= 1",
                  "the releases use 16; it must divide the target's hidden size " + std::to_string(target.hidden_size));
    DF_CHECK_HINT(target.hidden_size % d.d2.conv_group_size == 0, BadOptions,
                  "--conv-group-size " << d.d2.conv_group_size << " does not divide the target's hidden size "
                                       << target.hidden_size,
                  "the releases use 16");
    DF_CHECK_HINT(d.d2.conv_kernel_size >= 1 && d.d2.conv_kernel_size <= opt.block_size, BadOptions,
                  "--conv-kernel-size " << d.d2.conv_kernel_size << " must be 1 .. --block-size " << opt.block_size,
                  "the releases use 2");
    DF_CHECK_HINT(d.d2.selector_top_k >= 1 && d.d2.selector_top_k <= 64 && d.d2.selector_top_k <= target.vocab_size,
                  BadOptions, "--selector-top-k " << d.d2.selector_top_k << " must be 1 .. 64",
                  "the releases use 16");
    DF_CHECK_HINT(d.d2.selector_rank >= 1 && d.d2.selector_rank <= 4096, BadOptions,
                  "--selector-rank " << d.d2.selector_rank << " must be 1 .. 4096", "the releases use 256");
  }
  return d;
}

DrafterConfig drafter_config_for(const Qwen3Config& target, const std::string& drafter_dir, int num_layers,
                                 const TrainOptions& opt) {
  if (!drafter_dir.empty()) return load_drafter_config(drafter_dir + "/config.json");
  return fresh_drafter_config(target, num_layers, opt);
}

DrafterSource DrafterSource::from_dirs(const std::string& target_dir, const std::string& drafter_dir, int num_layers,
                                       const TrainOptions& opt) {
  DrafterSource s;
  s.target = load_qwen3_config(target_dir + "/config.json");
  s.target_dir = target_dir;
  s.drafter = drafter_config_for(s.target, drafter_dir, num_layers, opt);
  s.drafter_dir = drafter_dir;
  return s;
}

void load_drafter_weights(const std::string& dir, const DrafterConfig& c, float* flat) {
  Checkpoint ck(dir);
  // Tensors of a layer the config does not have: a drafter of another depth under this config.json, whose
  // extra layers would be dropped without a word (other names, e.g. a trainer's extras, stay allowed).
  const int64_t layers = c.layers.num_hidden_layers;
  for (const std::string& name : ck.names()) {
    const size_t at = name.find("layers.");
    if (at == std::string::npos || (at > 0 && name[at - 1] != '.')) continue;
    const long idx = std::strtol(name.c_str() + at + 7, nullptr, 10);
    DF_CHECK_HINT(idx < layers, BadInput,
                  "--drafter " << dir << ": tensor " << name << " belongs to layer " << idx << ", but its config.json "
                               << "has " << layers << " layer(s)",
                  "the weights and config.json come from different drafters: export them together");
  }
  for (const ParamSpec& p : drafter_param_layout(c)) {
    // The release stores the codebooks without ".weight"; the official module's named_parameters() (and a
    // state_dict saved from it) has it: accept both (docs/dflash2.md 2.1).
    const bool alt = p.name.find("_codebook") != std::string::npos && !ck.has(p.name) && ck.has(p.name + ".weight");
    ck.load_f32(alt ? p.name + ".weight" : p.name, p.shape, flat + p.offset);
  }
}

void init_drafter_weights(const DrafterConfig& c, uint64_t seed, float* flat) {
  Rng rng(seed);
  for (const ParamSpec& p : drafter_param_layout(c)) {
    float* w = flat + p.offset;
    const size_t n = p.numel();
    if (p.is_norm()) {
      for (size_t i = 0; i < n; ++i) w[i] = 1.0f;
    } else if (p.is_conv_base()) {  // [2, k, H]: tap 0 passes the row through, as speculators' reset_parameters
      const size_t k = static_cast<size_t>(p.shape[1]), H = static_cast<size_t>(p.shape[2]);
      for (size_t i = 0; i < n; ++i) w[i] = (i / H) % k == 0 ? 1.0f : 0.0f;
    } else if (p.is_conv_projection() || p.name == "candidate_selector.successor_codebook") {
      // Zero: a fresh conv and selector start as exact no-ops (the reference's init, docs/dflash2.md 4.2);
      // with S = 0 only the successor codebook moves at first, the other two once it is nonzero.
      for (size_t i = 0; i < n; ++i) w[i] = 0.0f;
    } else {
      for (size_t i = 0; i < n; ++i) w[i] = static_cast<float>(0.02 * rng.normal());
    }
  }
}

void export_drafter(const std::string& dir, const DrafterConfig& c, const float* flat, DType dtype) {
  DF_CHECK(dtype == DType::F32 || dtype == DType::BF16, BadOptions,
           "drafter export dtype " << dtype_name(dtype) << " (F32 or BF16)");
  // Under --out, walked from its descriptor at the time of writing (a link swapped in mid-run is refused).
  create_dirs(dir, "check the path and its permissions");
  std::vector<TensorToWrite> tensors;
  for (const ParamSpec& p : drafter_param_layout(c)) {
    TensorToWrite t;
    t.name = p.name;
    t.dtype = dtype;
    t.shape = p.shape;
    t.f32 = flat + p.offset;
    tensors.push_back(std::move(t));
  }
  write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  DrafterConfig out = c;
  out.torch_dtype = dtype == DType::F32 ? "float32" : "bfloat16";
  write_file_atomic(dir + "/config.json", drafter_config_to_json(out).dump(2) + "\n");
}

}  // namespace dflash
