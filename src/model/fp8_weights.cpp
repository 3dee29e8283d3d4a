#include "model/fp8_weights.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dflash/error.h"
#include "dflash/fp8.h"

namespace dflash {
namespace {

std::string module_of(const std::string& weight_name) {
  const std::string suffix = ".weight";
  return weight_name.size() > suffix.size() && weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0
             ? weight_name.substr(0, weight_name.size() - suffix.size())
             : weight_name;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The shapes a scale tensor of a [rows, cols] weight may have in format q.
bool scale_shape_ok(const TargetQuantization& q, const std::vector<int64_t>& shape, int64_t rows, int64_t cols) {
  if (q.scales == WeightScales::Channels)
    return shape == std::vector<int64_t>{rows, 1} || shape == std::vector<int64_t>{rows};
  return shape == std::vector<int64_t>{fp8::blocks(rows, q.block_rows), fp8::blocks(cols, q.block_cols)};
}

}  // namespace

void plan_linear(Checkpoint& ckpt, const TargetQuantization& q, WeightSpec& s, const char* mismatch_hint) {
  const TensorInfo& t = ckpt.get(s.name);
  const std::string module = module_of(s.name);
  s.stored_fp8 = t.dtype == DType::F8E4M3;
  if (!s.stored_fp8) {
    ckpt.expect_float(s.name, s.ckpt_shape, mismatch_hint);
    // Stored in a float dtype though the config's list does not name it: FP8 releases leave small linears
    // unconverted without listing them (the Qwen3.5/3.6 hybrids' in_proj_a / in_proj_b, MoE routers;
    // docs/fp8.md "Which modules stay bf16"), and the engines load what is stored. It runs as stored;
    // load_decoder_weights refuses an FP8 config over a checkpoint with no FP8 linear at all.
    s.stored_float_unlisted = q.format != CheckpointFp8::None && q.stores_fp8(module);
    s.runs_fp8 = q.precision == TargetPrecision::Fp8 && q.format == CheckpointFp8::None && s.quantize_on_load;
    return;
  }
  DF_CHECK_HINT(t.shape == s.ckpt_shape, BadInput,
                "tensor " << s.name << " in " << ckpt.dir() << " has shape " << t.shape_str() << ", expected "
                          << shape_text(s.ckpt_shape) << " from config.json",
                mismatch_hint);
  DF_CHECK_HINT(q.format != CheckpointFp8::None, BadInput,
                "tensor " << s.name << " in " << ckpt.dir() << " is F8_E4M3, but config.json has no quantization_config",
                "use the config.json that came with these weights (an FP8 release's names its quant_method)");
  DF_CHECK_HINT(q.stores_fp8(module), BadInput,
                "tensor " << s.name << " in " << ckpt.dir() << " is F8_E4M3, but config.json's quantization_config "
                          << "lists " << module << " as not converted",
                "the config and the weights do not belong together: re-download the checkpoint");
  DF_CHECK_HINT(s.ckpt_shape.size() == 2, BadInput, "tensor " << s.name << " is F8_E4M3 but not a matrix", mismatch_hint);
  const std::string scale_name = module + "." + q.scale_suffix;
  DF_CHECK_HINT(ckpt.has(scale_name), BadInput,
                "tensor " << s.name << " in " << ckpt.dir() << " is F8_E4M3 but its scale " << scale_name << " is missing",
                "the checkpoint download is incomplete, or it is of another FP8 format than its config.json says");
  const TensorInfo& st = ckpt.get(scale_name);
  const int64_t rows = s.ckpt_shape[0], cols = s.ckpt_shape[1];
  DF_CHECK_HINT(scale_shape_ok(q, st.shape, rows, cols), BadInput,
                "scale " << scale_name << " in " << ckpt.dir() << " has shape " << st.shape_str() << "; a " << rows << "x"
                         << cols << " weight with "
                         << (q.scales == WeightScales::Channels
                                 ? "per-channel scales needs [" + std::to_string(rows) + ", 1]"
                                 : std::to_string(q.block_rows) + "x" + std::to_string(q.block_cols) + " blocks needs " +
                                       shape_text({fp8::blocks(rows, q.block_rows), fp8::blocks(cols, q.block_cols)})),
                "the checkpoint is of another FP8 format than its config.json says");
  DF_CHECK_HINT(st.dtype == DType::F32 || st.dtype == DType::BF16 || st.dtype == DType::F16, BadInput,
                "scale " << scale_name << " in " << ckpt.dir() << " has dtype " << dtype_name(st.dtype)
                         << "; FP8 scales are floating point",
                "re-download the checkpoint");
  s.runs_fp8 = q.precision == TargetPrecision::Fp8;
}

void load_linear_f32(Checkpoint& ckpt, const TargetQuantization& q, const WeightSpec& s, float* dst) {
  const int64_t rows = s.ckpt_shape[0], cols = s.ckpt_shape.size() == 2 ? s.ckpt_shape[1] : 1;
  if (!s.stored_fp8) {
    ckpt.load_f32(s.name, s.ckpt_shape, dst);
    if (s.runs_fp8) {
      std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
      if (q.on_load == OnLoadFp8::Dynamic) {
        std::vector<float> scale(static_cast<size_t>(rows));
        fp8::quantize_weight_channels(dst, rows, cols, codes.data(), scale.data());
        fp8::dequantize_weight_channels(codes.data(), scale.data(), rows, cols, dst);
      } else {
        std::vector<float> scale_inv(
            static_cast<size_t>(fp8::blocks(rows, fp8::kBlock) * fp8::blocks(cols, fp8::kBlock)));
        fp8::quantize_weight_blocks(dst, rows, cols, codes.data(), scale_inv.data());
        fp8::dequantize_weight_blocks(codes.data(), scale_inv.data(), rows, cols, fp8::kBlock, fp8::kBlock, dst);
      }
    }
    return;
  }
  const std::string scale_name = module_of(s.name) + "." + q.scale_suffix;
  std::vector<float> scale(ckpt.get(scale_name).numel());
  tensor_to_f32(ckpt.get(scale_name), scale.data(), ckpt.dir());
  const TensorInfo& t = ckpt.get(s.name);  // after the scale: get() may open another shard
  const uint8_t* codes = static_cast<const uint8_t*>(t.data);
  if (q.scales == WeightScales::Channels)
    fp8::dequantize_weight_channels(codes, scale.data(), rows, cols, dst);
  else
    fp8::dequantize_weight_blocks(codes, scale.data(), rows, cols, q.block_rows, q.block_cols, dst);
  size_t bad = 0;
  for (int64_t i = 0; i < rows * cols; ++i) bad += !std::isfinite(dst[i]);
  DF_CHECK_HINT(bad == 0, BadInput,
                "tensor " << s.name << " in " << ckpt.dir() << " dequantizes to " << bad
                          << " non-finite value(s) (NaN codes, or non-finite scales in " << scale_name << ")",
                "the checkpoint is damaged: re-download it");
}

bool fp8_codes_fit(const TargetQuantization& q, const WeightSpec& s) {
  return s.runs_fp8 && s.ckpt_shape.size() == 2 && q.scales_per_128_channels();
}

std::optional<ops::Fp8Scaling> fp8_gemm_scaling(const TargetQuantization& q) {
  if (q.activation_group() == fp8::kBlock) return ops::Fp8Scaling::Block128;
  if (q.token_channel()) return ops::Fp8Scaling::TokenChannel;
  return std::nullopt;
}

bool fp8_gemm_fits(const TargetQuantization& q, const WeightSpec& s) {
  const std::optional<ops::Fp8Scaling> scaling = fp8_gemm_scaling(q);
  if (!scaling || !fp8_codes_fit(q, s)) return false;
  return s.ckpt_shape[1] % (*scaling == ops::Fp8Scaling::Block128 ? fp8::kBlock : 16) == 0;
}

void load_linear_fp8(Checkpoint& ckpt, const TargetQuantization& q, const WeightSpec& s, uint8_t* codes,
                     float* row_scales) {
  DF_ASSERT(fp8_codes_fit(q, s));
  const int64_t rows = s.ckpt_shape[0], cols = s.ckpt_shape[1], KB = fp8::blocks(cols, fp8::kBlock);
  const size_t n = static_cast<size_t>(rows * cols);
  if (!s.stored_fp8) {  // --target-precision fp8 / fp8-dynamic: the codes load_linear_f32 quantizes into
    std::vector<float> w(n);
    ckpt.load_f32(s.name, s.ckpt_shape, w.data());
    if (q.on_load == OnLoadFp8::Dynamic) {
      std::vector<float> scale(static_cast<size_t>(rows));
      fp8::quantize_weight_channels(w.data(), rows, cols, codes, scale.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t kb = 0; kb < KB; ++kb) row_scales[r * KB + kb] = scale[static_cast<size_t>(r)];
      return;
    }
    const int64_t RB = fp8::blocks(rows, fp8::kBlock);
    std::vector<float> scale_inv(static_cast<size_t>(RB * KB));
    fp8::quantize_weight_blocks(w.data(), rows, cols, codes, scale_inv.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t kb = 0; kb < KB; ++kb) row_scales[r * KB + kb] = scale_inv[(r / fp8::kBlock) * KB + kb];
    return;
  }
  const std::string scale_name = module_of(s.name) + "." + q.scale_suffix;
  std::vector<float> scale(ckpt.get(scale_name).numel());
  tensor_to_f32(ckpt.get(scale_name), scale.data(), ckpt.dir());
  const TensorInfo& t = ckpt.get(s.name);  // after the scale: get() may open another shard
  std::memcpy(codes, t.data, n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t kb = 0; kb < KB; ++kb)
      row_scales[r * KB + kb] = q.scales == WeightScales::Channels
                                    ? scale[static_cast<size_t>(r)]
                                    : scale[static_cast<size_t>((r / q.block_rows) * KB + kb)];
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += (codes[i] & 0x7F) == 0x7F;  // e4m3fn's NaN
  for (int64_t i = 0; i < rows * KB; ++i) bad += !std::isfinite(row_scales[i]);
  DF_CHECK_HINT(bad == 0, BadInput,
                "tensor " << s.name << " in " << ckpt.dir() << " holds " << bad
                          << " NaN code(s) or non-finite scale(s) (" << scale_name << ")",
                "the checkpoint is damaged: re-download it");
}

}  // namespace dflash
