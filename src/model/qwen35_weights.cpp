#include "model/qwen35_weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "model/qwen3_weights.h"  // check_no_layers_beyond_config

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
  bool keep_f32 = false;            // the decay parameters: float32 on every backend (they feed exp)
  // A part of a fused projection (Plain only): the tensor goes to rows [row0, row0 + buf_shape[0]) of
  // *dst, which holds fused_rows rows in all (allocated by whichever part loads first).
  int64_t row0 = 0, fused_rows = 0;
};

Buffer make_weight(const Ctx& ctx, DType dtype, const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return Buffer(ctx.device, dtype, {shape[0]});
  DF_ASSERT(shape.size() == 2);
  return Buffer(ctx.device, dtype, {shape[0], shape[1]});
}

// dst (any backend) = host float32 src, converted to dst's dtype; the staging is free again on return.
void upload(const Ctx& ctx, const Tensor& dst, const float* src) {
  Tensor s = dst;
  s.data = const_cast<float*>(src);
  s.dtype = DType::F32;
  s.device = Device::CPU;
  copy_tensor(ctx, dst, s);
  synchronize(ctx);
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
      WeightSpec a_log{ap + "A_log", {g.nv}, {g.nv}, &A.A_log};
      WeightSpec dt_bias{ap + "dt_bias", {g.nv}, {g.nv}, &A.dt_bias};
      a_log.keep_f32 = dt_bias.keep_f32 = true;
      s.push_back(a_log);
      s.push_back(dt_bias);
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
    WeightSpec gate{lp + "mlp.gate_proj.weight", {I, H}, {I, H}, &L.gate_up_proj};
    WeightSpec up{lp + "mlp.up_proj.weight", {I, H}, {I, H}, &L.gate_up_proj};
    gate.fused_rows = up.fused_rows = 2 * I;
    up.row0 = I;
    s.push_back(gate);
    s.push_back(up);
    s.push_back({lp + "mlp.down_proj.weight", {H, I}, {H, I}, &L.down_proj});
  }
  s.push_back({p + "norm.weight", {H}, {H}, &w.norm, LoadAs::ZeroCentred});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {V, H}, {V, H}, &w.lm_head});
  return s;
}

}  // namespace

Qwen35Weights load_qwen35_weights(Checkpoint& ckpt, const Qwen35Config& cfg, const Ctx& ctx, DType dtype) {
  check_no_layers_beyond_config(ckpt, cfg.text);
  Qwen35Weights w;
  w.layers.resize(cfg.text.num_hidden_layers);
  std::vector<WeightSpec> specs = weight_specs(cfg, w);

  // Everything present, right shape, floating dtype: before any allocation or conversion.
  size_t staging_numel = 0;
  for (const WeightSpec& s : specs) {
    const TensorInfo& t = ckpt.expect_float(s.name, s.ckpt_shape,
                                            "the checkpoint does not match its config.json (Qwen3.5 hybrid layout)");
    staging_numel = std::max(staging_numel, t.numel());
  }
  {
    std::vector<std::string> names;
    for (const WeightSpec& s : specs) names.push_back(s.name);
    ckpt.check_dtype_label(names, cfg.text.dtype_label);
  }

  // Shard by shard, each shard's mapping released once its last tensor is in place (a 27B checkpoint is
  // never mapped whole); every tensor goes through one host float32 staging buffer, where the load-time
  // rewrites happen, and on to its buffer in the backend's dtype.
  std::stable_sort(specs.begin(), specs.end(), [&](const WeightSpec& a, const WeightSpec& b) {
    return ckpt.shard_of(a.name) < ckpt.shard_of(b.name);
  });
  std::map<std::string, size_t> left_in_shard;
  for (const WeightSpec& s : specs) ++left_in_shard[ckpt.shard_of(s.name)];
  std::vector<float> staging(staging_numel);
  for (WeightSpec& s : specs) {
    const DType dt = s.keep_f32 ? DType::F32 : dtype;
    if (s.fused_rows == 0) {
      *s.dst = make_weight(ctx, dt, s.buf_shape);
    } else if (s.dst->t().empty()) {
      *s.dst = make_weight(ctx, dt, {s.fused_rows, s.buf_shape[1]});
    }
    ckpt.load_f32(s.name, s.ckpt_shape, staging.data());
    switch (s.how) {
      case LoadAs::Plain:
        upload(ctx, s.fused_rows == 0 ? s.dst->t() : s.dst->t().slice_rows(s.row0, s.row0 + s.buf_shape[0]),
               staging.data());
        break;
      case LoadAs::ZeroCentred:
        for (size_t i = 0; i < s.dst->numel(); ++i) staging[i] = 1.0f + staging[i];
        upload(ctx, *s.dst, staging.data());
        break;
      case LoadAs::SplitQueryGate: {
        // Per head h: rows [2h*hd, 2h*hd + hd) are the query, the next hd rows the gate
        // (HF: q_proj(x).view(..., nh, 2*hd).chunk(2, dim=-1)): gathered in place, queries first.
        *s.dst2 = make_weight(ctx, dt, s.buf_shape);
        const size_t head_rows = static_cast<size_t>(s.head_dim) * s.ckpt_shape[1];
        std::vector<float> split(2 * s.heads * head_rows);
        for (int64_t h = 0; h < s.heads; ++h) {
          const float* src = staging.data() + 2 * h * head_rows;
          std::memcpy(split.data() + h * head_rows, src, head_rows * sizeof(float));
          std::memcpy(split.data() + (s.heads + h) * head_rows, src + head_rows, head_rows * sizeof(float));
        }
        upload(ctx, *s.dst, split.data());
        upload(ctx, *s.dst2, split.data() + s.heads * head_rows);
        break;
      }
    }
    const std::string& shard = ckpt.shard_of(s.name);
    if (--left_in_shard[shard] == 0) ckpt.release_shard(shard);
  }
  for (const std::string& shard : ckpt.shard_files()) ckpt.release_shard(shard);
  const int64_t I = cfg.text.intermediate_size;
  for (Qwen35LayerWeights& L : w.layers) {
    L.gate_proj = L.gate_up_proj.t().slice_rows(0, I);
    L.up_proj = L.gate_up_proj.t().slice_rows(I, 2 * I);
  }
  return w;
}

}  // namespace dflash
