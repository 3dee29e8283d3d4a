#include "model/decoder_weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/fp8.h"
#include "dflash/ops.h"
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

// Per head h of a Qwen3.5 q_proj (rows of `row_elems` elements): rows [2h*hd, 2h*hd + hd) are the query,
// the next hd rows the gate (HF: q_proj(x).view(..., nh, 2*hd).chunk(2, dim=-1)); gathered into dst,
// queries first, then gates. Works on any element type (values, e4m3 codes, row scales).
template <class T>
void split_query_gate(const T* src, int64_t heads, int64_t head_dim, int64_t row_elems, T* dst) {
  const size_t head = static_cast<size_t>(head_dim * row_elems);
  for (int64_t h = 0; h < heads; ++h) {
    std::memcpy(dst + h * head, src + 2 * h * head, head * sizeof(T));
    std::memcpy(dst + (heads + h) * head, src + 2 * h * head + head, head * sizeof(T));
  }
}

// The mode of one FP8 linear (all its parts together): gemm_fits / codes_fit say whether every part passes
// fp8_gemm_fits (with the GEMM's row count, on a device that has it) / fp8_codes_fit.
LinearMode fp8_mode(Fp8LinearChoice choice, Device device, bool gemm_fits, bool codes_fit) {
  if (choice == Fp8LinearChoice::Emulate) return LinearMode::Fp8;
  if (gemm_fits && choice != Fp8LinearChoice::Dequant) return LinearMode::Fp8Gemm;
  // The CPU backend keeps its weights dequantized (memory is not its point) unless a test asks.
  if (codes_fit && (device == Device::CUDA || choice == Fp8LinearChoice::Dequant)) return LinearMode::Fp8Dequant;
  return LinearMode::Fp8;
}

// A linear that keeps its e4m3 codes (holds_fp8_codes): its codes into rows [row0, row0 + rows) of L's codes
// (allocated by the first part), its row scales into that column range of the kb-major host staging,
// uploaded with the last part.
struct Fp8CodesStaging {
  std::vector<float> scales;  // [KB, out] kb-major
  int parts_left = 0;
};

void place_fp8_code_rows(const Ctx& ctx, LinearWeight& L, Fp8CodesStaging& st, const uint8_t* codes,
                         const float* row_scales, int64_t row0, int64_t rows, int64_t out, int64_t cols) {
  const int64_t KB = fp8::blocks(cols, fp8::kBlock);
  if (L.fp8_codes.t().empty()) {
    L.fp8_codes = Buffer(ctx.device, DType::F8E4M3, {out, cols});
    L.fp8_scales = Buffer(ctx.device, DType::F32, {KB, out});
    st.scales.assign(static_cast<size_t>(KB * out), 0.f);
  }
  copy_tensor(ctx, L.fp8_codes.t().slice_rows(row0, row0 + rows),
              Tensor(const_cast<uint8_t*>(codes), DType::F8E4M3, Device::CPU, {rows, cols}));
  synchronize(ctx);  // codes is host staging, reused by the next tensor
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t kb = 0; kb < KB; ++kb) st.scales[static_cast<size_t>(kb * out + row0 + r)] = row_scales[r * KB + kb];
  if (--st.parts_left == 0) {
    copy_tensor(ctx, L.fp8_scales, Tensor(st.scales.data(), DType::F32, Device::CPU, {KB, out}));
    synchronize(ctx);
    std::vector<float>().swap(st.scales);
  }
}

}  // namespace

Fp8LinearChoice fp8_linear_choice() {
  const char* e = std::getenv("DFLASH_FP8_LINEAR");
  const std::string v = e ? e : "";
  if (v.empty() || v == "auto") return Fp8LinearChoice::Auto;
  if (v == "gemm") return Fp8LinearChoice::Gemm;
  if (v == "dequant") return Fp8LinearChoice::Dequant;
  if (v == "emulate") return Fp8LinearChoice::Emulate;
  DF_FAIL(BadOptions, "DFLASH_FP8_LINEAR='" << v << "' is not a way to run FP8 linears",
          "set it to auto, gemm, dequant or emulate, or unset it (docs/fp8.md \"How a target's FP8 linears run\")");
}

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

LinearModeCounts load_decoder_weights(Checkpoint& ckpt, const Qwen3Config& c, const TargetQuantization& quant,
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
  // An FP8 config over a checkpoint none of whose linears is stored FP8: a bf16 checkpoint with an FP8
  // release's config.json (a linear or two stored unconverted is a release's habit: plan_linear).
  int64_t stored_fp8 = 0, stored_float_unlisted = 0, linears = 0;
  const WeightSpec* first_float = nullptr;
  for (const WeightSpec& s : specs) {
    linears += s.linear != nullptr;
    stored_fp8 += s.linear && s.stored_fp8;
    stored_float_unlisted += s.linear && s.stored_float_unlisted;
    if (!first_float && s.stored_float_unlisted) first_float = &s;
  }
  DF_CHECK_HINT(quant.format == CheckpointFp8::None || stored_fp8 > 0, BadInput,
                "config.json in " << ckpt.dir() << " has an FP8 quantization_config, " << checkpoint_fp8_name(quant.format)
                                  << ", but none of the checkpoint's " << linears
                                  << " decoder linear tensors is stored F8_E4M3"
                                  << (first_float ? " (" + first_float->name + " is " +
                                                        dtype_name(ckpt.get(first_float->name).dtype) + ")"
                                                  : std::string()),
                "the config and the weights do not belong together: re-download the FP8 checkpoint, or drop "
                "quantization_config from a bf16 one");
  // How each FP8 linear runs (docs/fp8.md): decided once, for the device, and for a fused projection by
  // all its parts (their rows together). The linears that keep their codes (Fp8Gemm, Fp8Dequant) are
  // staged alike.
  std::map<const LinearWeight*, Fp8CodesStaging> staged;
  if (quant.precision == TargetPrecision::Fp8) {
    const Fp8LinearChoice choice = fp8_linear_choice();
    // The one FP8 GEMM this quantization runs as, and whether the device has it.
    const std::optional<ops::Fp8Scaling> scaling = fp8_gemm_scaling(quant);
    const bool has_gemm = scaling && (*scaling == ops::Fp8Scaling::Block128 ? ops::fp8_block_gemm_available(ctx)
                                                                            : ops::fp8_token_gemm_available(ctx));
    DF_CHECK_HINT(choice != Fp8LinearChoice::Gemm || has_gemm, BadOptions,
                  "DFLASH_FP8_LINEAR=gemm, but " << device_name(ctx.device) << " has no FP8 GEMM for this quantization ("
                                                 << (!scaling ? "per-token activations over block-scaled weights: none"
                                                     : *scaling == ops::Fp8Scaling::Block128
                                                         ? "block-scaled: cuBLASLt's VEC128_32F, sm_90 only; "
                                                           "DFLASH_FP8_BLOCK_GEMM=mma: sm_89 and later"
                                                         : "per token x per channel: cuBLASLt's OUTER_VEC_32F")
                                                 << ")",
                  "unset DFLASH_FP8_LINEAR (or set dequant): this GPU runs FP8 linears as dequantize + bf16 GEMM");
    struct Fits {
      bool gemm = true, codes = true;
    };
    std::map<const LinearWeight*, Fits> fits;
    for (const WeightSpec& s : specs) {
      if (!s.linear) continue;
      const int64_t out = s.fused_rows > 0 ? s.fused_rows : s.how == LoadAs::SplitQueryGate ? s.ckpt_shape[0] / 2
                                                                                            : s.ckpt_shape[0];
      Fits& f = fits[s.linear];
      f.gemm = f.gemm && has_gemm && fp8_gemm_fits(quant, s) && out % 16 == 0;
      f.codes = f.codes && fp8_codes_fit(quant, s);
    }
    for (WeightSpec& s : specs) {
      if (!s.linear || !s.runs_fp8) continue;
      const Fits& f = fits[s.linear];
      s.mode = fp8_mode(choice, ctx.device, f.gemm, f.codes);
      if (holds_fp8_codes(s.mode)) ++staged[s.linear].parts_left;
    }
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
  std::vector<uint8_t> codes, split_codes;
  std::vector<float> row_scales, split_scales;
  LinearModeCounts counts;
  counts.stored_fp8 = stored_fp8;
  counts.stored_float_unlisted = stored_float_unlisted;
  for (WeightSpec& s : specs) {
    const DType dt = s.keep_f32 ? DType::F32 : dtype;
    for (LinearWeight* L : {s.linear, s.linear2}) {
      if (!L || !s.runs_fp8) continue;
      L->mode = s.mode;
      L->act_group = quant.activation_group();
      if (s.mode == LinearMode::Fp8Gemm) L->gemm_scaling = *fp8_gemm_scaling(quant);
    }
    const bool codes_on_device = holds_fp8_codes(s.mode);
    if (codes_on_device) {
      const int64_t rows = s.ckpt_shape[0], cols = s.ckpt_shape[1], KB = fp8::blocks(cols, fp8::kBlock);
      codes.resize(static_cast<size_t>(rows * cols));
      row_scales.resize(static_cast<size_t>(rows * KB));
      load_linear_fp8(ckpt, quant, s, codes.data(), row_scales.data());
      if (s.how == LoadAs::SplitQueryGate) {
        split_codes.resize(codes.size());
        split_scales.resize(row_scales.size());
        split_query_gate(codes.data(), s.heads, s.head_dim, cols, split_codes.data());
        split_query_gate(row_scales.data(), s.heads, s.head_dim, KB, split_scales.data());
        const int64_t half = rows / 2;
        for (int part = 0; part < 2; ++part) {
          LinearWeight& L = part == 0 ? *s.linear : *s.linear2;
          Fp8CodesStaging& st = staged[&L];
          if (st.parts_left == 0) st.parts_left = 1;  // the gate half: not a spec of its own
          place_fp8_code_rows(ctx, L, st, split_codes.data() + part * half * cols,
                              split_scales.data() + part * half * KB, 0, half, half, cols);
        }
      } else {
        DF_ASSERT(s.how == LoadAs::Plain);
        place_fp8_code_rows(ctx, *s.linear, staged[s.linear], codes.data(), row_scales.data(), s.row0, rows,
                            s.fused_rows > 0 ? s.fused_rows : rows, cols);
      }
    } else if (s.fused_rows == 0) {
      *s.dst = make_weight(ctx, dt, s.buf_shape);
    } else if (s.dst->t().empty()) {
      *s.dst = make_weight(ctx, dt, {s.fused_rows, s.buf_shape[1]});
    }
    const Tensor dst = codes_on_device      ? Tensor()
                       : s.fused_rows == 0 ? s.dst->t()
                                           : s.dst->t().slice_rows(s.row0, s.row0 + s.buf_shape[0]);
    if (codes_on_device) {
      // placed above
    } else if (direct(s)) {
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
          *s.dst2 = make_weight(ctx, dt, s.buf_shape);
          const size_t head_rows = static_cast<size_t>(s.head_dim) * s.ckpt_shape[1];
          std::vector<float> split(2 * s.heads * head_rows);
          split_query_gate(staging.data(), s.heads, s.head_dim, s.ckpt_shape[1], split.data());
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
    if (holds_fp8_codes(L->gate_up_proj.mode)) continue;  // no values buffer to view
    L->gate_proj = L->gate_up_proj.t().slice_rows(0, I);
    L->up_proj = L->gate_up_proj.t().slice_rows(I, 2 * I);
  }
  // Each linear counted once (a fused projection's parts share one; a split q_proj is two).
  std::map<const LinearWeight*, LinearMode> modes;
  for (const WeightSpec& s : specs)
    for (const LinearWeight* L : {s.linear, s.linear2})
      if (L) modes[L] = L->mode;
  for (const auto& [L, mode] : modes) {
    switch (mode) {
      case LinearMode::Plain: ++counts.plain; break;
      case LinearMode::Fp8: ++counts.fp8_emulated; break;
      case LinearMode::Fp8Gemm: ++counts.fp8_gemm; break;
      case LinearMode::Fp8Dequant:
        ++counts.fp8_dequant;
        counts.fp8_dequant_largest = std::max(counts.fp8_dequant_largest, static_cast<int64_t>(L->fp8_codes.numel()));
        break;
    }
  }
  return counts;
}

}  // namespace dflash
