#include "model/decoder_weights.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/fp8.h"
#include "model/fp8_weights.h"

namespace dflash {
namespace {

Buffer make_weight(const Ctx& ctx, DType dtype, const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return Buffer(ctx.device, dtype, {shape[0]});
  DF_ASSERT(shape.size() == 2);
  return Buffer(ctx.device, dtype, {shape[0], shape[1]});
}

// dst (any backend) = host float32 src, converted to dst's dtype; src is free again on return.
void upload(const Ctx& ctx, const Tensor& dst, const float* src) {
  Tensor s = dst;
  s.data = const_cast<float*>(src);
  s.dtype = DType::F32;
  s.device = Device::CPU;
  copy_tensor(ctx, dst, s);
  synchronize(ctx);
}

}  // namespace

WeightSpec plain_weight(std::string name, std::vector<int64_t> shape, Buffer* dst, LoadAs how) {
  WeightSpec s;
  s.name = std::move(name);
  s.ckpt_shape = shape;
  s.buf_shape = std::move(shape);
  s.dst = dst;
  s.how = how;
  return s;
}

WeightSpec fused_part(std::string name, int64_t rows, int64_t H, Buffer* dst, int64_t row0, int64_t fused_rows) {
  WeightSpec s = plain_weight(std::move(name), {rows, H}, dst);
  s.row0 = row0;
  s.fused_rows = fused_rows;
  return s;
}

WeightSpec linear_weight(std::string name, std::vector<int64_t> shape, LinearWeight* dst, LoadAs how) {
  WeightSpec s = plain_weight(std::move(name), std::move(shape), dst, how);
  s.linear = dst;
  return s;
}

WeightSpec fused_linear_part(std::string name, int64_t rows, int64_t H, LinearWeight* dst, int64_t row0,
                             int64_t fused_rows) {
  WeightSpec s = fused_part(std::move(name), rows, H, dst, row0, fused_rows);
  s.linear = dst;
  return s;
}

std::vector<WeightSpec> decoder_weight_specs(const Qwen3Config& c, DecoderStackWeights& w,
                                             const std::vector<DecoderLayerWeights*>& layers, LoadAs norms,
                                             const MixerSpecs& mixer_specs) {
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size;
  const std::string& p = c.weight_prefix;
  DF_ASSERT(layers.size() == static_cast<size_t>(c.num_hidden_layers));
  std::vector<WeightSpec> s;
  s.push_back(plain_weight(p + "embed_tokens.weight", {V, H}, &w.embed_tokens));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    DecoderLayerWeights& L = *layers[l];
    const std::string lp = p + "layers." + std::to_string(l) + ".";
    s.push_back(plain_weight(lp + "input_layernorm.weight", {H}, &L.input_layernorm, norms));
    mixer_specs(l, lp, s);
    s.push_back(plain_weight(lp + "post_attention_layernorm.weight", {H}, &L.post_attention_layernorm, norms));
    s.push_back(fused_linear_part(lp + "mlp.gate_proj.weight", I, H, &L.gate_up_proj, 0, 2 * I));
    s.push_back(fused_linear_part(lp + "mlp.up_proj.weight", I, H, &L.gate_up_proj, I, 2 * I));
    s.push_back(linear_weight(lp + "mlp.down_proj.weight", {H, I}, &L.down_proj));
  }
  s.push_back(plain_weight(p + "norm.weight", {H}, &w.norm, norms));
  if (!c.tie_word_embeddings) s.push_back(plain_weight("lm_head.weight", {V, H}, &w.lm_head));
  return s;
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

void load_decoder_weights(Checkpoint& ckpt, const Qwen3Config& c, const TargetQuantization& quant,
                          std::vector<WeightSpec> specs, const std::vector<DecoderLayerWeights*>& layers,
                          const Ctx& ctx, DType dtype, const char* mismatch_hint) {
  // A host float32 tensor taken as stored needs no staging: it is read straight into its buffer.
  auto direct = [&](const WeightSpec& s) {
    return s.how == LoadAs::Plain && ctx.device == Device::CPU && (s.keep_f32 || dtype == DType::F32) &&
           !s.stored_fp8 && !s.runs_fp8;
  };

  // Everything present, right shape, floating dtype (or FP8 with its scales, as config.json says): before
  // any allocation or conversion.
  size_t staging_numel = 0;
  std::map<const LinearWeight*, const WeightSpec*> fused_first;  // a fused linear's parts must agree
  for (WeightSpec& s : specs) {
    if (s.linear) {
      plan_linear(ckpt, quant, s, mismatch_hint);
      const WeightSpec*& first = fused_first[s.linear];
      if (!first) first = &s;
      DF_CHECK_HINT(first->runs_fp8 == s.runs_fp8, BadInput,
                    "the checkpoint " << ckpt.dir() << " stores " << first->name << " and " << s.name
                                      << " in different precisions, but they run as one fused projection",
                    "quantize every projection that reads the same input alike (q/k/v, gate/up)");
    } else {
      ckpt.expect_float(s.name, s.ckpt_shape, mismatch_hint);
    }
    if (!direct(s)) staging_numel = std::max(staging_numel, ckpt.get(s.name).numel());
  }
  {
    std::vector<std::string> names;
    for (const WeightSpec& s : specs) names.push_back(s.name);
    ckpt.check_dtype_label(names, c.dtype_label);
  }

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
    const Tensor dst = s.fused_rows == 0 ? s.dst->t() : s.dst->t().slice_rows(s.row0, s.row0 + s.buf_shape[0]);
    for (LinearWeight* L : {s.linear, s.linear2}) {
      if (!L || !s.runs_fp8) continue;
      L->mode = LinearMode::Fp8;
      L->act_group = quant.format == CheckpointFp8::None ? fp8::kBlock : quant.act_group;
    }
    if (direct(s)) {
      ckpt.load_f32(s.name, s.ckpt_shape, dst.ptr<float>());
    } else {
      if (s.linear)
        load_linear_f32(ckpt, quant, s, staging.data());
      else
        ckpt.load_f32(s.name, s.ckpt_shape, staging.data());
      switch (s.how) {
        case LoadAs::Plain:
          upload(ctx, dst, staging.data());
          break;
        case LoadAs::ZeroCentred:
          for (size_t i = 0; i < dst.numel(); ++i) staging[i] = 1.0f + staging[i];
          upload(ctx, dst, staging.data());
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
          upload(ctx, dst, split.data());
          upload(ctx, *s.dst2, split.data() + s.heads * head_rows);
          break;
        }
      }
    }
    const std::string& shard = ckpt.shard_of(s.name);
    if (--left_in_shard[shard] == 0) ckpt.release_shard(shard);
  }
  for (const std::string& shard : ckpt.shard_files()) ckpt.release_shard(shard);

  const int64_t I = c.intermediate_size;
  for (DecoderLayerWeights* L : layers) {
    L->gate_proj = L->gate_up_proj.t().slice_rows(0, I);
    L->up_proj = L->gate_up_proj.t().slice_rows(I, 2 * I);
  }
}

}  // namespace dflash
