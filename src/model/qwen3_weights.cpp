#include "model/qwen3_weights.h"

#include <algorithm>
#include <map>
#include <string>

#include "dflash/backend.h"
#include "dflash/error.h"

namespace dflash {
namespace {

struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;  // as in the checkpoint
  Buffer* dst;
  // A part of a fused projection: the tensor goes to rows [row0, row0 + shape[0]) of *dst, which holds
  // fused_rows rows in all (allocated by whichever part loads first). fused_rows = 0: dst is the tensor.
  int64_t row0 = 0, fused_rows = 0;
};

Buffer make_buffer(Device dev, DType dtype, const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return Buffer(dev, dtype, {shape[0]});
  DF_ASSERT(shape.size() == 2);
  return Buffer(dev, dtype, {shape[0], shape[1]});
}

std::vector<WeightSpec> weight_specs(const Qwen3Config& c, Qwen3Weights& w) {
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size;
  const int64_t q_dim = int64_t(c.num_attention_heads) * c.head_dim;
  const int64_t kv_dim = int64_t(c.num_key_value_heads) * c.head_dim;
  const std::string& p = c.weight_prefix;
  std::vector<WeightSpec> s;
  s.push_back({p + "embed_tokens.weight", {V, H}, &w.embed_tokens});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Qwen3LayerWeights& L = w.layers[l];
    const std::string lp = p + "layers." + std::to_string(l) + ".";
    s.push_back({lp + "input_layernorm.weight", {H}, &L.input_layernorm});
    const int64_t qkv_rows = q_dim + 2 * kv_dim;
    s.push_back({lp + "self_attn.q_proj.weight", {q_dim, H}, &L.qkv_proj, 0, qkv_rows});
    s.push_back({lp + "self_attn.k_proj.weight", {kv_dim, H}, &L.qkv_proj, q_dim, qkv_rows});
    s.push_back({lp + "self_attn.v_proj.weight", {kv_dim, H}, &L.qkv_proj, q_dim + kv_dim, qkv_rows});
    s.push_back({lp + "self_attn.o_proj.weight", {H, q_dim}, &L.o_proj});
    s.push_back({lp + "self_attn.q_norm.weight", {c.head_dim}, &L.q_norm});
    s.push_back({lp + "self_attn.k_norm.weight", {c.head_dim}, &L.k_norm});
    s.push_back({lp + "post_attention_layernorm.weight", {H}, &L.post_attention_layernorm});
    s.push_back({lp + "mlp.gate_proj.weight", {I, H}, &L.gate_up_proj, 0, 2 * I});
    s.push_back({lp + "mlp.up_proj.weight", {I, H}, &L.gate_up_proj, I, 2 * I});
    s.push_back({lp + "mlp.down_proj.weight", {H, I}, &L.down_proj});
  }
  s.push_back({p + "norm.weight", {H}, &w.norm});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {V, H}, &w.lm_head});
  return s;
}

}  // namespace

void check_qwen3_target_config(const Qwen3Config& c, const std::string& source) {
  DF_CHECK_HINT(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0 &&
                    c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim > 0,
                BadInput, source << ": model sizes must all be positive", "check config.json");
  DF_CHECK_HINT(c.num_attention_heads % c.num_key_value_heads == 0, BadInput,
                source << ": num_attention_heads " << c.num_attention_heads << " is not a multiple of "
                       << "num_key_value_heads " << c.num_key_value_heads,
                "check config.json");
  DF_CHECK_HINT(c.head_dim % 2 == 0, BadInput, source << ": head_dim " << c.head_dim << " must be even for RoPE",
                "check config.json");
  for (size_t l = 0; l < c.layer_types.size(); ++l)
    DF_CHECK_HINT(c.layer_types[l] == "full_attention", BadInput,
                  source << ": layer " << l << " is " << c.layer_types[l]
                         << "; this build runs dense Qwen3 targets with full attention in every layer",
                  c.layer_types[l] == "linear_attention"
                      ? "Qwen3.5/3.6 hybrid targets (Gated DeltaNet layers) are not supported by this build"
                      : "sliding-window target layers are not supported by this build");
}

void check_no_layers_beyond_config(const Checkpoint& ckpt, const Qwen3Config& cfg) {
  const std::string layers = cfg.weight_prefix + "layers.";
  for (const std::string& name : ckpt.names()) {
    if (name.compare(0, layers.size(), layers) != 0) continue;
    const size_t dot = name.find('.', layers.size());
    const std::string index = name.substr(layers.size(), dot == std::string::npos ? std::string::npos : dot - layers.size());
    if (index.empty() || index.size() > 6 || index.find_first_not_of("0123456789") != std::string::npos) continue;
    DF_CHECK_HINT(std::stoi(index) < cfg.num_hidden_layers, BadInput,
                  ckpt.dir() << " holds " << name << " (decoder layer " << index << "), but its config.json has "
                             << "num_hidden_layers = " << cfg.num_hidden_layers
                             << ": the weights are of a deeper model than the config describes",
                  "use the config.json that came with these weights (its num_hidden_layers counts every layer)");
  }
}

Qwen3Weights load_qwen3_weights(Checkpoint& ckpt, const Qwen3Config& cfg, const Ctx& ctx, DType dtype) {
  check_qwen3_target_config(cfg, ckpt.dir() + "/config.json");
  check_no_layers_beyond_config(ckpt, cfg);
  Qwen3Weights w;
  w.layers.resize(cfg.num_hidden_layers);
  std::vector<WeightSpec> specs = weight_specs(cfg, w);

  // Everything present, right shape, floating dtype: before any allocation or conversion.
  size_t max_numel = 0;
  for (const WeightSpec& s : specs) {
    const TensorInfo& t = ckpt.expect_float(s.name, s.shape, "the checkpoint does not match its config.json");
    max_numel = std::max(max_numel, t.numel());
  }
  {
    std::vector<std::string> names;
    for (const WeightSpec& s : specs) names.push_back(s.name);
    ckpt.check_dtype_label(names, cfg.dtype_label);
  }

  // Load shard by shard, releasing each shard's mapping once its last tensor is in place, so a large
  // checkpoint is never mapped whole: straight into the buffer when it is host float32, else through one
  // host staging buffer (converted to the device dtype on the way).
  std::stable_sort(specs.begin(), specs.end(), [&](const WeightSpec& a, const WeightSpec& b) {
    return ckpt.shard_of(a.name) < ckpt.shard_of(b.name);
  });
  std::map<std::string, size_t> left_in_shard;
  for (const WeightSpec& s : specs) ++left_in_shard[ckpt.shard_of(s.name)];
  const bool direct = ctx.device == Device::CPU && dtype == DType::F32;
  std::vector<float> staging(direct ? 0 : max_numel);
  for (WeightSpec& s : specs) {
    if (s.fused_rows == 0) {
      *s.dst = make_buffer(ctx.device, dtype, s.shape);
    } else if (s.dst->t().empty()) {
      *s.dst = make_buffer(ctx.device, dtype, {s.fused_rows, s.shape[1]});
    }
    const Tensor dst = s.fused_rows == 0 ? s.dst->t() : s.dst->t().slice_rows(s.row0, s.row0 + s.shape[0]);
    if (direct) {
      ckpt.load_f32(s.name, s.shape, dst.ptr<float>());
    } else {
      ckpt.load_f32(s.name, s.shape, staging.data());
      Tensor src = dst;
      src.data = staging.data();
      src.dtype = DType::F32;
      src.device = Device::CPU;
      copy_tensor(ctx, dst, src);
      synchronize(ctx);  // the staging buffer is reused by the next tensor
    }
    const std::string& shard = ckpt.shard_of(s.name);
    if (--left_in_shard[shard] == 0) ckpt.release_shard(shard);
  }
  for (const std::string& shard : ckpt.shard_files()) ckpt.release_shard(shard);

  // The original projections as row slices of the fused buffers (the order weight_specs loads them in).
  const int64_t I = cfg.intermediate_size;
  const int64_t q_dim = int64_t(cfg.num_attention_heads) * cfg.head_dim;
  const int64_t kv_dim = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
  for (Qwen3LayerWeights& L : w.layers) {
    L.q_proj = L.qkv_proj.t().slice_rows(0, q_dim);
    L.k_proj = L.qkv_proj.t().slice_rows(q_dim, q_dim + kv_dim);
    L.v_proj = L.qkv_proj.t().slice_rows(q_dim + kv_dim, q_dim + 2 * kv_dim);
    L.gate_proj = L.gate_up_proj.t().slice_rows(0, I);
    L.up_proj = L.gate_up_proj.t().slice_rows(I, 2 * I);
  }
  return w;
}

}  // namespace dflash
