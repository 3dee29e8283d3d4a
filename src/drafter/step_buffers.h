// The drafter training step's activation and scratch buffers, as one list: the CUDA step
// (src/drafter/cuda/drafter_step.cu) allocates each of them once from it, and the dry run
// (src/runtime/dry_run_plan.cpp) sums the ones that grow with --max-anchors. Stated once, so the memory the
// plan reports and the memory the step takes cannot drift apart. Not in the list: the parameters, their
// gradients and AdamW state (sized by the parameter layout) and the loss's logits workspace
// (ops::lm_loss_workspace_floats); the dry run counts those itself. Inline: the CUDA library and dflash_core
// both use it, and the only library they share is the base one, a floor below the drafter's configs.
#pragma once
#include <algorithm>
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

// ---- definitions ---------------------------------------------------------------------------------------
inline int64_t StepBuffer::elements(int64_t max_tokens, int64_t max_anchors, int64_t block_size) const {
  int64_t r = max_tokens;
  if (rows == StepRows::BlockRows) r = max_anchors * block_size;
  if (rows == StepRows::LossRows) r = max_anchors * (block_size - 1);
  if (rows == StepRows::Anchors) r = max_anchors;
  const int64_t floor = elem == StepElem::Act ? 8 : elem == StepElem::U8 ? 16 : 4;
  return std::max<int64_t>(r * cols, floor);
}

inline std::vector<StepBuffer> drafter_step_buffers(const DrafterConfig& c) {
  const Qwen3Config& L = c.layers;
  const int64_t H = L.hidden_size, I = L.intermediate_size, nh = L.num_attention_heads,
                nkv = L.num_key_value_heads, QD = nh * L.head_dim, KV = nkv * L.head_dim,
                K = static_cast<int64_t>(c.target_layer_ids.size());
  const bool d2 = c.arch == DraftArch::DFlash2;
  const int64_t D2 = d2 ? 2 * static_cast<int64_t>(c.d2.conv_kernel_size) * (H / c.d2.conv_group_size) : 0,
                SK = c.d2.selector_top_k, SR = c.d2.selector_rank;
  using R = StepRows;
  using E = StepElem;
  const R T = R::Tokens, NB = R::BlockRows, LR = R::LossRows;
  std::vector<StepBuffer> b = {
      // the context side: the captured features, fc's output and its norm; positions and block bookkeeping
      {"x_ctx", T, K * H, E::Act}, {"fc_out", T, H, E::Act}, {"th", T, H, E::Act}, {"rstd_h", T, 1, E::F32},
      {"pos_ctx", T, 1, E::I32}, {"block_ids", NB, 1, E::I32}, {"pos_blk", NB, 1, E::I32},
      {"anchors", R::Anchors, 1, E::I32}, {"seq_begin", R::Anchors, 1, E::I32}, {"x0", NB, H, E::Act},
      // each decoder layer's saved activations: its context keys/values, the block's attention and MLP
      {"layer.kc_raw", T, KV, E::Act}, {"layer.kc", T, KV, E::Act}, {"layer.kc_rstd", T, nkv, E::F32},
      {"layer.vc", T, KV, E::Act}, {"layer.x_in", NB, H, E::Act}, {"layer.xn", NB, H, E::Act},
      {"layer.rstd1", NB, 1, E::F32}, {"layer.q_raw", NB, QD, E::Act}, {"layer.q", NB, QD, E::Act},
      {"layer.q_rstd", NB, nh, E::F32}, {"layer.kb_raw", NB, KV, E::Act}, {"layer.kb", NB, KV, E::Act},
      {"layer.kb_rstd", NB, nkv, E::F32}, {"layer.vb", NB, KV, E::Act}, {"layer.attn", NB, QD, E::Act},
      {"layer.lse", NB, nh, E::F32}, {"layer.x2", NB, H, E::Act}, {"layer.xn2", NB, H, E::Act},
      {"layer.rstd2", NB, 1, E::F32}, {"layer.g", NB, I, E::Act}, {"layer.u", NB, I, E::Act},
      {"layer.act", NB, I, E::Act}};
  if (d2)  // DFlash2's convs around each sublayer: their dynamic kernels, inputs and outputs
    b.insert(b.end(), {{"layer.dyn_attn", NB, D2, E::Act}, {"layer.x_attn", NB, H, E::Act}, {"layer.o", NB, H, E::Act},
                       {"layer.dyn_mlp", NB, D2, E::Act}, {"layer.x_mlp", NB, H, E::Act}, {"layer.f", NB, H, E::Act}});
  b.insert(b.end(), {
      // the stack's output; the loss rows (the hidden and teacher rows, their gradient, labels and results)
      {"x_last", NB, H, E::Act}, {"h_final", NB, H, E::Act}, {"rstd_f", NB, 1, E::F32},
      {"h_rows", LR, H, E::Act}, {"t_rows", LR, H, E::Act}, {"dh_rows", LR, H, E::Act},
      {"row_idx", LR, 1, E::I32}, {"teacher_idx", LR, 1, E::I32}, {"labels", LR, 1, E::I32},
      {"row_w", LR, 1, E::F32}, {"loss_r", LR, 1, E::F32}, {"kl_r", LR, 1, E::F32}, {"am_q", LR, 1, E::I32},
      {"am_p", LR, 1, E::I32},
      // the backward's scratch, shared by the layers
      {"dx", NB, H, E::Act}, {"dtmp", NB, H, E::Act}, {"dxn", NB, H, E::Act}, {"d_act", NB, I, E::Act},
      {"dg", NB, I, E::Act}, {"du", NB, I, E::Act}, {"d_attn", NB, QD, E::Act}, {"dq", NB, QD, E::Act},
      {"dq_raw", NB, QD, E::Act}, {"dkb", NB, KV, E::Act}, {"dvb", NB, KV, E::Act}, {"dkb_raw", NB, KV, E::Act},
      {"dkc", T, KV, E::Act}, {"dvc", T, KV, E::Act}, {"dkc_raw", T, KV, E::Act}, {"d_th", T, H, E::Act},
      {"d_fc", T, H, E::Act}, {"d_out", NB, H, E::Act}});
  if (d2)  // the convs' backward scratch; the selector's candidates, scores and gradients
    b.insert(b.end(), {{"d_dyn", NB, D2, E::Act}, {"d_conv", NB, H, E::Act}, {"topk_ids", LR, SK, E::I32},
                       {"topk_vals", LR, SK, E::F32}, {"label_logit", LR, 1, E::F32}, {"cand", LR, SK, E::I32},
                       {"unary", LR, SK, E::F32}, {"gold", LR, 1, E::I32}, {"covered", LR, 1, E::U8},
                       {"pred", LR, 1, E::I32}, {"u", LR, SR, E::F32}, {"sel_du", LR, SR, E::F32},
                       {"du_bf", LR, SR, E::Act}, {"scores", LR, SK, E::F32}, {"d_unary", LR, SK, E::F32},
                       {"sel_ce", LR, 1, E::F32}, {"sel_slot", LR, 1, E::I32}, {"sel_w", LR, 1, E::F32},
                       {"dh_sel", LR, H, E::Act}});
  return b;
}

inline double drafter_step_bytes_per_anchor(const DrafterConfig& c, int act_bytes) {
  const double B = c.block_size;
  double bytes = 0;
  for (const StepBuffer& s : drafter_step_buffers(c)) {
    if (s.rows == StepRows::Tokens) continue;
    const double rows = s.rows == StepRows::BlockRows ? B : s.rows == StepRows::LossRows ? B - 1 : 1;
    const double elem = s.elem == StepElem::Act ? act_bytes : s.elem == StepElem::U8 ? 1 : 4;
    bytes += rows * static_cast<double>(s.cols) * elem * (s.per_layer() ? c.layers.num_hidden_layers : 1);
  }
  return bytes;
}

}  // namespace dflash::train
