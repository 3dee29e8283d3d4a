// Drafter parameter layout in one flat fp32 buffer, and the per-tensor views over it.
#include <algorithm>

#include "dflash/drafter_model.h"
#include "dflash/error.h"

namespace dflash {

size_t ParamSpec::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

bool ParamSpec::is_norm() const { return name.find("norm") != std::string::npos; }

namespace {
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

bool ParamSpec::is_conv_base() const { return ends_with(name, "_conv.base_kernel"); }
bool ParamSpec::is_conv_projection() const { return ends_with(name, "_conv.kernel_projection.weight"); }

std::vector<ParamSpec> drafter_param_layout(const DrafterConfig& c) {
  const Qwen3Config& L = c.layers;
  const int64_t H = L.hidden_size, K = static_cast<int64_t>(c.target_layer_ids.size());
  const int64_t QD = static_cast<int64_t>(L.num_attention_heads) * L.head_dim;
  const int64_t KV = static_cast<int64_t>(L.num_key_value_heads) * L.head_dim;
  const int64_t I = L.intermediate_size, hd = L.head_dim;
  std::vector<ParamSpec> out;
  size_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    ParamSpec p{std::move(name), std::move(shape), offset};
    offset += p.numel();
    out.push_back(std::move(p));
  };
  add("fc.weight", {H, K * H});
  add("hidden_norm.weight", {H});
  for (int l = 0; l < L.num_hidden_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H});
    add(p + "self_attn.q_proj.weight", {QD, H});
    add(p + "self_attn.k_proj.weight", {KV, H});
    add(p + "self_attn.v_proj.weight", {KV, H});
    add(p + "self_attn.o_proj.weight", {H, QD});
    add(p + "self_attn.q_norm.weight", {hd});
    add(p + "self_attn.k_norm.weight", {hd});
    add(p + "post_attention_layernorm.weight", {H});
    add(p + "mlp.gate_proj.weight", {I, H});
    add(p + "mlp.up_proj.weight", {I, H});
    add(p + "mlp.down_proj.weight", {H, I});
    if (c.arch == DraftArch::DFlash2) {
      const int64_t k = c.d2.conv_kernel_size, G = H / c.d2.conv_group_size;
      add(p + "attention_conv.base_kernel", {2, k, H});
      add(p + "attention_conv.kernel_projection.weight", {2 * k * G, H});
      add(p + "mlp_conv.base_kernel", {2, k, H});
      add(p + "mlp_conv.kernel_projection.weight", {2 * k * G, H});
    }
  }
  add("norm.weight", {H});
  // The selector last: its gradients are final first (before the network's backward starts).
  if (c.arch == DraftArch::DFlash2) {
    const int64_t r = c.d2.selector_rank, V = L.vocab_size;
    add("candidate_selector.hidden_projection.weight", {r, H});
    add("candidate_selector.predecessor_codebook", {V, r});
    add("candidate_selector.successor_codebook", {V, r});
  }
  return out;
}

size_t drafter_param_count(const DrafterConfig& c) {
  const auto layout = drafter_param_layout(c);
  return layout.back().offset + layout.back().numel();
}

DrafterViews bind_drafter_views(const DrafterConfig& c, float* flat) {
  const auto layout = drafter_param_layout(c);
  size_t i = 0;
  auto next = [&]() {
    const ParamSpec& p = layout.at(i++);
    Tensor t(flat + p.offset, DType::F32, Device::CPU, {});
    t.ndim = static_cast<int>(p.shape.size());
    for (int d = 0; d < t.ndim; ++d) t.shape[d] = p.shape[d];
    return t;
  };
  DrafterViews v;
  v.fc = next();
  v.hidden_norm = next();
  v.layers.resize(static_cast<size_t>(c.layers.num_hidden_layers));
  for (DrafterLayerViews& l : v.layers) {
    l.input_norm = next();
    l.q_proj = next();
    l.k_proj = next();
    l.v_proj = next();
    l.o_proj = next();
    l.q_norm = next();
    l.k_norm = next();
    l.post_norm = next();
    l.gate_proj = next();
    l.up_proj = next();
    l.down_proj = next();
    if (c.arch == DraftArch::DFlash2) {
      l.attn_conv_base = next();
      l.attn_conv_proj = next();
      l.mlp_conv_base = next();
      l.mlp_conv_proj = next();
    }
  }
  v.norm = next();
  if (c.arch == DraftArch::DFlash2) {
    v.sel_hidden_proj = next();
    v.sel_pred_codebook = next();
    v.sel_succ_codebook = next();
  }
  DF_ASSERT(i == layout.size());
  return v;
}

}  // namespace dflash
