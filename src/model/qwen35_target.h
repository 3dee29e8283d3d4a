// The frozen Qwen3.5 / Qwen3.6 hybrid target (CPU float32 and CUDA bf16 backends), a decoder stack
// (model/decoder_stack.h) whose token mixer is a Gated DeltaNet or a gated full attention by layer. Built
// through make_target_model (include/dflash/target.h); the forward is in qwen35_target.cpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dflash/target.h"
#include "model/qwen35_config.h"

namespace dflash {

// cfg: the checkpoint's parsed config (*load_target_config(dir).qwen35). Loads the safetensors from dir,
// every tensor checked before any compute; onto ctx's device (bf16 on CUDA). Its forward runs each packed
// sequence from a zero conv/recurrent state, attending only to itself.
// quant: how its linears are stored and run (load_target_config(dir).quant, docs/fp8.md).
std::unique_ptr<TargetModel> make_qwen35_target(const Qwen35Config& cfg, const TargetQuantization& quant,
                                                const std::string& dir, const Ctx& ctx, std::vector<int> capture_layers,
                                                int64_t max_tokens);

}  // namespace dflash
