// An FP8 copy of a bf16 target checkpoint (include/dflash/fp8_convert.h, docs/fp8.md).
#include "dflash/fp8_convert.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/error.h"
#include "dflash/fp8.h"
#include "dflash/hf_config.h"
#include "dflash/safetensors.h"

namespace dflash {
namespace fs = std::filesystem;

namespace {

nlohmann::json quantization_config(bool block, const std::vector<std::string>& ignore) {
  if (block)
    return {{"quant_method", "fp8"},
            {"fmt", "e4m3"},
            {"activation_scheme", "dynamic"},
            {"weight_block_size", {fp8::kBlock, fp8::kBlock}},
            {"modules_to_not_convert", ignore}};
  std::vector<std::string> ct_ignore = {"lm_head"};
  ct_ignore.insert(ct_ignore.end(), ignore.begin(), ignore.end());
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}, {"symmetric", true}, {"dynamic", false}}},
              {"input_activations",
               {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"symmetric", true}, {"dynamic", true}}}}}}},
          {"ignore", ct_ignore}};
}

// A decoder layer's nn.Linear weight: every 2-D "<module>.weight" under ".layers." (q/k/v/o_proj, the MLP's
// projections, the Gated DeltaNet's in_proj_qkv/in_proj_z/in_proj_a/in_proj_b/out_proj). Norms, A_log and
// dt_bias are 1-D, the Gated DeltaNet's conv1d is 3-D: transformers' replace_with_fp8_linear converts
// exactly the nn.Linear modules, and which of those stay bf16 is the written config's list (stores_fp8),
// so the copy stores what its config.json says.
bool is_layer_linear(const std::string& name, const TensorInfo& t) {
  const std::string suffix = ".weight";
  return t.shape.size() == 2 && name.find(".layers.") != std::string::npos && name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One quantized weight: codes and its scale tensor, kept alive until its shard is written.
struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scale;
  std::vector<int64_t> scale_shape;
};

Quantized quantize(const std::vector<float>& w, int64_t rows, int64_t cols, bool block) {
  Quantized q;
  q.codes.resize(w.size());
  if (block) {
    q.scale_shape = {fp8::blocks(rows, fp8::kBlock), fp8::blocks(cols, fp8::kBlock)};
    q.scale.resize(static_cast<size_t>(q.scale_shape[0] * q.scale_shape[1]));
    fp8::quantize_weight_blocks(w.data(), rows, cols, q.codes.data(), q.scale.data());
    return q;
  }
  q.scale_shape = {rows, 1};
  q.scale.resize(static_cast<size_t>(rows));
  fp8::quantize_weight_channels(w.data(), rows, cols, q.codes.data(), q.scale.data());  // llm-compressor's rule
  return q;
}

}  // namespace

Fp8ConvertResult write_fp8_checkpoint(const std::string& src, const std::string& dst, Fp8ConvertFormat format,
                                      const std::vector<std::string>& ignore) {
  const bool block = format == Fp8ConvertFormat::Block;
  DF_CHECK_HINT(!fs::exists(dst), BadOptions, dst << " exists", "name a new directory");
  fs::create_directories(dst);

  nlohmann::json config = read_config_json(src + "/config.json");
  DF_CHECK_HINT(!config.contains("quantization_config"), BadInput, src << "/config.json is already quantized",
                "convert the bf16 checkpoint");
  config["quantization_config"] = quantization_config(block, ignore);
  const TargetQuantization tq = parse_target_quantization(config, dst + "/config.json");  // the loader's reading of it

  Checkpoint ckpt(src);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int converted = 0;
  for (const std::string& shard : ckpt.shard_files()) {
    std::vector<TensorToWrite> out;
    std::vector<Quantized> kept;
    std::vector<std::string> scale_names;
    const std::vector<std::string> names = ckpt.names_in_shard(shard);
    kept.reserve(names.size());
    scale_names.reserve(names.size());
    for (const std::string& name : names) {
      const TensorInfo& t = ckpt.get(name);
      const std::string module = name.substr(0, name.size() - std::string(".weight").size());
      if (is_layer_linear(name, t) && tq.stores_fp8(module)) {
        std::vector<float> w(t.numel());
        ckpt.load_f32(name, t.shape, w.data());
        kept.push_back(quantize(w, t.shape[0], t.shape[1], block));
        scale_names.push_back(module + "." + tq.scale_suffix);
        out.push_back(TensorToWrite{name, DType::F8E4M3, t.shape, nullptr, kept.back().codes.data()});
        out.push_back(TensorToWrite{scale_names.back(), DType::F32, kept.back().scale_shape, kept.back().scale.data(), nullptr});
        weight_map[scale_names.back()] = shard;
        ++converted;
      } else {
        out.push_back(TensorToWrite{name, t.dtype, t.shape, nullptr, t.data});
      }
      weight_map[name] = shard;
    }
    write_safetensors(dst + "/" + shard, out, {{"format", "pt"}});
    ckpt.release_shard(shard);
  }
  if (fs::exists(src + "/model.safetensors.index.json")) {
    nlohmann::ordered_json index;
    index["metadata"] = nlohmann::ordered_json::object();
    index["weight_map"] = weight_map;
    write_file_atomic(dst + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  write_file_atomic(dst + "/config.json", config.dump(2) + "\n");
  for (const fs::directory_entry& e : fs::directory_iterator(src)) {  // tokenizer, generation config, ...
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && n != "config.json" && n != "model.safetensors.index.json" &&
        e.path().extension() != ".safetensors")
      fs::copy_file(e.path(), dst + "/" + n);
  }
  return Fp8ConvertResult{tq, converted};
}

}  // namespace dflash
