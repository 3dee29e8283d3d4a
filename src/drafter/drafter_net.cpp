// DFlash / DFlash2 drafter network: forward and hand-written backward (see include/dflash/drafter_model.h).
//
// Shapes: T context tokens, N blocks of B rows (NB = N*B), H hidden, k target layers,
// nh/nkv heads of hd, QD = nh*hd, KV = nkv*hd, I intermediate; DFlash2: D2 = 2 * taps * groups columns of
// each conv's kernel projection (docs/dflash2.md 2.2: the conv wraps the attention and the MLP).
#include <cmath>
#include <cstring>
#include <memory>

#include "dflash/drafter_model.h"
#include "dflash/drafter_ops.h"
#include "dflash/error.h"
#include "dflash/ops.h"
#include "dflash/rng.h"

namespace dflash {
namespace {

// A float buffer allocated once at its largest size; views of the current step's shape are cut from it.
struct Arena {
  Buffer buf;
  Arena() = default;
  Arena(Device dev, size_t floats) : buf(dev, DType::F32, {static_cast<int64_t>(floats ? floats : 1)}) {}
  Tensor view(std::initializer_list<int64_t> dims) const {
    Tensor t(buf.t().data, DType::F32, buf.t().device, dims);
    DF_ASSERT(t.numel() <= buf.numel());
    return t;
  }
};

void add_inplace(const Tensor& y, const Tensor& x) {  // y += x (same numel)
  DF_ASSERT(y.numel() == x.numel());
  float* py = y.ptr<float>();
  const float* px = x.ptr<float>();
  const size_t n = y.numel();
  for (size_t i = 0; i < n; ++i) py[i] += px[i];
}

Tensor as3(const Tensor& t, int64_t heads, int64_t hd) { return t.reshape({t.shape[0], heads, hd}); }

// base_kernel [2, k, H] -> the [k, H] half of one side (0 = prepare, 1 = finish).
Tensor conv_side(const Tensor& base, int side) {
  return base.slice_rows(side, side + 1).reshape({base.shape[1], base.shape[2]});
}

}  // namespace

struct LayerActs {
  // context side [T, ...]
  Arena kc_raw, kc, kc_rstd, vc;
  // block side [NB, ...]
  Arena x_in, xn, rstd1, q_raw, q, q_rstd, kb_raw, kb, kb_rstd, vb, attn, lse, x2, xn2, rstd2, g, u, act;
  // DFlash2 only: the convs' dynamic kernels [NB, D2], the attention's and the MLP's conv-prepared inputs,
  // and their sublayer outputs before the finish conv [NB, H].
  Arena dyn_attn, x_attn, o, dyn_mlp, x_mlp, f;
};

struct DrafterNet::Impl {
  DrafterConfig c;
  Ctx ctx;
  int64_t max_T, max_NB;
  int64_t H, K, nh, nkv, hd, QD, KV, I, B;
  bool d2 = false;  // DFlash2: the convs around attention and MLP
  int64_t D2 = 0;
  ops::GroupedConvSpec conv;
  ops::RopeSpec rope;
  float eps;
  // context
  Arena x_ctx, fc_out, th, rstd_h, pos_ctx;
  // block inputs
  Arena block_ids, pos_blk, anchors, seq_begin, x0;
  std::vector<LayerActs> layers;
  Arena x_last, h_final, rstd_f;
  // backward scratch
  Arena dx, dtmp, dxn, d_act, dg, du, d_attn, dq, dq_raw, dkb, dvb, dkb_raw, dkc, dvc, dkc_raw, d_th, d_th_tmp,
      d_fc, d_out, d_dyn, d_conv;
  // current step
  int64_t T = 0, N = 0, NB = 0;

  Impl(const DrafterConfig& cfg, const Ctx& cx, int64_t maxT, int64_t maxBlocks) : c(cfg), ctx(cx) {
    DF_CHECK(ctx.device == Device::CPU, BadOptions, "the drafter network runs on the CPU backend only in this build");
    const Qwen3Config& L = c.layers;
    max_T = maxT;
    B = c.block_size;
    max_NB = maxBlocks * B;
    H = L.hidden_size;
    K = static_cast<int64_t>(c.target_layer_ids.size());
    nh = L.num_attention_heads;
    nkv = L.num_key_value_heads;
    hd = L.head_dim;
    QD = nh * hd;
    KV = nkv * hd;
    I = L.intermediate_size;
    rope.theta = L.rope_theta;
    rope.rotary_dim = 0;
    eps = L.rms_norm_eps;
    d2 = c.arch == DraftArch::DFlash2;
    if (d2) {
      conv = {static_cast<int>(B), c.d2.conv_kernel_size, c.d2.conv_group_size};
      D2 = 2 * static_cast<int64_t>(c.d2.conv_kernel_size) * (H / c.d2.conv_group_size);
    }
    const Device d = ctx.device;
    auto f = [&](int64_t rows, int64_t cols) { return Arena(d, static_cast<size_t>(rows) * cols); };
    x_ctx = f(max_T, K * H);
    fc_out = f(max_T, H);
    th = f(max_T, H);
    rstd_h = f(max_T, 1);
    pos_ctx = f(max_T, 1);  // I32 payload in a float-sized arena
    block_ids = f(max_NB, 1);
    pos_blk = f(max_NB, 1);
    anchors = f(maxBlocks, 1);
    seq_begin = f(maxBlocks, 1);
    x0 = f(max_NB, H);
    layers.resize(static_cast<size_t>(L.num_hidden_layers));
    for (LayerActs& a : layers) {
      a.kc_raw = f(max_T, KV);
      a.kc = f(max_T, KV);
      a.kc_rstd = f(max_T, nkv);
      a.vc = f(max_T, KV);
      a.x_in = f(max_NB, H);
      a.xn = f(max_NB, H);
      a.rstd1 = f(max_NB, 1);
      a.q_raw = f(max_NB, QD);
      a.q = f(max_NB, QD);
      a.q_rstd = f(max_NB, nh);
      a.kb_raw = f(max_NB, KV);
      a.kb = f(max_NB, KV);
      a.kb_rstd = f(max_NB, nkv);
      a.vb = f(max_NB, KV);
      a.attn = f(max_NB, QD);
      a.lse = f(max_NB, nh);
      a.x2 = f(max_NB, H);
      a.xn2 = f(max_NB, H);
      a.rstd2 = f(max_NB, 1);
      a.g = f(max_NB, I);
      a.u = f(max_NB, I);
      a.act = f(max_NB, I);
      if (d2) {
        a.dyn_attn = f(max_NB, D2);
        a.x_attn = f(max_NB, H);
        a.o = f(max_NB, H);
        a.dyn_mlp = f(max_NB, D2);
        a.x_mlp = f(max_NB, H);
        a.f = f(max_NB, H);
      }
    }
    x_last = f(max_NB, H);
    h_final = f(max_NB, H);
    rstd_f = f(max_NB, 1);
    dx = f(max_NB, H);
    dtmp = f(max_NB, H);
    dxn = f(max_NB, H);
    d_act = f(max_NB, I);
    dg = f(max_NB, I);
    du = f(max_NB, I);
    d_attn = f(max_NB, QD);
    dq = f(max_NB, QD);
    dq_raw = f(max_NB, QD);
    dkb = f(max_NB, KV);
    dvb = f(max_NB, KV);
    dkb_raw = f(max_NB, KV);
    dkc = f(max_T, KV);
    dvc = f(max_T, KV);
    dkc_raw = f(max_T, KV);
    d_th = f(max_T, H);
    d_th_tmp = f(max_T, H);
    d_fc = f(max_T, H);
    d_out = f(max_NB, H);
    if (d2) {
      d_dyn = f(max_NB, D2);
      d_conv = f(max_NB, H);
    }
  }

  Tensor i32(const Arena& a, int64_t n) const {
    DF_ASSERT(static_cast<size_t>(n) <= a.buf.numel());
    return Tensor(a.buf.t().data, DType::I32, a.buf.t().device, {n});
  }
  // The last forward's DrafterStepInput::block_rows rides along: a backward after a forward of shortened
  // blocks is refused by the op (block_attention_backward takes whole blocks only).
  int block_rows = 0;
  ops::BlockAttnSpec attn_spec(size_t layer) const {
    ops::BlockAttnSpec s = ops::drafter_attn_spec(c, layer);
    s.block_rows = block_rows;
    return s;
  }
};

namespace {

// DFlash2, at a sublayer's input: `d` holds the gradient at the conv-prepared input; turns it into the
// gradient at the normed input `in` (prepare conv's din plus the kernel projection's input gradient, the
// projection reading `in` for both sides' dynamic kernels). d_dyn's finish half was written by the finish
// conv's backward already; `scratch` [NB, H] is overwritten.
void conv_input_backward(const Ctx& ctx, const DrafterNet::Impl& m, const Tensor& d, const Tensor& scratch,
                         const Tensor& d_dyn, const Tensor& in, const Tensor& dyn, const Tensor& base,
                         const Tensor& proj, const Tensor& d_base, const Tensor& d_proj) {
  ops::grouped_conv_backward(ctx, scratch, d_dyn, conv_side(d_base, 0), d, in, dyn, 0, conv_side(base, 0), m.conv);
  ops::matmul_backward(ctx, d, d_proj, d_dyn, in, proj);
  add_inplace(d, scratch);
}

}  // namespace

DrafterNet::DrafterNet(const DrafterConfig& c, const Ctx& ctx, int64_t max_tokens, int64_t max_blocks)
    : impl_(std::make_unique<Impl>(c, ctx, max_tokens, max_blocks)) {}
DrafterNet::~DrafterNet() = default;

Tensor DrafterNet::d_out_buffer(int64_t rows) { return impl_->d_out.view({rows, impl_->H}); }

Tensor DrafterNet::forward(const DrafterViews& w, const Tensor& embed, const DrafterStepInput& in, Rng* rng) {
  Impl& m = *impl_;
  const Ctx& ctx = m.ctx;
  const int64_t H = m.H, K = m.K, B = m.B;
  DF_CHECK(in.features.ndim == 3 && in.features.shape[0] == K && in.features.shape[2] == H, Internal,
           "drafter features " << in.features.shape_str() << ", expected [" << K << ", T, " << H << "]");
  const int64_t T = in.features.shape[1];
  const int64_t N = static_cast<int64_t>(in.anchors.size());
  DF_CHECK(T <= m.max_T, Internal, "batch of " << T << " tokens exceeds the drafter's max_tokens " << m.max_T);
  DF_CHECK(N * B <= m.max_NB, Internal, "batch of " << N << " anchors exceeds the drafter's anchor capacity");
  DF_CHECK(N > 0, Internal, "drafter forward without anchors");
  m.T = T;
  m.N = N;
  m.NB = N * B;
  m.block_rows = in.block_rows;
  const int64_t NB = m.NB;

  // ---- context: x_ctx [T, k*H] gathered per token from features [k, T, H]; th = hidden_norm(fc(x_ctx))
  const float* feat = in.features.ptr<float>();
  Tensor x_ctx = m.x_ctx.view({T, K * H});
  float* xc = x_ctx.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t l = 0; l < K; ++l)
      std::memcpy(xc + (t * K + l) * H, feat + (l * T + t) * H, sizeof(float) * static_cast<size_t>(H));
  Tensor fc_out = m.fc_out.view({T, H});
  Tensor th = m.th.view({T, H});
  ops::matmul_forward(ctx, fc_out, x_ctx, w.fc);
  ops::rmsnorm_forward(ctx, th, m.rstd_h.view({T}), fc_out, w.hidden_norm, m.eps);
  if (in.noise_std > 0.f) {
    DF_ASSERT(rng != nullptr);
    float* p = th.ptr<float>();
    for (size_t i = 0, n = th.numel(); i < n; ++i) p[i] += in.noise_std * static_cast<float>(rng->normal());
  }

  // ---- index inputs
  Tensor pos_ctx = m.i32(m.pos_ctx, T);
  std::memcpy(pos_ctx.data, in.ctx_pos.data(), sizeof(int32_t) * static_cast<size_t>(T));
  Tensor anchors = m.i32(m.anchors, N), seq_begin = m.i32(m.seq_begin, N);
  std::memcpy(anchors.data, in.anchors.data(), sizeof(int32_t) * static_cast<size_t>(N));
  std::memcpy(seq_begin.data, in.seq_begin.data(), sizeof(int32_t) * static_cast<size_t>(N));
  Tensor block_ids = m.i32(m.block_ids, NB), pos_blk = m.i32(m.pos_blk, NB);
  int32_t* ids = block_ids.ptr<int32_t>();
  int32_t* pb = pos_blk.ptr<int32_t>();
  for (int64_t n = 0; n < N; ++n) {
    const int32_t a = in.anchors[n];
    for (int64_t o = 0; o < B; ++o) {
      ids[n * B + o] = o == 0 ? in.tokens[a] : m.c.mask_token_id;
      pb[n * B + o] = in.ctx_pos[a] + static_cast<int32_t>(o);
    }
  }
  Tensor x = m.x0.view({NB, H});
  ops::embedding_forward(ctx, x, block_ids, embed);
  if (m.c.input_embedding_scale != 1.0f) {  // the official generate scales the noise embedding
    float* p = x.ptr<float>();
    for (size_t i = 0, n = x.numel(); i < n; ++i) p[i] *= m.c.input_embedding_scale;
  }

  // ---- layers
  for (size_t li = 0; li < m.layers.size(); ++li) {
    LayerActs& a = m.layers[li];
    const DrafterLayerViews& lw = w.layers[li];
    Tensor x_in = a.x_in.view({NB, H});
    std::memcpy(x_in.data, x.data, x.nbytes());
    Tensor xn = a.xn.view({NB, H});
    ops::rmsnorm_forward(ctx, xn, a.rstd1.view({NB}), x_in, lw.input_norm, m.eps);
    // The attention's input: the normed block stream, through the prepare side of the conv in DFlash2 (its
    // kernel projection gives both sides' dynamic kernels from this same input).
    Tensor attn_in = xn;
    if (m.d2) {
      Tensor dyn = a.dyn_attn.view({NB, m.D2});
      ops::matmul_forward(ctx, dyn, xn, lw.attn_conv_proj);
      attn_in = a.x_attn.view({NB, H});
      ops::grouped_conv_forward(ctx, attn_in, xn, dyn, 0, conv_side(lw.attn_conv_base, 0), m.conv);
    }
    // queries and block keys/values from the block stream
    Tensor q_raw = a.q_raw.view({NB, m.QD}), q = a.q.view({NB, m.nh, m.hd});
    ops::matmul_forward(ctx, q_raw, attn_in, lw.q_proj);
    ops::head_norm_rope_forward(ctx, q, a.q_rstd.view({NB, m.nh}), as3(q_raw, m.nh, m.hd), lw.q_norm, pos_blk,
                                m.rope, m.eps);
    Tensor kb_raw = a.kb_raw.view({NB, m.KV}), kb = a.kb.view({NB, m.nkv, m.hd}), vb = a.vb.view({NB, m.KV});
    ops::matmul_forward(ctx, kb_raw, attn_in, lw.k_proj);
    ops::head_norm_rope_forward(ctx, kb, a.kb_rstd.view({NB, m.nkv}), as3(kb_raw, m.nkv, m.hd), lw.k_norm, pos_blk,
                                m.rope, m.eps);
    ops::matmul_forward(ctx, vb, attn_in, lw.v_proj);
    // context keys/values from the fused target features (no input_layernorm on them)
    Tensor kc_raw = a.kc_raw.view({T, m.KV}), kc = a.kc.view({T, m.nkv, m.hd}), vc = a.vc.view({T, m.KV});
    ops::matmul_forward(ctx, kc_raw, th, lw.k_proj);
    ops::head_norm_rope_forward(ctx, kc, a.kc_rstd.view({T, m.nkv}), as3(kc_raw, m.nkv, m.hd), lw.k_norm, pos_ctx,
                                m.rope, m.eps);
    ops::matmul_forward(ctx, vc, th, lw.v_proj);
    Tensor attn = a.attn.view({NB, m.nh, m.hd});
    ops::block_attention_forward(ctx, attn, a.lse.view({NB, m.nh}), q, kc, as3(vc, m.nkv, m.hd), kb,
                                 as3(vb, m.nkv, m.hd), anchors, seq_begin, m.attn_spec(li));
    // x2 = x_in + o_proj(attn)   (DFlash2: x_in + finish_conv(o_proj(attn)))
    Tensor x2 = a.x2.view({NB, H});
    if (m.d2) {
      Tensor o = a.o.view({NB, H});
      ops::matmul_forward(ctx, o, attn.reshape({NB, m.QD}), lw.o_proj);
      ops::grouped_conv_forward(ctx, x2, o, a.dyn_attn.view({NB, m.D2}), 1, conv_side(lw.attn_conv_base, 1), m.conv);
      add_inplace(x2, x_in);
    } else {
      std::memcpy(x2.data, x_in.data, x_in.nbytes());
      ops::matmul_forward(ctx, x2, attn.reshape({NB, m.QD}), lw.o_proj, ops::Accumulate::Yes);
    }
    // MLP: x_out = x2 + down(silu(gate(xn2)) * up(xn2))   (DFlash2: the same conv pair around it)
    Tensor xn2 = a.xn2.view({NB, H});
    ops::rmsnorm_forward(ctx, xn2, a.rstd2.view({NB}), x2, lw.post_norm, m.eps);
    Tensor mlp_in = xn2;
    if (m.d2) {
      Tensor dyn = a.dyn_mlp.view({NB, m.D2});
      ops::matmul_forward(ctx, dyn, xn2, lw.mlp_conv_proj);
      mlp_in = a.x_mlp.view({NB, H});
      ops::grouped_conv_forward(ctx, mlp_in, xn2, dyn, 0, conv_side(lw.mlp_conv_base, 0), m.conv);
    }
    Tensor g = a.g.view({NB, m.I}), u = a.u.view({NB, m.I}), act = a.act.view({NB, m.I});
    ops::matmul_forward(ctx, g, mlp_in, lw.gate_proj);
    ops::matmul_forward(ctx, u, mlp_in, lw.up_proj);
    ops::swiglu_forward(ctx, act, g, u);
    x = li + 1 < m.layers.size() ? m.layers[li + 1].x_in.view({NB, H}) : m.x_last.view({NB, H});
    if (m.d2) {
      Tensor f = a.f.view({NB, H});
      ops::matmul_forward(ctx, f, act, lw.down_proj);
      ops::grouped_conv_forward(ctx, x, f, a.dyn_mlp.view({NB, m.D2}), 1, conv_side(lw.mlp_conv_base, 1), m.conv);
      add_inplace(x, x2);
    } else {
      std::memcpy(x.data, x2.data, x2.nbytes());
      ops::matmul_forward(ctx, x, act, lw.down_proj, ops::Accumulate::Yes);
    }
  }
  Tensor hf = m.h_final.view({NB, H});
  ops::rmsnorm_forward(ctx, hf, m.rstd_f.view({NB}), x, w.norm, m.eps);
  return hf;
}

void DrafterNet::backward(const DrafterViews& w, const DrafterViews& gr, const Tensor& d_out,
                          const std::function<void(const Tensor&)>& ready) {
  Impl& m = *impl_;
  const Ctx& ctx = m.ctx;
  const int64_t H = m.H, T = m.T, NB = m.NB;
  DF_CHECK(NB > 0 && d_out.ndim == 2 && d_out.shape[0] == NB && d_out.shape[1] == H, Internal,
           "drafter backward: d_out " << d_out.shape_str() << " for " << NB << " rows");
  Tensor dx = m.dx.view({NB, H}), dtmp = m.dtmp.view({NB, H}), dxn = m.dxn.view({NB, H});
  Tensor x_last = m.layers.empty() ? m.x0.view({NB, H}) : m.x_last.view({NB, H});
  ops::rmsnorm_backward(ctx, dx, gr.norm, d_out, x_last, w.norm, m.rstd_f.view({NB}));
  if (ready) ready(gr.norm);

  Tensor th = m.th.view({T, H});
  Tensor d_th = m.d_th.view({T, H}), d_th_tmp = m.d_th_tmp.view({T, H});
  std::memset(d_th.data, 0, d_th.nbytes());
  Tensor pos_ctx = m.i32(m.pos_ctx, T), pos_blk = m.i32(m.pos_blk, NB);
  Tensor anchors = m.i32(m.anchors, m.N), seq_begin = m.i32(m.seq_begin, m.N);

  for (size_t li = m.layers.size(); li-- > 0;) {
    LayerActs& a = m.layers[li];
    const DrafterLayerViews& lw = w.layers[li];
    const DrafterLayerViews& lg = gr.layers[li];
    // ---- MLP (dx is the gradient at this layer's output)
    Tensor g = a.g.view({NB, m.I}), u = a.u.view({NB, m.I}), act = a.act.view({NB, m.I});
    Tensor d_act = m.d_act.view({NB, m.I}), dg = m.dg.view({NB, m.I}), du = m.du.view({NB, m.I});
    Tensor xn2 = a.xn2.view({NB, H}), x2 = a.x2.view({NB, H});
    Tensor d_dyn = m.d2 ? m.d_dyn.view({NB, m.D2}) : Tensor(), d_conv = m.d2 ? m.d_conv.view({NB, H}) : Tensor();
    if (m.d2) {  // x_out = x2 + finish(f): d_conv = d f; the finish side's half of d_dyn
      ops::grouped_conv_backward(ctx, d_conv, d_dyn, conv_side(lg.mlp_conv_base, 1), dx, a.f.view({NB, H}),
                                 a.dyn_mlp.view({NB, m.D2}), 1, conv_side(lw.mlp_conv_base, 1), m.conv);
      ops::matmul_backward(ctx, d_act, lg.down_proj, d_conv, act, lw.down_proj);
    } else {
      ops::matmul_backward(ctx, d_act, lg.down_proj, dx, act, lw.down_proj);
    }
    ops::swiglu_backward(ctx, dg, du, d_act, g, u);
    const Tensor mlp_in = m.d2 ? a.x_mlp.view({NB, H}) : xn2;
    ops::matmul_backward(ctx, dxn, lg.gate_proj, dg, mlp_in, lw.gate_proj);
    ops::matmul_backward(ctx, dtmp, lg.up_proj, du, mlp_in, lw.up_proj);
    add_inplace(dxn, dtmp);
    if (m.d2) conv_input_backward(ctx, m, dxn, dtmp, d_dyn, xn2, a.dyn_mlp.view({NB, m.D2}), lw.mlp_conv_base,
                                  lw.mlp_conv_proj, lg.mlp_conv_base, lg.mlp_conv_proj);
    ops::rmsnorm_backward(ctx, dtmp, lg.post_norm, dxn, x2, lw.post_norm, a.rstd2.view({NB}));
    add_inplace(dx, dtmp);  // dx is now the gradient at x2
    // ---- attention
    Tensor attn = a.attn.view({NB, m.nh, m.hd});
    Tensor d_attn = m.d_attn.view({NB, m.nh, m.hd});
    if (m.d2) {  // x2 = x_in + finish(o)
      ops::grouped_conv_backward(ctx, d_conv, d_dyn, conv_side(lg.attn_conv_base, 1), dx, a.o.view({NB, H}),
                                 a.dyn_attn.view({NB, m.D2}), 1, conv_side(lw.attn_conv_base, 1), m.conv);
      ops::matmul_backward(ctx, d_attn.reshape({NB, m.QD}), lg.o_proj, d_conv, attn.reshape({NB, m.QD}), lw.o_proj);
    } else {
      ops::matmul_backward(ctx, d_attn.reshape({NB, m.QD}), lg.o_proj, dx, attn.reshape({NB, m.QD}), lw.o_proj);
    }
    Tensor q = a.q.view({NB, m.nh, m.hd}), kb = a.kb.view({NB, m.nkv, m.hd}), kc = a.kc.view({T, m.nkv, m.hd});
    Tensor vb = a.vb.view({NB, m.nkv, m.hd}), vc = a.vc.view({T, m.nkv, m.hd});
    Tensor dq = m.dq.view({NB, m.nh, m.hd}), dkb = m.dkb.view({NB, m.nkv, m.hd}), dvb = m.dvb.view({NB, m.nkv, m.hd});
    Tensor dkc = m.dkc.view({T, m.nkv, m.hd}), dvc = m.dvc.view({T, m.nkv, m.hd});
    ops::block_attention_backward(ctx, dq, dkc, dvc, dkb, dvb, d_attn, attn, a.lse.view({NB, m.nh}), q, kc, vc, kb,
                                  vb, anchors, seq_begin, m.attn_spec(li));
    Tensor dq_raw = m.dq_raw.view({NB, m.nh, m.hd});
    ops::head_norm_rope_backward(ctx, dq_raw, lg.q_norm, dq, a.q_raw.view({NB, m.nh, m.hd}), lw.q_norm,
                                 a.q_rstd.view({NB, m.nh}), pos_blk, m.rope, m.eps);
    Tensor dkb_raw = m.dkb_raw.view({NB, m.nkv, m.hd});
    ops::head_norm_rope_backward(ctx, dkb_raw, lg.k_norm, dkb, a.kb_raw.view({NB, m.nkv, m.hd}), lw.k_norm,
                                 a.kb_rstd.view({NB, m.nkv}), pos_blk, m.rope, m.eps);
    Tensor dkc_raw = m.dkc_raw.view({T, m.nkv, m.hd});
    ops::head_norm_rope_backward(ctx, dkc_raw, lg.k_norm, dkc, a.kc_raw.view({T, m.nkv, m.hd}), lw.k_norm,
                                 a.kc_rstd.view({T, m.nkv}), pos_ctx, m.rope, m.eps);
    // block side: dxn = dq_raw Wq + dkb_raw Wk + dvb Wv (at the attention's input)
    Tensor xn = a.xn.view({NB, H});
    const Tensor attn_in = m.d2 ? a.x_attn.view({NB, H}) : xn;
    ops::matmul_backward(ctx, dxn, lg.q_proj, dq_raw.reshape({NB, m.QD}), attn_in, lw.q_proj);
    ops::matmul_backward(ctx, dtmp, lg.k_proj, dkb_raw.reshape({NB, m.KV}), attn_in, lw.k_proj);
    add_inplace(dxn, dtmp);
    ops::matmul_backward(ctx, dtmp, lg.v_proj, dvb.reshape({NB, m.KV}), attn_in, lw.v_proj);
    add_inplace(dxn, dtmp);
    if (m.d2) conv_input_backward(ctx, m, dxn, dtmp, d_dyn, xn, a.dyn_attn.view({NB, m.D2}), lw.attn_conv_base,
                                  lw.attn_conv_proj, lg.attn_conv_base, lg.attn_conv_proj);
    // context side: d_th += dkc_raw Wk + dvc Wv
    ops::matmul_backward(ctx, d_th_tmp, lg.k_proj, dkc_raw.reshape({T, m.KV}), th, lw.k_proj);
    add_inplace(d_th, d_th_tmp);
    ops::matmul_backward(ctx, d_th_tmp, lg.v_proj, dvc.reshape({T, m.KV}), th, lw.v_proj);
    add_inplace(d_th, d_th_tmp);
    // input_layernorm; the residual carries dx through
    ops::rmsnorm_backward(ctx, dtmp, lg.input_norm, dxn, a.x_in.view({NB, H}), lw.input_norm, a.rstd1.view({NB}));
    add_inplace(dx, dtmp);
    if (ready)
      for (const Tensor* t : {&lg.input_norm, &lg.q_proj, &lg.k_proj, &lg.v_proj, &lg.o_proj, &lg.q_norm, &lg.k_norm,
                              &lg.post_norm, &lg.gate_proj, &lg.up_proj, &lg.down_proj, &lg.attn_conv_base,
                              &lg.attn_conv_proj, &lg.mlp_conv_base, &lg.mlp_conv_proj})
        if (!t->empty()) ready(*t);
  }
  // The block input is the frozen embedding: no gradient. Context: th = hidden_norm(fc(x_ctx)).
  Tensor d_fc = m.d_fc.view({T, H});
  ops::rmsnorm_backward(ctx, d_fc, gr.hidden_norm, d_th, m.fc_out.view({T, H}), w.hidden_norm, m.rstd_h.view({T}));
  ops::matmul_backward(ctx, Tensor(), gr.fc, d_fc, m.x_ctx.view({T, m.K * H}), w.fc);
  if (ready) {
    ready(gr.hidden_norm);
    ready(gr.fc);
  }
}

}  // namespace dflash
