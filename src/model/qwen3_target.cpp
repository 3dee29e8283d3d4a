// The frozen dense Qwen3 target forward (Qwen3Target) over a packed batch, written only in ops.h calls over
// Buffers so the same code runs on the CPU (float32) and CUDA (bf16) backends.
//
// Per decoder layer l, with the layer input `in` and its output buffer `dst` (a different buffer):
//   x   = input_layernorm(in)
//   qkv = x [Wq; Wk; Wv]^T;  q,k = rope(head_rmsnorm(q,k)), v copied    (one GEMM, one pass: qkv_norm_rope)
//   dst = in + attention(q, k, v) Wo^T;  x = post_attention_layernorm(dst)   (the add in o_proj's epilogue)
//   gu  = x [Wg; Wu]^T;  dst += (silu(gu[:, :I]) * gu[:, I:]) Wd^T      (one GEMM; accumulating matmul)
// A captured layer's `dst` is its slot in CaptureOut.features, so captures cost no copy; other layers
// alternate between two stream buffers (a layer listed twice is copied into its second slot). All
// activations are allocated once for max_tokens.
#include "model/qwen3_target.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/ops.h"
#include "dflash/safetensors.h"
#include "model/capture_stack.h"
#include "model/qwen3_weights.h"
#include "model/scratch_plan.h"

namespace dflash {

namespace {
// The first T rows of an activation buffer (or a view of one) allocated for max_tokens.
Tensor rows(const Tensor& b, int64_t T) { return b.slice_rows(0, T); }
}  // namespace

struct Qwen3Target::Impl {
  Ctx ctx;
  Qwen3Config cfg;
  std::vector<int> capture_layers;
  CapturePlan captures;
  DType act = DType::F32;
  Qwen3Weights w;

  // Activations [max_tokens, ...], reused layer to layer.
  Buffer stream[2];      // [T, H] residual stream of layers that are not captured
  Buffer x_norm;         // [T, H]
  // One allocation for the two halves of a layer, which are never live at once (model/scratch_plan.h):
  // the attention half's views (dead once o_proj has read attn) share its bytes with the MLP half's. Sized
  // for the larger half (3I values per token for the MLP, 2 (nh + 2nkv) hd + nh hd for the attention), the
  // fused projections' extra outputs (qkv beside q/k/v, mlp_act beside gate_up) cost little: on the 8B
  // shape 36864 values per token against 34816 for separate q, k, v, attn, gate, up buffers.
  Buffer work;
  Tensor qkv;            // [T, (nh + 2nkv) hd] the fused q|k|v GEMM's output      (attention half)
  Tensor q, k, v;        // [T, nh*hd], [T, nkv*hd], [T, nkv*hd] its normed/rotated/copied heads
  Tensor attn;           // [T, nh*hd]
  Tensor gate_up;        // [T, 2I] the fused gate|up GEMM's output                   (MLP half)
  Tensor mlp_act;        // [T, I] silu(gate) * up
  DeviceBatch inputs;    // tokens, positions, cu_seqlens

  void layer_forward(const Qwen3LayerWeights& L, const Tensor& in, const Tensor& dst, int64_t T, const Tensor& cu);
};

Qwen3Target::Qwen3Target(const Qwen3Config& cfg, const std::string& dir, const Ctx& ctx,
                         std::vector<int> capture_layers, int64_t max_tokens)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.ctx = ctx;
  m.act = compute_dtype(ctx.device);
  m.cfg = cfg;
  check_qwen3_target_config(m.cfg, dir + "/config.json");
  const Qwen3Config& c = m.cfg;
  const int L = c.num_hidden_layers;

  DF_CHECK(max_tokens > 0, BadOptions, "the target needs max_tokens > 0, got " << max_tokens);
  m.captures = plan_captures(capture_layers, L, dir);
  m.capture_layers = std::move(capture_layers);

  Checkpoint ckpt(dir);
  m.w = load_qwen3_weights(ckpt, c, ctx, m.act);

  const int64_t T = max_tokens, H = c.hidden_size, I = c.intermediate_size;
  const int64_t q_dim = int64_t(c.num_attention_heads) * c.head_dim;
  const int64_t kv_dim = int64_t(c.num_key_value_heads) * c.head_dim;
  const Device d = ctx.device;
  for (Buffer& s : m.stream) s = Buffer(d, m.act, {T, H});
  m.x_norm = Buffer(d, m.act, {T, H});
  ScratchPlan plan(T);
  const int r_qkv = plan.reserve(m.act, q_dim + 2 * kv_dim), r_q = plan.reserve(m.act, q_dim),
            r_k = plan.reserve(m.act, kv_dim), r_v = plan.reserve(m.act, kv_dim), r_attn = plan.reserve(m.act, q_dim);
  plan.new_phase();
  const int r_gate_up = plan.reserve(m.act, 2 * I), r_mlp_act = plan.reserve(m.act, I);
  m.work = Buffer(d, DType::U8, {static_cast<int64_t>(plan.bytes())});
  m.qkv = plan.view(m.work, r_qkv);
  m.q = plan.view(m.work, r_q);
  m.k = plan.view(m.work, r_k);
  m.v = plan.view(m.work, r_v);
  m.attn = plan.view(m.work, r_attn);
  m.gate_up = plan.view(m.work, r_gate_up);
  m.mlp_act = plan.view(m.work, r_mlp_act);
  m.inputs = DeviceBatch(d, T);
}

Qwen3Target::~Qwen3Target() = default;

const Qwen3Config& Qwen3Target::config() const { return impl_->cfg; }
const std::vector<int>& Qwen3Target::capture_layers() const { return impl_->capture_layers; }
DType Qwen3Target::activation_dtype() const { return impl_->act; }
Tensor Qwen3Target::embed_tokens() const { return impl_->w.embed_tokens.t(); }
Tensor Qwen3Target::lm_head() const { return impl_->w.lm_head_table(); }

void Qwen3Target::Impl::layer_forward(const Qwen3LayerWeights& L, const Tensor& in, const Tensor& dst, int64_t T,
                                      const Tensor& cu) {
  const Qwen3Config& c = cfg;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const float eps = c.rms_norm_eps;
  const ops::RopeSpec rope{c.rope_theta, static_cast<int>(hd)};
  const Tensor x = rows(x_norm, T), qt = rows(q, T), kt = rows(k, T), vt = rows(v, T), at = rows(attn, T);
  const Tensor positions = rows(inputs.pos, T);

  ops::rmsnorm_forward(ctx, x, Tensor(), in, L.input_layernorm, eps);
  const Tensor qkvt = rows(qkv, T);
  ops::matmul_forward(ctx, qkvt, x, L.qkv_proj);
  const Tensor q3 = qt.reshape({T, nh, hd}), k3 = kt.reshape({T, nkv, hd});
  ops::qkv_norm_rope_forward(ctx, q3, k3, vt.reshape({T, nkv, hd}), qkvt, L.q_norm, L.k_norm, positions, rope, eps);
  ops::attention_varlen_causal_forward(ctx, at.reshape({T, nh, hd}), q3, k3, vt.reshape({T, nkv, hd}), cu,
                                       1.0f / std::sqrt(static_cast<float>(hd)));
  ops::matmul_residual_forward(ctx, dst, at, L.o_proj, in);
  ops::rmsnorm_forward(ctx, x, Tensor(), dst, L.post_attention_layernorm, eps);

  const Tensor gu = rows(gate_up, T), a = rows(mlp_act, T);
  ops::matmul_forward(ctx, gu, x, L.gate_up_proj);
  ops::swiglu_fused_forward(ctx, a, gu);
  ops::matmul_forward(ctx, dst, a, L.down_proj, ops::Accumulate::Yes);
}

void Qwen3Target::forward(const PackedBatch& batch, const CaptureOut& out) {
  Impl& m = *impl_;
  const Qwen3Config& c = m.cfg;
  const int64_t T = batch.num_tokens(), H = c.hidden_size;
  const int64_t k = static_cast<int64_t>(m.capture_layers.size());

  const Tensor cu = m.inputs.upload(m.ctx, batch, c.vocab_size);
  check_capture_out(out, k, T, H, m.act, m.ctx.device);

  ops::embedding_forward(m.ctx, rows(m.stream[0], T), rows(m.inputs.tokens, T), m.w.embed_tokens);
  capture_stack_forward(m.ctx, m.captures, m.stream, T, H, out, m.w.norm, c.rms_norm_eps,
                        [&](int l, const Tensor& in, const Tensor& dst) {
                          m.layer_forward(m.w.layers[l], in, dst, T, cu);
                        });
}

void Qwen3Target::lm_head_forward(const Tensor& logits, const Tensor& final_norm) {
  ops::matmul_forward(impl_->ctx, logits, final_norm, impl_->w.lm_head_table());
}

}  // namespace dflash
