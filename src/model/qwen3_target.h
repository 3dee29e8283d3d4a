// The frozen dense Qwen3 target (CPU float32 and CUDA bf16 backends), a decoder stack
// (model/decoder_stack.h) with attention in every layer. Built through make_target_model
// (include/dflash/target.h); the forward is in qwen3_target.cpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dflash/target.h"

namespace dflash {

// cfg: the checkpoint's parsed config (load_target_config(dir).text). Loads the safetensors from dir,
// every tensor checked for presence and shape before any compute; quant: how its linears are stored and
// run (load_target_config(dir).quant, docs/fp8.md).
std::unique_ptr<TargetModel> make_qwen3_target(const Qwen3Config& cfg, const TargetQuantization& quant,
                                               const std::string& dir, const Ctx& ctx, std::vector<int> capture_layers,
                                               int64_t max_tokens);

}  // namespace dflash
