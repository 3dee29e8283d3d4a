#include "model/qwen35_weights.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "dflash/error.h"

namespace dflash {
namespace {

// How a checkpoint tensor becomes the buffer(s) the forward uses.
enum class LoadAs : uint8_t {
  Plain,           // as stored
  ZeroCentred,     // 1 + w (HF Qwen3_5RMSNorm)
  SplitQueryGate,  // q_proj [nh * 2hd, H] -> dst (query rows), dst2 (gate rows)
};

struct WeightSpec {
  std::string name;
  std::vector<int64_t> ckpt_shape;  // as stored (conv1d is [C, 1, K])
  std::vector<int64_t> buf_shape;   // as used (1-d or 2-d)
  Buffer* dst;
  LoadAs how = LoadAs::Plain;
  Buffer* dst2 = nullptr;
  int64_t heads = 0, head_dim = 0;  // SplitQueryGate
};

Buffer host_buffer(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return Buffer(Device::CPU, DType::F32, {shape[0]});
  DF_ASSERT(shape.size() == 2);
  return Buffer(Device::CPU, DType::F32, {shape[0], shape[1]});
}

std::vector<WeightSpec> weight_specs(const Qwen35Config& cfg, Qwen35Weights& w) {
  const Qwen3Config& c = cfg.text;
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size;
  const int64_t nh = c.num_attention_heads, hd = c.head_dim;
  const int64_t q_dim = nh * hd, kv_dim = int64_t(c.num_key_value_heads) * hd;
  const ops::GdnHeads g = cfg.gdn_heads();
  const int64_t C = g.qkv_dim(), K = cfg.linear_conv_kernel_dim;
  const std::string& p = c.weight_prefix;
  std::vector<WeightSpec> s;
  s.push_back({p + "embed_tokens.weight", {V, H}, {V, H}, &w.embed_tokens});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Qwen35LayerWeights& L = w.layers[l];
    L.kind = cfg.kinds[l];
    const std::string lp = p + "layers." + std::to_string(l) + ".";
    s.push_back({lp + "input_layernorm.weight", {H}, {H}, &L.input_layernorm, LoadAs::ZeroCentred});
    if (L.kind == Qwen35LayerKind::LinearAttention) {
      Qwen35LinearAttnWeights& A = L.linear;
      const std::string ap = lp + "linear_attn.";
      s.push_back({ap + "in_proj_qkv.weight", {C, H}, {C, H}, &A.in_proj_qkv});
      s.push_back({ap + "in_proj_z.weight", {g.value_dim(), H}, {g.value_dim(), H}, &A.in_proj_z});
      s.push_back({ap + "in_proj_b.weight", {g.nv, H}, {g.nv, H}, &A.in_proj_b});
      s.push_back({ap + "in_proj_a.weight", {g.nv, H}, {g.nv, H}, &A.in_proj_a});
      s.push_back({ap + "conv1d.weight", {C, 1, K}, {C, K}, &A.conv1d});
      s.push_back({ap + "A_log", {g.nv}, {g.nv}, &A.A_log});
      s.push_back({ap + "dt_bias", {g.nv}, {g.nv}, &A.dt_bias});
      s.push_back({ap + "norm.weight", {g.dv}, {g.dv}, &A.norm});
      s.push_back({ap + "out_proj.weight", {H, g.value_dim()}, {H, g.value_dim()}, &A.out_proj});
    } else {
      Qwen35FullAttnWeights& A = L.attn;
      const std::string ap = lp + "self_attn.";
      WeightSpec q{ap + "q_proj.weight", {2 * q_dim, H}, {q_dim, H}, &A.q_proj, LoadAs::SplitQueryGate};
      q.dst2 = &A.gate_proj;
      q.heads = nh;
      q.head_dim = hd;
      s.push_back(q);
      s.push_back({ap + "k_proj.weight", {kv_dim, H}, {kv_dim, H}, &A.k_proj});
      s.push_back({ap + "v_proj.weight", {kv_dim, H}, {kv_dim, H}, &A.v_proj});
      s.push_back({ap + "o_proj.weight", {H, q_dim}, {H, q_dim}, &A.o_proj});
      s.push_back({ap + "q_norm.weight", {hd}, {hd}, &A.q_norm, LoadAs::ZeroCentred});
      s.push_back({ap + "k_norm.weight", {hd}, {hd}, &A.k_norm, LoadAs::ZeroCentred});
    }
    s.push_back({lp + "post_attention_layernorm.weight", {H}, {H}, &L.post_attention_layernorm, LoadAs::ZeroCentred});
    s.push_back({lp + "mlp.gate_proj.weight", {I, H}, {I, H}, &L.gate_proj});
    s.push_back({lp + "mlp.up_proj.weight", {I, H}, {I, H}, &L.up_proj});
    s.push_back({lp + "mlp.down_proj.weight", {H, I}, {H, I}, &L.down_proj});
  }
  s.push_back({p + "norm.weight", {H}, {H}, &w.norm, LoadAs::ZeroCentred});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {V, H}, {V, H}, &w.lm_head});
  return s;
}

}  // namespace

Qwen35Weights load_qwen35_weights(Checkpoint& ckpt, const Qwen35Config& cfg) {
  Qwen35Weights w;
  w.layers.resize(cfg.text.num_hidden_layers);
  std::vector<WeightSpec> specs = weight_specs(cfg, w);

  // Everything present, right shape, floating dtype: before any allocation or conversion.
  size_t staging_numel = 0;
  for (const WeightSpec& s : specs) {
    const TensorInfo& t = ckpt.expect_float(s.name, s.ckpt_shape,
                                            "the checkpoint does not match its config.json (Qwen3.5 hybrid layout)");
    if (s.how == LoadAs::SplitQueryGate) staging_numel = std::max(staging_numel, t.numel());
  }

  std::vector<float> staging(staging_numel);
  for (WeightSpec& s : specs) {
    *s.dst = host_buffer(s.buf_shape);
    float* dst = s.dst->ptr<float>();
    switch (s.how) {
      case LoadAs::Plain:
        ckpt.load_f32(s.name, s.ckpt_shape, dst);
        break;
      case LoadAs::ZeroCentred:
        ckpt.load_f32(s.name, s.ckpt_shape, dst);
        for (size_t i = 0; i < s.dst->numel(); ++i) dst[i] = 1.0f + dst[i];
        break;
      case LoadAs::SplitQueryGate: {
        *s.dst2 = host_buffer(s.buf_shape);
        float* gate = s.dst2->ptr<float>();
        ckpt.load_f32(s.name, s.ckpt_shape, staging.data());
        // Per head h: rows [2h*hd, 2h*hd + hd) are the query, the next hd rows the gate
        // (HF: q_proj(x).view(..., nh, 2*hd).chunk(2, dim=-1)).
        const size_t head_rows = static_cast<size_t>(s.head_dim) * s.ckpt_shape[1];
        for (int64_t h = 0; h < s.heads; ++h) {
          const float* src = staging.data() + 2 * h * head_rows;
          std::memcpy(dst + h * head_rows, src, head_rows * sizeof(float));
          std::memcpy(gate + h * head_rows, src + head_rows, head_rows * sizeof(float));
        }
        break;
      }
    }
  }
  for (const std::string& shard : ckpt.shard_files()) ckpt.release_shard(shard);
  return w;
}

}  // namespace dflash
