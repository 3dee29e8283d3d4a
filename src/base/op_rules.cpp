// Shape rules of the drafter's ops (include/dflash/drafter_ops.h) that the CPU reference and the CUDA
// library both apply: here, in the base library both link, so each is stated once.
#include <cmath>

#include "dflash/drafter_ops.h"

namespace dflash::ops {

BlockAttnSpec drafter_attn_spec(const DrafterConfig& c, size_t layer) {
  BlockAttnSpec s;
  s.block_size = c.block_size;
  s.scale = 1.0f / std::sqrt(static_cast<float>(c.layers.head_dim));
  const auto& types = c.layers.layer_types;
  if (layer < types.size() && types[layer] == "sliding_attention") {
    s.window = c.layers.sliding_window;
    s.full_block = c.is_causal == 0;  // config.json's is_causal: false (docs/dflash2.md 2.6)
  }
  return s;
}

size_t lm_loss_workspace_floats(int64_t chunk_rows, int64_t vocab, bool with_teacher) {
  return static_cast<size_t>(chunk_rows) * static_cast<size_t>(vocab) * (with_teacher ? 2u : 1u);
}

}  // namespace dflash::ops
