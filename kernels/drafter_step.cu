// The drafter's training step on CUDA; see drafter_step.cuh. The network part follows
// src/model/drafter_net.cpp operation for operation (same shapes and names), so the two read side by side.
// Shapes: T context tokens, N blocks of B rows (NB = N*B), H hidden, K target layers, nh/nkv heads of hd,
// QD = nh*hd, KV = nkv*hd, I intermediate, R loss rows, V vocabulary.
#include "drafter_step.cuh"

#include <cuda_bf16.h>

#include <cmath>
#include <map>
#include <string>

#include "adamw.cuh"
#include "backend.cuh"
#include "bf16_util.cuh"
#include "block_attention.cuh"
#include "cuda_check.cuh"
#include "drafter_backward.cuh"
#include "drafter_blas.cuh"
#include "embedding.cuh"
#include "feature_noise.cuh"
#include "head_norm_rope.cuh"
#include "lm_loss.cuh"
#include "matmul.cuh"
#include "rmsnorm.cuh"
#include "swiglu.cuh"

namespace dflash::cuda {
namespace {

// ---- small kernels ------------------------------------------------------------------------------
// x_ctx [T, K*H] <- features [K, T, H] (16-byte vectors; H % 8 == 0)
__global__ void gather_features_kernel(Bf16x8* __restrict__ x, const Bf16x8* __restrict__ f, int64_t T, int K, int H8) {
  const int64_t n = T * K * H8, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t t = i / (int64_t(K) * H8), rem = i % (int64_t(K) * H8);
    const int l = int(rem / H8), h = int(rem % H8);
    x[i] = f[(int64_t(l) * T + t) * H8 + h];
  }
}
// dst [R, H] <- src rows idx[r]   (scatter = false)    or    dst rows idx[r] <- src [R, H]   (scatter = true)
__global__ void move_rows_kernel(Bf16x8* __restrict__ dst, const Bf16x8* __restrict__ src,
                                 const int32_t* __restrict__ idx, int64_t R, int H8, bool scatter) {
  const int64_t n = R * H8, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / H8, h = i % H8, j = idx[r];
    if (scatter)
      dst[j * H8 + h] = src[i];
    else
      dst[i] = src[j * H8 + h];
  }
}
// y += x (bf16, n8 vectors of 8)
__global__ void add_kernel(Bf16x8* __restrict__ y, const Bf16x8* __restrict__ x, int64_t n8) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += stride) {
    float a[8], b[8];
    unpack8(y[i], a);
    unpack8(x[i], b);
#pragma unroll
    for (int e = 0; e < 8; ++e) a[e] += b[e];
    y[i] = pack8(a);
  }
}
__global__ void f32_to_bf16_kernel(__nv_bfloat16* __restrict__ d, const float* __restrict__ s, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) d[i] = __float2bfloat16_rn(s[i]);
}

unsigned grid_of(const Ctx& ctx, int64_t n) { return grid_stride_blocks(ctx, n, 256, 16); }

Tensor dev(DType t, void* p, std::initializer_list<int64_t> dims) { return Tensor(p, t, Device::CUDA, dims); }

}  // namespace

struct LayerW {
  Tensor input_norm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm, post_norm, gate_proj, up_proj, down_proj;
};
struct NetW {
  Tensor fc, hidden_norm, norm;
  std::vector<LayerW> layers;
};

struct LayerActs {
  Buffer kc_raw, kc, kc_rstd, vc, x_in, xn, rstd1, q_raw, q, q_rstd, kb_raw, kb, kb_rstd, vb, attn, lse, x2, xn2,
      rstd2, g, u, act;
};

struct DrafterStepCuda::Impl {
  DrafterConfig c;
  Ctx ctx;
  int64_t max_T, max_N, max_NB, max_R, chunk_rows;
  int64_t H, K, nh, nkv, hd, QD, KV, I, B, V = 0;
  ops::RopeSpec rope;
  float eps;
  size_t P = 0;
  Buffer params, grads, m, v, pbf;
  NetW w, g;  // bf16 weights / fp32 gradients
  Tensor embed, lm_head;
  // context / block inputs
  Buffer x_ctx, fc_out, th, rstd_h, pos_ctx, block_ids, pos_blk, anchors, seq_begin, x0;
  std::vector<LayerActs> layers;
  Buffer x_last, h_final, rstd_f;
  // loss
  Buffer h_rows, t_rows, dh_rows, row_idx, teacher_idx, labels, row_w, loss_r, kl_r, am_q, am_p, workspace;
  // backward scratch
  Buffer dx, dtmp, dxn, d_act, dg, du, d_attn, dq, dq_raw, dkb, dvb, dkb_raw, dkc, dvc, dkc_raw, d_th, d_fc, d_out;
  int64_t T = 0, N = 0, NB = 0;
  std::vector<int32_t> anchors_host, seq_begin_host;  // the batch's, for the attention chunk plans
  // profiling: events[i] opens an interval of phase phases[i] that events[i + 1] closes
  bool profiling = false;
  std::vector<cudaEvent_t> event_pool;
  std::vector<int> phases;
  std::vector<double> phase_sum = std::vector<double>(static_cast<size_t>(Phase::Count), 0.0);
  using Phase = DrafterStepCuda::Phase;
  void mark(Phase ph) {
    if (!profiling) return;
    const size_t i = phases.size();
    if (i == event_pool.size()) {
      cudaEvent_t e;
      DF_CUDA(cudaEventCreate(&e));
      event_pool.push_back(e);
    }
    DF_CUDA(cudaEventRecord(event_pool[i], stream_of(ctx)));
    phases.push_back(static_cast<int>(ph));
  }

  Buffer bf(int64_t rows, int64_t cols) { return Buffer(Device::CUDA, DType::BF16, {std::max<int64_t>(rows * cols, 8)}); }
  Buffer f32(int64_t n) { return Buffer(Device::CUDA, DType::F32, {std::max<int64_t>(n, 4)}); }
  Buffer i32(int64_t n) { return Buffer(Device::CUDA, DType::I32, {std::max<int64_t>(n, 4)}); }
  static Tensor v2(const Buffer& b, int64_t r, int64_t c) { return dev(b.t().dtype, b.t().data, {r, c}); }
  static Tensor v3(const Buffer& b, int64_t r, int64_t h, int64_t d) { return dev(b.t().dtype, b.t().data, {r, h, d}); }
  static Tensor v1(const Buffer& b, int64_t n) { return dev(b.t().dtype, b.t().data, {n}); }

  ops::BlockAttnSpec attn_spec(size_t layer) const {
    ops::BlockAttnSpec s;
    s.block_size = static_cast<int>(B);
    s.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const auto& types = c.layers.layer_types;
    if (layer < types.size() && types[layer] == "sliding_attention") s.window = c.layers.sliding_window;
    return s;
  }

  void add(const Tensor& y, const Tensor& x) {
    DF_ASSERT(y.numel() == x.numel() && y.numel() % 8 == 0);
    const int64_t n8 = static_cast<int64_t>(y.numel() / 8);
    add_kernel<<<grid_of(ctx, n8), 256, 0, stream_of(ctx)>>>(static_cast<Bf16x8*>(y.data), static_cast<const Bf16x8*>(x.data), n8);
    DF_CUDA_LAUNCH();
  }
  void copy(const Tensor& dst, const Tensor& src) {
    DF_CUDA(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, stream_of(ctx)));
  }
  // din [N, I] (=, or += when accumulate) dout [N, O] · W [O, I]
  void linear_din(const Tensor& din, const Tensor& dout, const Tensor& W, bool accumulate) {
    const int64_t O = W.shape[0], In = W.shape[1], Nr = static_cast<int64_t>(dout.numel()) / O;
    gemm_bf16(ctx, false, false, In, Nr, O, 1.f, {W.data, In, 0}, {dout.data, O, 0}, accumulate ? 1.f : 0.f, din.data,
              false, In, 0);
  }
  // dW [O, I] (fp32) += dout^T · in
  void linear_dw(const Tensor& dW, const Tensor& dout, const Tensor& in, const Tensor& W) {
    cuda::matmul_backward(ctx, Tensor(), dW, dout, in, W);
  }
  void upload_i32(const Buffer& dst, const std::vector<int32_t>& src) {
    DF_ASSERT(src.size() <= dst.numel());
    copy_bytes(ctx, dst.t().data, src.data(), sizeof(int32_t) * src.size());
  }

  Tensor forward(const DrafterStepBatch& b);
  // ready: see DrafterStepCuda::GradReady (may be empty).
  void backward(const Tensor& d_out, const GradReady& ready);
  // Reports gradient view g (a tensor of `g` below) final to ready.
  void final(const GradReady& ready, const Tensor& gv) const {
    if (!ready) return;
    const size_t begin = static_cast<size_t>(static_cast<const float*>(gv.data) - static_cast<const float*>(grads.t().data));
    ready(begin, begin + gv.numel());
  }
  // The loss rows of the last forward (hf) on the device, and dh_rows when grad.
  void loss_rows(const DrafterStepBatch& b, const Tensor& hf, ops::LossObjective objective, bool grad);
  // The per-row results and the weighted loss into res (synchronizes).
  void download_rows(const DrafterStepBatch& b, ops::LossObjective objective, DrafterStepResult& res);
  // d_out [NB, H] = dh_rows scattered to their block rows (zero elsewhere), then the drafter backward.
  void backward_from_rows(const GradReady& ready);
  int64_t R = 0;              // loss rows of the last forward
  bool have_teacher = false;  // its teacher rows are in t_rows
};

DrafterStepCuda::DrafterStepCuda(const DrafterConfig& cfg, const std::vector<ParamSpec>& layout, const Ctx& ctx,
                                 int64_t max_tokens, int64_t max_anchors, int64_t chunk_rows)
    : impl_(new Impl()) {
  Impl& s = *impl_;
  s.c = cfg;
  s.ctx = ctx;
  const Qwen3Config& L = cfg.layers;
  s.B = cfg.block_size;
  s.max_T = max_tokens;
  s.max_N = max_anchors;
  s.max_NB = max_anchors * s.B;
  s.max_R = max_anchors * (s.B - 1);
  s.chunk_rows = std::max<int64_t>(1, std::min(chunk_rows, s.max_R));
  s.H = L.hidden_size;
  s.K = static_cast<int64_t>(cfg.target_layer_ids.size());
  s.nh = L.num_attention_heads;
  s.nkv = L.num_key_value_heads;
  s.hd = L.head_dim;
  s.QD = s.nh * s.hd;
  s.KV = s.nkv * s.hd;
  s.I = L.intermediate_size;
  s.rope.theta = L.rope_theta;
  s.rope.rotary_dim = 0;
  s.eps = L.rms_norm_eps;
  s.V = L.vocab_size;
  for (const ParamSpec& p : layout) {
    size_t n = 1;
    for (int64_t d : p.shape) n *= static_cast<size_t>(d);
    s.P = std::max(s.P, p.offset + n);
  }
  // Every tensor starts at a multiple of 8 elements in the layouts we use; 16-byte vectors need it.
  for (const ParamSpec& p : layout)
    DF_CHECK(p.offset % 8 == 0, Internal, "drafter step (CUDA): parameter " << p.name << " at offset " << p.offset
                                                                              << " is not 16-byte aligned in bf16");
  const int64_t P = static_cast<int64_t>(s.P);
  s.params = Buffer(Device::CUDA, DType::F32, {P});
  s.grads = Buffer(Device::CUDA, DType::F32, {P});
  s.m = Buffer(Device::CUDA, DType::F32, {P});
  s.v = Buffer(Device::CUDA, DType::F32, {P});
  s.pbf = Buffer(Device::CUDA, DType::BF16, {P});
  s.m.zero();
  s.v.zero();
  s.grads.zero();
  // Views by name over the bf16 weights and the fp32 gradients.
  std::map<std::string, const ParamSpec*> by_name;
  for (const ParamSpec& p : layout) by_name[p.name] = &p;
  auto bind = [&](const std::string& name, Tensor& wt, Tensor& gt) {
    auto it = by_name.find(name);
    DF_CHECK(it != by_name.end(), Internal, "drafter step (CUDA): no parameter " << name << " in the layout");
    const ParamSpec& p = *it->second;
    wt = Tensor(static_cast<uint16_t*>(s.pbf.t().data) + p.offset, DType::BF16, Device::CUDA, {1});
    gt = Tensor(static_cast<float*>(s.grads.t().data) + p.offset, DType::F32, Device::CUDA, {1});
    wt.ndim = gt.ndim = static_cast<int>(p.shape.size());
    for (size_t d = 0; d < p.shape.size(); ++d) wt.shape[d] = gt.shape[d] = p.shape[d];
  };
  bind("fc.weight", s.w.fc, s.g.fc);
  bind("hidden_norm.weight", s.w.hidden_norm, s.g.hidden_norm);
  bind("norm.weight", s.w.norm, s.g.norm);
  s.w.layers.resize(static_cast<size_t>(L.num_hidden_layers));
  s.g.layers.resize(s.w.layers.size());
  for (size_t l = 0; l < s.w.layers.size(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerW &a = s.w.layers[l], &d = s.g.layers[l];
    bind(p + "input_layernorm.weight", a.input_norm, d.input_norm);
    bind(p + "self_attn.q_proj.weight", a.q_proj, d.q_proj);
    bind(p + "self_attn.k_proj.weight", a.k_proj, d.k_proj);
    bind(p + "self_attn.v_proj.weight", a.v_proj, d.v_proj);
    bind(p + "self_attn.o_proj.weight", a.o_proj, d.o_proj);
    bind(p + "self_attn.q_norm.weight", a.q_norm, d.q_norm);
    bind(p + "self_attn.k_norm.weight", a.k_norm, d.k_norm);
    bind(p + "post_attention_layernorm.weight", a.post_norm, d.post_norm);
    bind(p + "mlp.gate_proj.weight", a.gate_proj, d.gate_proj);
    bind(p + "mlp.up_proj.weight", a.up_proj, d.up_proj);
    bind(p + "mlp.down_proj.weight", a.down_proj, d.down_proj);
  }
  const int64_t T = s.max_T, NB = s.max_NB, H = s.H;
  s.x_ctx = s.bf(T, s.K * H);
  s.fc_out = s.bf(T, H);
  s.th = s.bf(T, H);
  s.rstd_h = s.f32(T);
  s.pos_ctx = s.i32(T);
  s.block_ids = s.i32(NB);
  s.pos_blk = s.i32(NB);
  s.anchors = s.i32(s.max_N);
  s.seq_begin = s.i32(s.max_N);
  s.x0 = s.bf(NB, H);
  s.layers.resize(s.w.layers.size());
  for (LayerActs& a : s.layers) {
    a.kc_raw = s.bf(T, s.KV);
    a.kc = s.bf(T, s.KV);
    a.kc_rstd = s.f32(T * s.nkv);
    a.vc = s.bf(T, s.KV);
    a.x_in = s.bf(NB, H);
    a.xn = s.bf(NB, H);
    a.rstd1 = s.f32(NB);
    a.q_raw = s.bf(NB, s.QD);
    a.q = s.bf(NB, s.QD);
    a.q_rstd = s.f32(NB * s.nh);
    a.kb_raw = s.bf(NB, s.KV);
    a.kb = s.bf(NB, s.KV);
    a.kb_rstd = s.f32(NB * s.nkv);
    a.vb = s.bf(NB, s.KV);
    a.attn = s.bf(NB, s.QD);
    a.lse = s.f32(NB * s.nh);
    a.x2 = s.bf(NB, H);
    a.xn2 = s.bf(NB, H);
    a.rstd2 = s.f32(NB);
    a.g = s.bf(NB, s.I);
    a.u = s.bf(NB, s.I);
    a.act = s.bf(NB, s.I);
  }
  s.x_last = s.bf(NB, H);
  s.h_final = s.bf(NB, H);
  s.rstd_f = s.f32(NB);
  const int64_t R = s.max_R;
  s.h_rows = s.bf(R, H);
  s.t_rows = s.bf(R, H);
  s.dh_rows = s.bf(R, H);
  s.row_idx = s.i32(R);
  s.teacher_idx = s.i32(R);
  s.labels = s.i32(R);
  s.row_w = s.f32(R);
  s.loss_r = s.f32(R);
  s.kl_r = s.f32(R);
  s.am_q = s.i32(R);
  s.am_p = s.i32(R);
  s.workspace = s.f32(s.chunk_rows * s.V * 2);  // = ops::lm_loss_workspace_floats(chunk_rows, V, true), kept
  // inline: this library links before dflash_core and must not pull objects from it
  s.dx = s.bf(NB, H);
  s.dtmp = s.bf(NB, H);
  s.dxn = s.bf(NB, H);
  s.d_act = s.bf(NB, s.I);
  s.dg = s.bf(NB, s.I);
  s.du = s.bf(NB, s.I);
  s.d_attn = s.bf(NB, s.QD);
  s.dq = s.bf(NB, s.QD);
  s.dq_raw = s.bf(NB, s.QD);
  s.dkb = s.bf(NB, s.KV);
  s.dvb = s.bf(NB, s.KV);
  s.dkb_raw = s.bf(NB, s.KV);
  s.dkc = s.bf(T, s.KV);
  s.dvc = s.bf(T, s.KV);
  s.dkc_raw = s.bf(T, s.KV);
  s.d_th = s.bf(T, H);
  s.d_fc = s.bf(T, H);
  s.d_out = s.bf(NB, H);
}

DrafterStepCuda::~DrafterStepCuda() { delete impl_; }
const Tensor& DrafterStepCuda::params() const { return impl_->params.t(); }
const Tensor& DrafterStepCuda::grads() const { return impl_->grads.t(); }
const Tensor& DrafterStepCuda::params_bf16() const { return impl_->pbf.t(); }
const Tensor& DrafterStepCuda::adam_m() const { return impl_->m.t(); }
const Tensor& DrafterStepCuda::adam_v() const { return impl_->v.t(); }
Tensor DrafterStepCuda::hidden() const { return Impl::v2(impl_->h_final, impl_->NB, impl_->H); }

void DrafterStepCuda::reset_from_params() {
  Impl& s = *impl_;
  const int64_t P = static_cast<int64_t>(s.P);
  f32_to_bf16_kernel<<<grid_of(s.ctx, P), 256, 0, stream_of(s.ctx)>>>(static_cast<__nv_bfloat16*>(s.pbf.t().data),
                                                                static_cast<const float*>(s.params.t().data), P);
  DF_CUDA_LAUNCH();
  DF_CUDA(cudaMemsetAsync(s.m.t().data, 0, s.m.t().nbytes(), stream_of(s.ctx)));
  DF_CUDA(cudaMemsetAsync(s.v.t().data, 0, s.v.t().nbytes(), stream_of(s.ctx)));
}

void DrafterStepCuda::set_frozen(const Tensor& embed, const Tensor& lm_head) {
  Impl& s = *impl_;
  for (const Tensor* t : {&embed, &lm_head})
    DF_CHECK(t->device == Device::CUDA && t->dtype == DType::BF16 && t->ndim == 2 && t->shape[0] == s.V &&
                 t->shape[1] == s.H,
             Internal, "drafter step (CUDA): embed/lm_head must be BF16 [" << s.V << ", " << s.H << "] on the device");
  s.embed = embed;
  s.lm_head = lm_head;
}

Tensor DrafterStepCuda::Impl::forward(const DrafterStepBatch& b) {
  const int64_t Tn = b.features.shape[1];
  DF_CHECK(b.features.ndim == 3 && b.features.shape[0] == K && b.features.shape[2] == H && b.features.dtype == DType::BF16,
           Internal, "drafter step (CUDA): features " << b.features.shape_str() << ", expected BF16 [" << K << ", T, " << H << "]");
  const int64_t Nn = static_cast<int64_t>(b.anchors.size());
  DF_CHECK(Tn <= max_T && Nn <= max_N && Nn > 0, Internal,
           "drafter step (CUDA): " << Tn << " tokens / " << Nn << " anchors exceed " << max_T << " / " << max_N);
  DF_CHECK(H % 8 == 0 && QD % 8 == 0 && KV % 8 == 0 && I % 8 == 0, Internal, "drafter step (CUDA): widths must be multiples of 8");
  T = Tn;
  N = Nn;
  NB = N * B;
  cudaStream_t st = stream_of(ctx);
  mark(Phase::Other);
  // ---- context: x_ctx [T, K*H]; th = hidden_norm(fc(x_ctx))
  const int H8 = static_cast<int>(H / 8);
  gather_features_kernel<<<grid_of(ctx, T * K * H8), 256, 0, st>>>(static_cast<Bf16x8*>(x_ctx.t().data),
                                                               static_cast<const Bf16x8*>(b.features.data), T, int(K), H8);
  DF_CUDA_LAUNCH();
  Tensor xc = v2(x_ctx, T, K * H), fco = v2(fc_out, T, H), thv = v2(th, T, H);
  cuda::matmul_forward(ctx, fco, xc, w.fc, ops::Accumulate::No);
  cuda::rmsnorm_forward(ctx, thv, v1(rstd_h, T), fco, w.hidden_norm, eps);
  // Training noise on th; the backward needs no record of it (hidden_norm's backward reads fc_out).
  if (b.noise_std > 0.f) add_feature_noise(ctx, thv, b.noise_std, b.noise_seed, b.noise_counter);
  // ---- index inputs (host-built, uploaded)
  upload_i32(pos_ctx, b.ctx_pos);
  upload_i32(anchors, b.anchors);
  upload_i32(seq_begin, b.seq_begin);
  anchors_host = b.anchors;
  seq_begin_host = b.seq_begin;
  std::vector<int32_t> ids(static_cast<size_t>(NB)), pb(static_cast<size_t>(NB));
  for (int64_t n = 0; n < N; ++n) {
    const int32_t a = b.anchors[n];
    for (int64_t o = 0; o < B; ++o) {
      ids[n * B + o] = o == 0 ? b.tokens[a] : c.mask_token_id;
      pb[n * B + o] = b.ctx_pos[a] + static_cast<int32_t>(o);
    }
  }
  upload_i32(block_ids, ids);
  upload_i32(pos_blk, pb);
  Tensor posc = v1(pos_ctx, T), posb = v1(pos_blk, NB), an = v1(anchors, N), sb = v1(seq_begin, N);
  Tensor x = v2(x0, NB, H);
  cuda::embedding_forward(ctx, x, v1(block_ids, NB), embed);
  // ---- layers
  for (size_t li = 0; li < layers.size(); ++li) {
    LayerActs& a = layers[li];
    const LayerW& lw = w.layers[li];
    Tensor x_in = v2(a.x_in, NB, H);
    mark(Phase::Other);
    copy(x_in, x);
    Tensor xn = v2(a.xn, NB, H);
    mark(Phase::Other);
    cuda::rmsnorm_forward(ctx, xn, v1(a.rstd1, NB), x_in, lw.input_norm, eps);
    Tensor q_raw = v2(a.q_raw, NB, QD), q = v3(a.q, NB, nh, hd);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, q_raw, xn, lw.q_proj, ops::Accumulate::No);
    mark(Phase::Other);
    cuda::head_norm_rope_forward(ctx, q, v2(a.q_rstd, NB, nh), v3(a.q_raw, NB, nh, hd), lw.q_norm, posb, rope, eps);
    Tensor kb_raw = v2(a.kb_raw, NB, KV), kb = v3(a.kb, NB, nkv, hd), vb = v2(a.vb, NB, KV);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, kb_raw, xn, lw.k_proj, ops::Accumulate::No);
    mark(Phase::Other);
    cuda::head_norm_rope_forward(ctx, kb, v2(a.kb_rstd, NB, nkv), v3(a.kb_raw, NB, nkv, hd), lw.k_norm, posb, rope, eps);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, vb, xn, lw.v_proj, ops::Accumulate::No);
    Tensor kc_raw = v2(a.kc_raw, T, KV), kc = v3(a.kc, T, nkv, hd), vc = v2(a.vc, T, KV);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, kc_raw, thv, lw.k_proj, ops::Accumulate::No);
    mark(Phase::Other);
    cuda::head_norm_rope_forward(ctx, kc, v2(a.kc_rstd, T, nkv), v3(a.kc_raw, T, nkv, hd), lw.k_norm, posc, rope, eps);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, vc, thv, lw.v_proj, ops::Accumulate::No);
    Tensor attn = v3(a.attn, NB, nh, hd);
    mark(Phase::Attention);
    cuda::block_attention_forward(ctx, attn, v2(a.lse, NB, nh), q, kc, v3(a.vc, T, nkv, hd), kb, v3(a.vb, NB, nkv, hd),
                                  an, sb, anchors_host, seq_begin_host, attn_spec(li));
    Tensor x2 = v2(a.x2, NB, H);
    mark(Phase::Other);
    copy(x2, x_in);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, x2, v2(a.attn, NB, QD), lw.o_proj, ops::Accumulate::Yes);
    Tensor xn2 = v2(a.xn2, NB, H);
    mark(Phase::Other);
    cuda::rmsnorm_forward(ctx, xn2, v1(a.rstd2, NB), x2, lw.post_norm, eps);
    Tensor gt = v2(a.g, NB, I), ut = v2(a.u, NB, I), act = v2(a.act, NB, I);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, gt, xn2, lw.gate_proj, ops::Accumulate::No);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, ut, xn2, lw.up_proj, ops::Accumulate::No);
    mark(Phase::Other);
    cuda::swiglu_forward(ctx, act, gt, ut);
    x = li + 1 < layers.size() ? v2(layers[li + 1].x_in, NB, H) : v2(x_last, NB, H);
    mark(Phase::Other);
    copy(x, x2);
    mark(Phase::Gemm);
    cuda::matmul_forward(ctx, x, act, lw.down_proj, ops::Accumulate::Yes);
  }
  Tensor hf = v2(h_final, NB, H);
  cuda::rmsnorm_forward(ctx, hf, v1(rstd_f, NB), x, w.norm, eps);
  return hf;
}

void DrafterStepCuda::Impl::backward(const Tensor& d_outv, const GradReady& ready) {
  Tensor dxv = v2(dx, NB, H), dtmpv = v2(dtmp, NB, H), dxnv = v2(dxn, NB, H);
  Tensor xl = layers.empty() ? v2(x0, NB, H) : v2(x_last, NB, H);
  cuda::rmsnorm_backward(ctx, dxv, g.norm, d_outv, xl, w.norm, v1(rstd_f, NB));
  final(ready, g.norm);
  Tensor thv = v2(th, T, H), d_thv = v2(d_th, T, H);
  bool th_written = false;
  Tensor posc = v1(pos_ctx, T), posb = v1(pos_blk, NB), an = v1(anchors, N), sb = v1(seq_begin, N);
  for (size_t li = layers.size(); li-- > 0;) {
    LayerActs& a = layers[li];
    const LayerW& lw = w.layers[li];
    const LayerW& lg = g.layers[li];
    // ---- MLP (dx is the gradient at this layer's output)
    Tensor gt = v2(a.g, NB, I), ut = v2(a.u, NB, I), act = v2(a.act, NB, I);
    Tensor d_actv = v2(d_act, NB, I), dgv = v2(dg, NB, I), duv = v2(du, NB, I);
    Tensor xn2 = v2(a.xn2, NB, H), x2 = v2(a.x2, NB, H);
    mark(Phase::Gemm);
    linear_din(d_actv, dxv, lw.down_proj, false);
    mark(Phase::Gemm);
    linear_dw(lg.down_proj, dxv, act, lw.down_proj);
    final(ready, lg.down_proj);
    mark(Phase::Other);
    cuda::swiglu_backward(ctx, dgv, duv, d_actv, gt, ut);
    mark(Phase::Gemm);
    linear_din(dxnv, dgv, lw.gate_proj, false);
    mark(Phase::Gemm);
    linear_din(dxnv, duv, lw.up_proj, true);
    mark(Phase::Gemm);
    linear_dw(lg.gate_proj, dgv, xn2, lw.gate_proj);
    final(ready, lg.gate_proj);
    mark(Phase::Gemm);
    linear_dw(lg.up_proj, duv, xn2, lw.up_proj);
    final(ready, lg.up_proj);
    mark(Phase::Other);
    cuda::rmsnorm_backward(ctx, dtmpv, lg.post_norm, dxnv, x2, lw.post_norm, v1(a.rstd2, NB));
    final(ready, lg.post_norm);
    mark(Phase::Other);
    add(dxv, dtmpv);  // dx is now the gradient at x2
    // ---- attention
    Tensor d_attnv = v3(d_attn, NB, nh, hd);
    mark(Phase::Gemm);
    linear_din(d_attnv, dxv, lw.o_proj, false);
    mark(Phase::Gemm);
    linear_dw(lg.o_proj, dxv, v2(a.attn, NB, QD), lw.o_proj);
    final(ready, lg.o_proj);
    Tensor q = v3(a.q, NB, nh, hd), kb = v3(a.kb, NB, nkv, hd), kc = v3(a.kc, T, nkv, hd);
    Tensor vb = v3(a.vb, NB, nkv, hd), vc = v3(a.vc, T, nkv, hd);
    Tensor dqv = v3(dq, NB, nh, hd), dkbv = v3(dkb, NB, nkv, hd), dvbv = v3(dvb, NB, nkv, hd);
    Tensor dkcv = v3(dkc, T, nkv, hd), dvcv = v3(dvc, T, nkv, hd);
    mark(Phase::Attention);
    cuda::block_attention_backward(ctx, dqv, dkcv, dvcv, dkbv, dvbv, d_attnv, v3(a.attn, NB, nh, hd),
                                   v2(a.lse, NB, nh), q, kc, vc, kb, vb, an, sb, anchors_host, seq_begin_host,
                                   attn_spec(li));
    Tensor dq_rawv = v3(dq_raw, NB, nh, hd);
    mark(Phase::Other);
    cuda::head_norm_rope_backward(ctx, dq_rawv, lg.q_norm, dqv, v3(a.q_raw, NB, nh, hd), lw.q_norm,
                                  v2(a.q_rstd, NB, nh), posb, rope, eps);
    final(ready, lg.q_norm);
    Tensor dkb_rawv = v3(dkb_raw, NB, nkv, hd);
    mark(Phase::Other);
    cuda::head_norm_rope_backward(ctx, dkb_rawv, lg.k_norm, dkbv, v3(a.kb_raw, NB, nkv, hd), lw.k_norm,
                                  v2(a.kb_rstd, NB, nkv), posb, rope, eps);
    Tensor dkc_rawv = v3(dkc_raw, T, nkv, hd);
    mark(Phase::Other);
    cuda::head_norm_rope_backward(ctx, dkc_rawv, lg.k_norm, dkcv, v3(a.kc_raw, T, nkv, hd), lw.k_norm,
                                  v2(a.kc_rstd, T, nkv), posc, rope, eps);
    final(ready, lg.k_norm);
    // block side: dxn = dq_raw Wq + dkb_raw Wk + dvb Wv (accumulated by the GEMMs)
    Tensor xn = v2(a.xn, NB, H);
    mark(Phase::Gemm);
    linear_din(dxnv, dq_rawv, lw.q_proj, false);
    mark(Phase::Gemm);
    linear_din(dxnv, dkb_rawv, lw.k_proj, true);
    mark(Phase::Gemm);
    linear_din(dxnv, dvbv, lw.v_proj, true);
    mark(Phase::Gemm);
    linear_dw(lg.q_proj, dq_rawv.reshape({NB, QD}), xn, lw.q_proj);
    final(ready, lg.q_proj);
    mark(Phase::Gemm);
    linear_dw(lg.k_proj, dkb_rawv.reshape({NB, KV}), xn, lw.k_proj);
    mark(Phase::Gemm);
    linear_dw(lg.v_proj, dvbv.reshape({NB, KV}), xn, lw.v_proj);
    // context side: d_th += dkc_raw Wk + dvc Wv
    mark(Phase::Gemm);
    linear_din(d_thv, dkc_rawv, lw.k_proj, th_written);
    mark(Phase::Gemm);
    linear_din(d_thv, dvcv, lw.v_proj, true);
    th_written = true;
    mark(Phase::Gemm);
    linear_dw(lg.k_proj, dkc_rawv.reshape({T, KV}), thv, lw.k_proj);
    mark(Phase::Gemm);
    linear_dw(lg.v_proj, dvcv.reshape({T, KV}), thv, lw.v_proj);
    final(ready, lg.k_proj);
    final(ready, lg.v_proj);
    // input_layernorm; the residual carries dx through
    mark(Phase::Other);
    cuda::rmsnorm_backward(ctx, dtmpv, lg.input_norm, dxnv, v2(a.x_in, NB, H), lw.input_norm, v1(a.rstd1, NB));
    final(ready, lg.input_norm);
    mark(Phase::Other);
    add(dxv, dtmpv);
  }
  if (!th_written) DF_CUDA(cudaMemsetAsync(d_thv.data, 0, d_thv.nbytes(), stream_of(ctx)));
  Tensor d_fcv = v2(d_fc, T, H);
  cuda::rmsnorm_backward(ctx, d_fcv, g.hidden_norm, d_thv, v2(fc_out, T, H), w.hidden_norm, v1(rstd_h, T));
  final(ready, g.hidden_norm);
  linear_dw(g.fc, d_fcv, v2(x_ctx, T, K * H), w.fc);
  final(ready, g.fc);
}

void DrafterStepCuda::Impl::loss_rows(const DrafterStepBatch& b, const Tensor& hf, ops::LossObjective objective,
                                      bool grad) {
  R = static_cast<int64_t>(b.row_block.size());
  DF_CHECK(R <= max_R && b.row_label.size() == size_t(R) && b.row_weight.size() == size_t(R) &&
               b.row_teacher.size() == size_t(R),
           Internal, "drafter step (CUDA): " << R << " loss rows (capacity " << max_R << ") or ragged row vectors");
  if (R == 0) return;
  cudaStream_t st = stream_of(ctx);
  mark(Phase::Loss);
  const bool kl = objective == ops::LossObjective::KL;
  DF_CHECK(!kl || !b.final_norm.empty(), Internal, "drafter step (CUDA): the KL objective needs final_norm");
  have_teacher = !b.final_norm.empty();
  upload_i32(row_idx, b.row_block);
  upload_i32(labels, b.row_label);
  if (grad) {
    double wsum = 0;
    for (float x : b.row_weight) wsum += x;
    std::vector<float> wn(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) wn[r] = static_cast<float>(b.row_weight[r] / wsum);
    copy_bytes(ctx, row_w.t().data, wn.data(), sizeof(float) * wn.size());
  }
  const int H8 = static_cast<int>(H / 8);
  move_rows_kernel<<<grid_of(ctx, R * H8), 256, 0, st>>>(static_cast<Bf16x8*>(h_rows.t().data),
                                                    static_cast<const Bf16x8*>(hf.data),
                                                    static_cast<const int32_t*>(row_idx.t().data), R, H8, false);
  DF_CUDA_LAUNCH();
  Tensor teacher;
  if (have_teacher) {
    upload_i32(teacher_idx, b.row_teacher);
    move_rows_kernel<<<grid_of(ctx, R * H8), 256, 0, st>>>(static_cast<Bf16x8*>(t_rows.t().data),
                                                      static_cast<const Bf16x8*>(b.final_norm.data),
                                                      static_cast<const int32_t*>(teacher_idx.t().data), R, H8, false);
    DF_CUDA_LAUNCH();
    teacher = v2(t_rows, R, H);
  }
  ops::LmLossRowsOut lo;
  lo.ce = v1(loss_r, R);
  lo.kl = kl ? v1(kl_r, R) : Tensor();
  lo.argmax_q = v1(am_q, R);
  lo.argmax_p = have_teacher ? v1(am_p, R) : Tensor();
  cuda::lm_loss_forward(ctx, lo, v2(h_rows, R, H), lm_head, v1(labels, R), teacher,
                        v1(workspace, static_cast<int64_t>(workspace.numel())), chunk_rows,
                        grad ? v2(dh_rows, R, H) : Tensor(), grad ? v1(row_w, R) : Tensor(), objective);
}

void DrafterStepCuda::Impl::download_rows(const DrafterStepBatch& b, ops::LossObjective objective,
                                          DrafterStepResult& res) {
  if (R == 0) return;
  res.row_loss.resize(static_cast<size_t>(R));
  res.row_ce.resize(static_cast<size_t>(R));
  res.argmax_q.resize(static_cast<size_t>(R));
  res.argmax_p.resize(have_teacher ? static_cast<size_t>(R) : 0);
  copy_bytes(ctx, res.row_ce.data(), loss_r.t().data, sizeof(float) * R);
  if (objective == ops::LossObjective::KL)
    copy_bytes(ctx, res.row_loss.data(), kl_r.t().data, sizeof(float) * R);
  else
    res.row_loss = res.row_ce;
  copy_bytes(ctx, res.argmax_q.data(), am_q.t().data, sizeof(int32_t) * R);
  if (have_teacher) copy_bytes(ctx, res.argmax_p.data(), am_p.t().data, sizeof(int32_t) * R);
  double num = 0, wsum = 0;
  for (int64_t r = 0; r < R; ++r) {
    num += static_cast<double>(b.row_weight[r]) * res.row_loss[r];
    wsum += b.row_weight[r];
  }
  res.weight_sum = wsum;
  res.loss = num / wsum;
}

void DrafterStepCuda::Impl::backward_from_rows(const GradReady& ready) {
  cudaStream_t st = stream_of(ctx);
  Tensor d_outv = v2(d_out, NB, H);
  DF_CUDA(cudaMemsetAsync(d_outv.data, 0, d_outv.nbytes(), st));
  const int H8 = static_cast<int>(H / 8);
  move_rows_kernel<<<grid_of(ctx, R * H8), 256, 0, st>>>(static_cast<Bf16x8*>(d_outv.data),
                                                    static_cast<const Bf16x8*>(dh_rows.t().data),
                                                    static_cast<const int32_t*>(row_idx.t().data), R, H8, true);
  DF_CUDA_LAUNCH();
  backward(d_outv, ready);
}

DrafterStepResult DrafterStepCuda::forward_backward(const DrafterStepBatch& b, ops::LossObjective objective,
                                                   const GradReady& ready) {
  Impl& s = *impl_;
  DF_CHECK(!s.embed.empty(), Internal, "drafter step (CUDA): set_frozen() first");
  s.mark(Phase::Other);
  DF_CUDA(cudaMemsetAsync(s.grads.t().data, 0, s.grads.t().nbytes(), stream_of(s.ctx)));
  Tensor hf = s.forward(b);
  DrafterStepResult res;
  s.loss_rows(b, hf, objective, true);
  if (s.R == 0) return res;
  s.backward_from_rows(ready);
  s.mark(Phase::Count);  // closes the last interval
  s.download_rows(b, objective, res);  // after the backward is enqueued: no bubble before it
  return res;
}

DrafterStepResult DrafterStepCuda::forward_loss(const DrafterStepBatch& b, ops::LossObjective objective) {
  Impl& s = *impl_;
  DF_CHECK(!s.embed.empty(), Internal, "drafter step (CUDA): set_frozen() first");
  s.mark(Phase::Other);
  Tensor hf = s.forward(b);
  DrafterStepResult res;
  s.loss_rows(b, hf, objective, false);
  s.mark(Phase::Count);
  s.download_rows(b, objective, res);
  return res;
}

void DrafterStepCuda::backward_rows(const std::vector<float>& row_weight, ops::LossObjective objective,
                                    const GradReady& ready) {
  Impl& s = *impl_;
  DF_CHECK(static_cast<int64_t>(row_weight.size()) == s.R, Internal,
           "drafter step (CUDA): " << row_weight.size() << " row weights for the last forward's " << s.R << " rows");
  DF_CHECK(objective != ops::LossObjective::KL || s.have_teacher, Internal,
           "drafter step (CUDA): the KL objective needs final_norm");
  cudaStream_t st = stream_of(s.ctx);
  s.mark(Phase::Other);
  DF_CUDA(cudaMemsetAsync(s.grads.t().data, 0, s.grads.t().nbytes(), st));
  if (s.R == 0) return;
  s.mark(Phase::Loss);
  copy_bytes(s.ctx, s.row_w.t().data, row_weight.data(), sizeof(float) * row_weight.size());
  const Tensor teacher = s.have_teacher ? Impl::v2(s.t_rows, s.R, s.H) : Tensor();
  cuda::lm_loss_backward(s.ctx, Impl::v2(s.dh_rows, s.R, s.H), Impl::v1(s.row_w, s.R), objective,
                         Impl::v2(s.h_rows, s.R, s.H), s.lm_head, Impl::v1(s.labels, s.R), teacher,
                         Impl::v1(s.workspace, static_cast<int64_t>(s.workspace.numel())), s.chunk_rows);
  s.backward_from_rows(ready);
  s.mark(Phase::Count);
}

double DrafterStepCuda::optimizer_step(const ops::AdamWHyper& hyper, int64_t step, float clip) {
  Impl& s = *impl_;
  s.mark(Phase::Optimizer);
  cuda::clip_adamw_step(s.ctx, s.params.t(), s.grads.t(), s.m.t(), s.v.t(), hyper, step, clip, s.pbf.t());
  s.mark(Phase::Count);
  return last_grad_norm(s.ctx);
}

void DrafterStepCuda::set_profiling(bool on) { impl_->profiling = on; }

std::vector<double> DrafterStepCuda::phase_ms() {
  Impl& s = *impl_;
  DF_CUDA(cudaStreamSynchronize(stream_of(s.ctx)));
  for (size_t i = 0; i + 1 < s.phases.size(); ++i) {
    if (s.phases[i] >= static_cast<int>(Phase::Count)) continue;
    float ms = 0.f;
    DF_CUDA(cudaEventElapsedTime(&ms, s.event_pool[i], s.event_pool[i + 1]));
    s.phase_sum[s.phases[i]] += ms;
  }
  s.phases.clear();
  std::vector<double> out = s.phase_sum;
  std::fill(s.phase_sum.begin(), s.phase_sum.end(), 0.0);
  return out;
}

}  // namespace dflash::cuda
