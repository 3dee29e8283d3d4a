// The drafter training step's activation and scratch buffers, as one list: the CUDA step
// (src/drafter/cuda/drafter_step.cu) allocates each of them once from it, and the dry run
// (src/runtime/dry_run_plan.cpp) sums the ones that grow with --max-anchors. Stated once, so the memory the
// plan reports and the memory the step takes cannot drift apart. Not in the list: the parameters, their
// gradients and AdamW state (sized by the parameter layout) and the loss's logits workspace
// (ops::lm_loss_workspace_floats); the dry run counts those itself.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dflash/hf_config.h"

namespace dflash::train {

// What a buffer's row count is: --token-budget's tokens T (the context side), the N * B block rows, the
// N * (B - 1) loss rows, or the N anchors (N = --max-anchors, B = the block size).
enum class StepRows : uint8_t { Tokens, BlockRows, LossRows, Anchors };
// Its element: the activations' dtype (bf16 on CUDA), or float32 / int32 / byte whatever the backend.
enum class StepElem : uint8_t { Act, F32, I32, U8 };

struct StepBuffer {
  std::string name;  // the step's member: "x_ctx"; a decoder layer's own are "layer.q" (one per layer)
  StepRows rows = StepRows::Tokens;
  int64_t cols = 1;  // elements per row
  StepElem elem = StepElem::Act;
  bool per_layer() const { return name.rfind("layer.", 0) == 0; }
  // Elements allocated for max_tokens / max_anchors (a floor of a few elements: 16-byte vectors, and a
  // byte mask the selector reads 16 at a time).
  int64_t elements(int64_t max_tokens, int64_t max_anchors, int64_t block_size) const;
};

// Every buffer of the step for drafter c, in allocation order (DFlash2's only when c is one).
std::vector<StepBuffer> drafter_step_buffers(const DrafterConfig& c);

// Bytes per anchor of the buffers that grow with --max-anchors (the block rows, the loss rows, the anchors;
// a decoder layer's once per layer), with act_bytes per activation element (2: bf16 on CUDA; 4: the CPU
// net's float32, about the same tensors). The context side (per token) is not in it.
double drafter_step_bytes_per_anchor(const DrafterConfig& c, int act_bytes);

}  // namespace dflash::train
