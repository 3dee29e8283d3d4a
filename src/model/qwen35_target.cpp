// The Qwen3.5 / Qwen3.6 hybrid target forward over a packed batch (HF Qwen3_5ForCausalLM / the text
// model of Qwen3_5ForConditionalGeneration), written only in op calls over Buffers, so the same code runs on
// the CPU (float32) and CUDA (bf16 activations; the delta rule's gates and state in float32) backends.
//
// Per decoder layer l, with input `in` and output buffer `dst` (a different buffer):
//   x = input_layernorm(in)                                  (norm weights stored as 1 + w)
//   linear_attention (Gated DeltaNet):
//     qkv = silu(causal_conv1d(x Wqkv^T));  z = x Wz^T;  g, beta = gates(x Wa^T, x Wb^T)
//     core = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta);  dst = in + gated_rmsnorm(core, z) Wout^T
//   full_attention (gated):
//     q, gate = x Wq^T, x Wgate^T;  k, v = x Wk^T, x Wv^T;  q, k = partial_rope(head_rmsnorm(q, k))
//     dst = in + (attention(q, k, v) * sigmoid(gate)) Wo^T
//   (the residual add in the output projection's epilogue);  x = post_attention_layernorm(dst);
//   gu = x [Wg; Wu]^T  (one GEMM)
//   dst += (silu(gu[:, :I]) * gu[:, I:]) Wd^T
// Captured layers write straight into their CaptureOut slot; the others alternate between two buffers.
// All activations are allocated once for max_tokens.
#include "model/qwen35_target.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/ops.h"
#include "dflash/safetensors.h"
#include "model/capture_stack.h"
#include "model/qwen35_weights.h"
#include "model/scratch_plan.h"
#include "ops/gated_delta.h"

namespace dflash {

namespace {
Tensor rows(const Tensor& b, int64_t T) { return b.slice_rows(0, T); }
}  // namespace

struct Qwen35Target::Impl {
  Ctx ctx;
  Qwen35Config cfg;
  std::vector<int> capture_layers;
  CapturePlan captures;
  DType act = DType::F32;
  Qwen35Weights w;

  Buffer stream[2], x_norm;  // [T, H]
  // The per-token activations of a layer's three phases -- a Gated DeltaNet or a full-attention mixer, then
  // the MLP -- are views of one allocation (model/scratch_plan.h): a phase's views are dead once its output
  // GEMM has run, so the phases share bytes and `work` is the largest phase (the MLP's 3I values per token
  // on the 27B shape) rather than their sum.
  Buffer work;
  // Gated DeltaNet layers
  Tensor qkv, conv;          // [T, 2*nk*dk + nv*dv]
  Tensor z, core;            // [T, nv*dv]
  Tensor a, b;               // [T, nv] projections (activation dtype)
  Tensor g, beta;            // [T, nv] gates, float32
  Buffer state;              // [nv, dk, dv] float32
  Buffer gdn_work;           // CUDA: the delta rule's per-chunk UT inverses, bf16 [T * nv * 64] (none on the CPU)
  // Full-attention layers
  Tensor q, gate, attn;      // [T, nh*hd]
  Tensor k, v;               // [T, nkv*hd]
  // MLP
  Tensor mlp_gate_up;        // [T, 2I] the fused gate|up GEMM's output
  Tensor mlp_act;            // [T, I] silu(gate) * up
  DeviceBatch inputs;        // tokens, positions, cu_seqlens

  // dst = residual + the mixer's output (the add in the output projection's epilogue).
  void linear_attn_forward(const Qwen35LinearAttnWeights& A, const Tensor& x, const Tensor& residual,
                           const Tensor& dst, int64_t T, const Tensor& cu);
  void full_attn_forward(const Qwen35FullAttnWeights& A, const Tensor& x, const Tensor& residual, const Tensor& dst,
                         int64_t T, const Tensor& cu);
  void layer_forward(const Qwen35LayerWeights& L, const Tensor& in, const Tensor& dst, int64_t T, const Tensor& cu);
};

Qwen35Target::Qwen35Target(const Qwen35Config& cfg, const std::string& dir, const Ctx& ctx,
                           std::vector<int> capture_layers, int64_t max_tokens)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.ctx = ctx;
  m.act = compute_dtype(ctx.device);
  m.cfg = cfg;
  const Qwen3Config& c = m.cfg.text;
  const int L = c.num_hidden_layers;
  DF_CHECK(max_tokens > 0, BadOptions, "the target needs max_tokens > 0, got " << max_tokens);
  m.captures = plan_captures(capture_layers, L, dir);
  m.capture_layers = std::move(capture_layers);

  Checkpoint ckpt(dir);
  m.w = load_qwen35_weights(ckpt, m.cfg, ctx, m.act);

  bool any_linear = false, any_full = false;
  for (Qwen35LayerKind kind : m.cfg.kinds) (kind == Qwen35LayerKind::LinearAttention ? any_linear : any_full) = true;
  const int64_t T = max_tokens, H = c.hidden_size, I = c.intermediate_size;
  const Device d = ctx.device;
  const DType act = m.act, f32 = DType::F32;
  for (Buffer& s : m.stream) s = Buffer(d, act, {T, H});
  m.x_norm = Buffer(d, act, {T, H});
  ScratchPlan plan(T);
  std::vector<std::pair<Tensor*, int>> views;  // filled in once `work` exists
  auto reserve = [&](Tensor* t, DType dtype, int64_t cols) { views.push_back({t, plan.reserve(dtype, cols)}); };
  if (any_linear) {
    const ops::GdnHeads gh = m.cfg.gdn_heads();
    for (Tensor* p : {&m.qkv, &m.conv}) reserve(p, act, gh.qkv_dim());
    for (Tensor* p : {&m.z, &m.core}) reserve(p, act, gh.value_dim());
    for (Tensor* p : {&m.a, &m.b}) reserve(p, act, gh.nv);
    for (Tensor* p : {&m.g, &m.beta}) reserve(p, f32, gh.nv);
    m.state = Buffer(d, f32, {gh.nv, gh.dk, gh.dv});
    if (d == Device::CUDA) m.gdn_work = Buffer(d, act, {ops::gated_delta_rule_workspace_elems(T, gh)});
  }
  if (any_full) {
    plan.new_phase();
    const int64_t q_dim = int64_t(c.num_attention_heads) * c.head_dim;
    const int64_t kv_dim = int64_t(c.num_key_value_heads) * c.head_dim;
    for (Tensor* p : {&m.q, &m.gate, &m.attn}) reserve(p, act, q_dim);
    for (Tensor* p : {&m.k, &m.v}) reserve(p, act, kv_dim);
  }
  plan.new_phase();
  reserve(&m.mlp_gate_up, act, 2 * I);
  reserve(&m.mlp_act, act, I);
  m.work = Buffer(d, DType::U8, {static_cast<int64_t>(plan.bytes())});
  for (const auto& [t, id] : views) *t = plan.view(m.work, id);
  m.inputs = DeviceBatch(d, T);
}

Qwen35Target::~Qwen35Target() = default;

const Qwen3Config& Qwen35Target::config() const { return impl_->cfg.text; }
DType Qwen35Target::activation_dtype() const { return impl_->act; }
const Qwen35Config& Qwen35Target::hybrid_config() const { return impl_->cfg; }
const std::vector<int>& Qwen35Target::capture_layers() const { return impl_->capture_layers; }
Tensor Qwen35Target::embed_tokens() const { return impl_->w.embed_tokens.t(); }
Tensor Qwen35Target::lm_head() const { return impl_->w.lm_head_table(); }

void Qwen35Target::Impl::linear_attn_forward(const Qwen35LinearAttnWeights& A, const Tensor& x,
                                             const Tensor& residual, const Tensor& dst, int64_t T,
                                             const Tensor& cu) {
  const ops::GdnHeads gh = cfg.gdn_heads();
  const Tensor qkv_t = rows(qkv, T), conv_t = rows(conv, T), z_t = rows(z, T), core_t = rows(core, T);
  const Tensor a_t = rows(a, T), b_t = rows(b, T), g_t = rows(g, T), beta_t = rows(beta, T);
  ops::matmul_forward(ctx, qkv_t, x, A.in_proj_qkv);
  ops::causal_conv1d_silu_forward(ctx, conv_t, qkv_t, A.conv1d, cu);
  ops::matmul_forward(ctx, z_t, x, A.in_proj_z);
  ops::matmul_forward(ctx, b_t, x, A.in_proj_b);
  ops::matmul_forward(ctx, a_t, x, A.in_proj_a);
  ops::gdn_gates_forward(ctx, g_t, beta_t, a_t, b_t, A.A_log, A.dt_bias);
  ops::gated_delta_rule_forward(ctx, core_t, state, conv_t, g_t, beta_t, cu, gh, gdn_work.t());
  // The output norm runs per value head: rows of dv.
  const Tensor heads = core_t.reshape({T * gh.nv, gh.dv});
  ops::gated_rmsnorm_forward(ctx, heads, heads, z_t.reshape({T * gh.nv, gh.dv}), A.norm, cfg.text.rms_norm_eps);
  ops::matmul_residual_forward(ctx, dst, core_t, A.out_proj, residual);
}

void Qwen35Target::Impl::full_attn_forward(const Qwen35FullAttnWeights& A, const Tensor& x, const Tensor& residual,
                                           const Tensor& dst, int64_t T, const Tensor& cu) {
  const Qwen3Config& c = cfg.text;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const ops::RopeSpec rope{c.rope_theta, cfg.rotary_dim};
  const Tensor qt = rows(q, T), gt = rows(gate, T), kt = rows(k, T), vt = rows(v, T), at = rows(attn, T);
  const Tensor positions = rows(inputs.pos, T);
  ops::matmul_forward(ctx, qt, x, A.q_proj);
  ops::matmul_forward(ctx, gt, x, A.gate_proj);
  ops::matmul_forward(ctx, kt, x, A.k_proj);
  ops::matmul_forward(ctx, vt, x, A.v_proj);
  const Tensor q3 = qt.reshape({T, nh, hd}), k3 = kt.reshape({T, nkv, hd});
  ops::head_norm_rope_forward(ctx, q3, Tensor(), q3, A.q_norm, positions, rope, c.rms_norm_eps);
  ops::head_norm_rope_forward(ctx, k3, Tensor(), k3, A.k_norm, positions, rope, c.rms_norm_eps);
  ops::attention_varlen_causal_forward(ctx, at.reshape({T, nh, hd}), q3, k3, vt.reshape({T, nkv, hd}), cu,
                                       1.0f / std::sqrt(static_cast<float>(hd)));
  ops::sigmoid_gate_forward(ctx, at, at, gt);
  ops::matmul_residual_forward(ctx, dst, at, A.o_proj, residual);
}

void Qwen35Target::Impl::layer_forward(const Qwen35LayerWeights& L, const Tensor& in, const Tensor& dst, int64_t T,
                                       const Tensor& cu) {
  const float eps = cfg.text.rms_norm_eps;
  const Tensor x = rows(x_norm, T);
  ops::rmsnorm_forward(ctx, x, Tensor(), in, L.input_layernorm, eps);
  if (L.kind == Qwen35LayerKind::LinearAttention) {
    linear_attn_forward(L.linear, x, in, dst, T, cu);
  } else {
    full_attn_forward(L.attn, x, in, dst, T, cu);
  }
  ops::rmsnorm_forward(ctx, x, Tensor(), dst, L.post_attention_layernorm, eps);
  const Tensor gu = rows(mlp_gate_up, T), at = rows(mlp_act, T);
  ops::matmul_forward(ctx, gu, x, L.gate_up_proj);
  ops::swiglu_fused_forward(ctx, at, gu);
  ops::matmul_forward(ctx, dst, at, L.down_proj, ops::Accumulate::Yes);
}

void Qwen35Target::forward(const PackedBatch& batch, const CaptureOut& out) {
  Impl& m = *impl_;
  const Qwen3Config& c = m.cfg.text;
  const int64_t T = batch.num_tokens(), H = c.hidden_size;
  const int64_t ncap = static_cast<int64_t>(m.capture_layers.size());

  const Tensor cu = m.inputs.upload(m.ctx, batch, c.vocab_size);
  check_capture_out(out, ncap, T, H, m.act, m.ctx.device);

  ops::embedding_forward(m.ctx, rows(m.stream[0], T), rows(m.inputs.tokens, T), m.w.embed_tokens);
  capture_stack_forward(m.ctx, m.captures, m.stream, T, H, out, m.w.norm, c.rms_norm_eps,
                        [&](int l, const Tensor& in, const Tensor& dst) {
                          m.layer_forward(m.w.layers[l], in, dst, T, cu);
                        });
}

void Qwen35Target::lm_head_forward(const Tensor& logits, const Tensor& final_norm) {
  ops::matmul_forward(impl_->ctx, logits, final_norm, impl_->w.lm_head_table());
}

}  // namespace dflash
