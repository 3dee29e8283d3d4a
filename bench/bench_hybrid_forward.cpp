// Times the CUDA forward of the Qwen3.5 / Qwen3.6 hybrid target (Gated DeltaNet + gated full attention,
// random bf16 weights) over a packed batch, the way a target rank runs it: embedding, decoder layers
// through the op layer (include/dflash/ops.h, src/ops/gated_delta.h), captured layer outputs written
// straight into a send buffer [k, T, H] and the final norm into its own slot.
//
// The weights are random (device-side fill), so no checkpoint is read: a 27B checkpoint would not fit the
// GPU machine's disk. The shape is written as a config.json object and parsed by parse_qwen35_config, so
// the layer kinds (full attention every full_attention_interval-th layer), the GDN head layout and the
// partial-RoPE rotary dim come from the same code as the real target's. The op sequence is the one
// Qwen35Target::forward (src/model/qwen35_target.cpp) runs, and the layer stack with its capture slots is
// the model's own capture_stack_forward. Buffers are those of Qwen35Target and its DecoderStackTarget
// (src/model/decoder_stack.h), allocated once.
//
//   bench_hybrid_forward --model 27b                                  (8 x 4096, capture 1,16,31,46,61 + final)
//   bench_hybrid_forward --model 27b --seqlens 4096,4096 --capture 1,16,31,46,61
//   bench_hybrid_forward --model tiny-hybrid --mixed                  (smoke: every op, uneven packing)
//   bench_hybrid_forward --model 27b --dry-run                        (no GPU: the shape and memory plan only)
//   bench_hybrid_forward --model 27b --fp8      (the linears as block-scaled FP8 GEMMs: an FP8 target on sm_90;
//                                               elsewhere, or with DFLASH_FP8_LINEAR=dequant, dequantized per GEMM)
//   bench_hybrid_forward --model 27b --fp8 --fp8-scaling token   (compressed-tensors FP8-Dynamic's per token x
//                                               per channel GEMMs, the norms and the SwiGLU writing the codes;
//                                               --fp8-token-quant per-linear: each linear quantizing its input)
//   options: --iters N (5), --warmup N (2), --no-lm-head (skip the unused lm_head allocation),
//            --no-final-norm (a CE job's forward: stops after the last capture),
//            --json (one JSON line per case instead of the rows; bench/README.md, "Output format")
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_common.h"
#include "bench_fp8.h"
#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/hf_config.h"
#include "dflash/ops.h"
#include "dflash/target.h"
#include "model/capture_stack.h"
#include "model/qwen35_config.h"
#include "model/qwen35_weights.h"
#include "model/scratch_plan.h"
#include "ops/gated_delta.h"
#include "random_fill.cuh"

using namespace dflash;
using bench::median;
using bench::parse_ints;
using nlohmann::json;

namespace {

// A model shape as the text part of its config.json. layer_types is left out on purpose: the parser then
// derives the kinds from full_attention_interval as HF does (Qwen3.6-27B: 3 linear, then 1 full, repeated).
struct Shape {
  const char* name;
  json config;
};

json hybrid_config(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t nh, int64_t nkv,
                   int64_t hd, int64_t gdn_nk, int64_t gdn_nv, int64_t gdn_d) {
  return json{{"architectures", json::array({"Qwen3_5ForCausalLM"})},
              {"model_type", "qwen3_5_text"},
              {"vocab_size", vocab},
              {"hidden_size", hidden},
              {"intermediate_size", inter},
              {"num_hidden_layers", layers},
              {"num_attention_heads", nh},
              {"num_key_value_heads", nkv},
              {"head_dim", hd},
              {"hidden_act", "silu"},
              {"attn_output_gate", true},
              {"rms_norm_eps", 1e-6},
              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}}},
              {"full_attention_interval", 4},
              {"linear_conv_kernel_dim", 4},
              {"linear_num_key_heads", gdn_nk},
              {"linear_num_value_heads", gdn_nv},
              {"linear_key_head_dim", gdn_d},
              {"linear_value_head_dim", gdn_d},
              {"tie_word_embeddings", false}};
}

// Qwen3.6-27B (text): 64 layers = 48 GDN + 16 full attention. tiny-hybrid keeps the per-head sizes of
// 27B (GDN 128, attention 256, rotary 64) so a smoke run goes through the same kernels, with few heads
// and layers (8 = 6 GDN + 2 full).
std::vector<Shape> shapes() {
  return {{"27b", hybrid_config(248320, 5120, 17408, 64, 24, 4, 256, 16, 48, 128)},
          {"tiny-hybrid", hybrid_config(4096, 512, 1024, 8, 4, 2, 256, 2, 4, 128)}};
}

// Where time goes: each op is bracketed by events when `on` is set (one instrumented pass). The parts
// are fine-grained; the report sums them into GEMMs / GDN / attention / rest.
enum class Part {
  GemmGdn,       // in_proj_qkv, in_proj_z/b/a, out_proj
  GemmAttn,      // q/gate/k/v, o_proj
  GemmMlp,       // fused gate|up, down (accumulating)
  Conv,          // causal_conv1d_silu
  Gates,         // gdn_gates
  DeltaRule,     // gated_delta_rule
  GatedNorm,     // gated_rmsnorm per value head
  HeadNormRope,  // q/k head RMSNorm + partial RoPE
  Attention,     // attention_varlen_causal
  SigmoidGate,   // attention output gate
  Embedding,
  Norms,         // input RMSNorm, residual add + post-attention RMSNorm
  Swiglu,
};

struct Timer {
  bool on = false;
  cudaStream_t stream = nullptr;
  size_t min_free = SIZE_MAX;  // lowest cudaMemGetInfo free seen after an op of the instrumented pass
  std::vector<std::pair<Part, std::pair<cudaEvent_t, cudaEvent_t>>> marks;
  std::vector<int> counts;  // op calls per mark
  size_t next = 0;
  // One bracket around `nops` op calls of part p.
  template <class F> void run(Part p, int nops, F&& f) {
    if (!on) return f();
    if (next == marks.size()) {
      cudaEvent_t a, b;
      BENCH_CUDA(cudaEventCreate(&a));
      BENCH_CUDA(cudaEventCreate(&b));
      marks.push_back({p, {a, b}});
      counts.push_back(0);
    }
    counts[next] = nops;
    auto& m = marks[next++];
    m.first = p;
    BENCH_CUDA(cudaEventRecord(m.second.first, stream));
    f();
    BENCH_CUDA(cudaEventRecord(m.second.second, stream));
    // cudaMalloc is synchronous on the host, so a buffer an op allocated and still holds shows here.
    size_t free = 0, total = 0;
    BENCH_CUDA(cudaMemGetInfo(&free, &total));
    min_free = std::min(min_free, free);
  }
  // Per part: total ms and number of op calls.
  std::map<Part, std::pair<double, int>> totals() {
    std::map<Part, std::pair<double, int>> t;
    for (size_t i = 0; i < next; ++i) {
      float ms = 0;
      BENCH_CUDA(cudaEventElapsedTime(&ms, marks[i].second.first, marks[i].second.second));
      t[marks[i].first].first += ms;
      t[marks[i].first].second += counts[i];
    }
    next = 0;
    return t;
  }
};

size_t bytes_of(DType t, std::initializer_list<int64_t> dims) {
  size_t n = dtype_size(t);
  for (int64_t d : dims) n *= static_cast<size_t>(d);
  return n;
}
Tensor rows(const Tensor& b, int64_t T) { return b.slice_rows(0, T); }

struct Model {
  Qwen35Config cfg;
  Ctx ctx;
  Qwen35Weights w;
  CapturePlan plan;
  size_t weight_bytes = 0, lm_head_bytes = 0, act_bytes = 0;

  // The buffers of Qwen35Target and its DecoderStackTarget, same dtypes and shapes, for max_tokens rows.
  Buffer stream[2], x_norm;  // [T, H]
  Buffer work;               // the three phases' per-token activations below share it (model/scratch_plan.h)
  Tensor qkv, conv;          // [T, 2*nk*dk + nv*dv]
  Tensor z, core;            // [T, nv*dv]
  Tensor a, b;               // [T, nv] bf16
  Tensor g, beta;            // [T, nv] float32
  Buffer state;              // [nv, dk, dv] float32
  Buffer gdn_work;           // [gated_delta_rule_workspace_elems(T)] bf16, the delta rule's per-chunk inverses
  Tensor q, gate, attn;      // [T, nh*hd]
  Tensor k, v;               // [T, nkv*hd]
  Tensor mlp_gate_up;        // [T, 2I] the fused gate|up GEMM's output
  Tensor mlp_act;            // [T, I] silu(gate) * up
  Buffer tokens, pos, cu;    // [T], [T], [T + 1] I32
  bench::Fp8Scratch fp8;     // --fp8: the linears' activation codes and scales
  // --fp8-scaling token, fused (bench::TokenQuant): x's codes [N, H] and scales [N] (the norms'), as
  // DecoderStackTarget holds them; the SwiGLU's go into fp8's scratch (the stack's FP8 activation scratch)
  bool fused_token_quant = false;
  Buffer x_codes, x_scales;
  int64_t T = 0, ncu = 0;

  // dry: count the bytes only (no device needed), for --dry-run.
  Model(const Qwen35Config& c, const Ctx& ctx_, const std::vector<int>& capture, int64_t max_tokens, bool lm_head,
        bool dry, bench::ForwardOptions::Linears linears = bench::ForwardOptions::Linears::Bf16,
        bench::Fp8Path fp8_path = bench::Fp8Path::Gemm, ops::Fp8Scaling fp8_scaling = ops::Fp8Scaling::Block128,
        bench::TokenQuant token_quant = bench::TokenQuant::Fused)
      : cfg(c), ctx(ctx_) {
    const Qwen3Config& tc = cfg.text;
    plan = plan_captures(capture, tc.num_hidden_layers, "(random weights, --model)");
    uint64_t seed = 1;
    auto weight = [&](std::initializer_list<int64_t> dims, float mean, float std, DType dt = DType::BF16) {
      weight_bytes += bytes_of(dt, dims);
      if (dry) return Buffer();
      Buffer buf(Device::CUDA, dt, dims);
      cuda::fill_random(ctx, buf, seed++, mean, std);
      return buf;
    };
    // A frozen projection: in bf16 (LinearMode::Plain), as the target runs it without FP8; with --fp8 as
    // e4m3 codes + scales (LinearMode::Fp8Gemm, or Fp8Dequant), as an FP8 target runs it -- except
    // in_proj_a/b, which --target-precision fp8 leaves in bf16 (docs/fp8.md): `fp8_ok` false.
    bench::Fp8Weights w8;
    int64_t largest_fp8 = 0;  // the dequantize path's weight scratch
    auto linear = [&](std::initializer_list<int64_t> dims, float mean, float std, bool fp8_ok = true) {
      LinearWeight lw;
      const std::vector<int64_t> d(dims);
      if (linears == bench::ForwardOptions::Linears::Fp8 && fp8_ok) {
        lw.mode = fp8_path == bench::Fp8Path::Gemm ? LinearMode::Fp8Gemm : LinearMode::Fp8Dequant;
        largest_fp8 = std::max(largest_fp8, d[0] * d[1]);
        lw.act_group = fp8_scaling == ops::Fp8Scaling::TokenChannel ? 0 : fp8::kBlock;
        lw.gemm_scaling = fp8_scaling;
        weight_bytes += static_cast<size_t>(d[0] * d[1] + 4 * (d[1] / fp8::kBlock) * d[0]);
        if (!dry) {
          bench::Fp8Linear f = w8.make(ctx, d[0], d[1], std, 1);
          lw.fp8_codes = std::move(f.codes);
          lw.fp8_scales = std::move(f.scales);
        }
        return lw;
      }
      static_cast<Buffer&>(lw) = weight(dims, mean, std);
      return lw;
    };
    auto activation = [&](DType dt, std::initializer_list<int64_t> dims) {
      act_bytes += bytes_of(dt, dims);
      return dry ? Buffer() : Buffer(Device::CUDA, dt, dims);
    };
    const int64_t H = tc.hidden_size, I = tc.intermediate_size, V = tc.vocab_size;
    const int64_t nh = tc.num_attention_heads, nkv = tc.num_key_value_heads, hd = tc.head_dim;
    const ops::GdnHeads gh = cfg.gdn_heads();
    const int64_t K = cfg.linear_conv_kernel_dim;
    // Norm weights near 1 (stored as 1 + w, as the loader writes them), projections at HF's init scale;
    // A_log and dt_bias in float32 as the loader keeps them: exp(A_log) in [1, 16) like HF's init.
    w.embed_tokens = weight({V, H}, 0.f, 0.02f);
    w.norm = weight({H}, 1.f, 0.05f);
    if (lm_head) {  // not used by the forward, but the real target holds it (untied in Qwen3.6-27B)
      w.lm_head = weight({V, H}, 0.f, 0.02f);
      lm_head_bytes = bytes_of(DType::BF16, {V, H});
    }
    for (int l = 0; l < tc.num_hidden_layers; ++l) {
      Qwen35LayerWeights L;
      L.kind = cfg.kinds[l];
      L.input_layernorm = weight({H}, 1.f, 0.05f);
      if (L.kind == Qwen35LayerKind::LinearAttention) {
        Qwen35LinearAttnWeights& A = L.linear;
        A.in_proj_qkv = linear({gh.qkv_dim(), H}, 0.f, 0.02f);
        A.in_proj_z = linear({gh.value_dim(), H}, 0.f, 0.02f);
        A.in_proj_b = linear({gh.nv, H}, 0.f, 0.02f, false);
        A.in_proj_a = linear({gh.nv, H}, 0.f, 0.02f, false);
        A.conv1d = weight({gh.qkv_dim(), K}, 0.f, 0.3f);
        A.A_log = weight({gh.nv}, 1.4f, 0.8f, DType::F32);
        A.dt_bias = weight({gh.nv}, 1.f, 0.3f, DType::F32);
        A.norm = weight({gh.dv}, 1.f, 0.05f);
        A.out_proj = linear({H, gh.value_dim()}, 0.f, 0.02f);
      } else {
        Qwen35FullAttnWeights& A = L.attn;
        A.q_proj = linear({nh * hd, H}, 0.f, 0.02f);
        A.gate_proj = linear({nh * hd, H}, 0.f, 0.02f);
        A.k_proj = linear({nkv * hd, H}, 0.f, 0.02f);
        A.v_proj = linear({nkv * hd, H}, 0.f, 0.02f);
        A.o_proj = linear({H, nh * hd}, 0.f, 0.02f);
        A.q_norm = weight({hd}, 1.f, 0.05f);
        A.k_norm = weight({hd}, 1.f, 0.05f);
      }
      L.post_attention_layernorm = weight({H}, 1.f, 0.05f);
      L.gate_up_proj = linear({2 * I, H}, 0.f, 0.02f);  // gate_proj | up_proj rows, as the loader fuses them
      L.down_proj = linear({H, I}, 0.f, 0.02f);
      w.layers.push_back(std::move(L));
    }

    // Activations exactly as Qwen35Target's constructor sizes them.
    bool any_linear = false, any_full = false;
    for (Qwen35LayerKind kind : cfg.kinds) (kind == Qwen35LayerKind::LinearAttention ? any_linear : any_full) = true;
    const int64_t N = max_tokens;
    const DType act = DType::BF16, f32 = DType::F32;
    for (Buffer& s : stream) s = activation(act, {N, H});
    x_norm = activation(act, {N, H});
    ScratchPlan scratch(N);
    std::vector<std::pair<Tensor*, int>> views;
    auto reserve = [&](Tensor* t, DType dt, int64_t cols) { views.push_back({t, scratch.reserve(dt, cols)}); };
    if (any_linear) {
      for (Tensor* p : {&qkv, &conv}) reserve(p, act, gh.qkv_dim());
      for (Tensor* p : {&z, &core}) reserve(p, act, gh.value_dim());
      for (Tensor* p : {&a, &b}) reserve(p, act, gh.nv);
      for (Tensor* p : {&g, &beta}) reserve(p, f32, gh.nv);
      state = activation(f32, {gh.nv, gh.dk, gh.dv});
      gdn_work = activation(act, {ops::gated_delta_rule_workspace_elems(N, gh)});
    }
    if (any_full) {
      scratch.new_phase();
      for (Tensor* p : {&q, &gate, &attn}) reserve(p, act, nh * hd);
      for (Tensor* p : {&k, &v}) reserve(p, act, nkv * hd);
    }
    if (linears == bench::ForwardOptions::Linears::Fp8) {  // the FP8 linears' one scratch
      const int64_t widest = std::max({H, I, nh * hd, gh.value_dim()});
      act_bytes += bench::Fp8Scratch::bytes(fp8_path, N, widest, largest_fp8);
      if (!dry) fp8 = bench::Fp8Scratch(ctx, fp8_path, N, widest, largest_fp8, fp8_scaling);
      fused_token_quant = fp8_path == bench::Fp8Path::Gemm && fp8_scaling == ops::Fp8Scaling::TokenChannel &&
                          token_quant == bench::TokenQuant::Fused;
      if (fused_token_quant) {
        x_codes = activation(DType::F8E4M3, {N, H});
        x_scales = activation(f32, {N});
      }
    }
    scratch.new_phase();
    reserve(&mlp_gate_up, act, 2 * I);
    reserve(&mlp_act, act, I);
    work = activation(DType::U8, {static_cast<int64_t>(scratch.bytes())});
    if (!dry)
      for (const auto& [t, id] : views) *t = scratch.view(work, id);
    tokens = activation(DType::I32, {N});
    pos = activation(DType::I32, {N});
    cu = activation(DType::I32, {N + 1});
  }

  // Uploads the packed batch's tokens, positions (restarting per sequence) and cu_seqlens.
  void set_batch(const std::vector<int32_t>& tok, const std::vector<int32_t>& cu_seqlens) {
    T = static_cast<int64_t>(tok.size());
    ncu = bench::upload_packed_batch(ctx, tokens, pos, cu, tok, cu_seqlens);
  }

  // DecoderStackTarget::linear / linear_residual (src/model/decoder_stack.cpp): bf16, or the FP8 GEMM.
  void lin(const Tensor& out, const Tensor& in, const LinearWeight& W, ops::Accumulate acc = ops::Accumulate::No,
           const Tensor& residual = Tensor()) {
    if (holds_fp8_codes(W.mode)) return fp8.linear(ctx, out, in, W.fp8_codes, W.fp8_scales, acc, residual);
    if (!residual.empty()) return ops::matmul_residual_forward(ctx, out, in, W, residual);
    ops::matmul_forward(ctx, out, in, W, acc);
  }

  // A linear over the layer's normed input x: with the fused token quantization an FP8 linear takes x's codes
  // (written by the input norm; DecoderStackTarget's LinearInput), a bf16 one (in_proj_a / in_proj_b) x itself.
  void lin_x(const Tensor& out, const Tensor& x, const LinearWeight& W) {
    if (fused_token_quant && W.mode == LinearMode::Fp8Gemm)
      return fp8.token_gemm(ctx, out, rows(x_codes, T), rows(x_scales, T), W.fp8_codes, W.fp8_scales);
    lin(out, x, W);
  }

  // Qwen35Target::linear_attn_forward (src/model/qwen35_target.cpp), op for op.
  void linear_attn(const Qwen35LinearAttnWeights& A, const Tensor& x, const Tensor& residual, const Tensor& dst,
                   const Tensor& tcu, Timer& tm) {
    const ops::GdnHeads gh = cfg.gdn_heads();
    const Tensor qkv_t = rows(qkv, T), conv_t = rows(conv, T), z_t = rows(z, T), core_t = rows(core, T);
    const Tensor a_t = rows(a, T), b_t = rows(b, T), g_t = rows(g, T), beta_t = rows(beta, T);
    tm.run(Part::GemmGdn, 1, [&] { lin_x(qkv_t, x, A.in_proj_qkv); });
    tm.run(Part::Conv, 1, [&] { ops::causal_conv1d_silu_forward(ctx, conv_t, qkv_t, A.conv1d, tcu); });
    tm.run(Part::GemmGdn, 3, [&] {
      lin_x(z_t, x, A.in_proj_z);
      lin_x(b_t, x, A.in_proj_b);
      lin_x(a_t, x, A.in_proj_a);
    });
    tm.run(Part::Gates, 1, [&] { ops::gdn_gates_forward(ctx, g_t, beta_t, a_t, b_t, A.A_log, A.dt_bias); });
    tm.run(Part::DeltaRule, 1,
           [&] { ops::gated_delta_rule_forward(ctx, core_t, state, conv_t, g_t, beta_t, tcu, gh, gdn_work.t()); });
    const Tensor heads = core_t.reshape({T * gh.nv, gh.dv});
    tm.run(Part::GatedNorm, 1, [&] {
      ops::gated_rmsnorm_forward(ctx, heads, heads, z_t.reshape({T * gh.nv, gh.dv}), A.norm, cfg.text.rms_norm_eps);
    });
    tm.run(Part::GemmGdn, 1, [&] { lin(dst, core_t, A.out_proj, ops::Accumulate::No, residual); });
  }

  // Qwen35Target::full_attn_forward, op for op.
  void full_attn(const Qwen35FullAttnWeights& A, const Tensor& x, const Tensor& residual, const Tensor& dst,
                 const Tensor& tcu, Timer& tm) {
    const Qwen3Config& c = cfg.text;
    const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
    const ops::RopeSpec rope{c.rope_theta, cfg.rotary_dim};
    const Tensor qt = rows(q, T), gt = rows(gate, T), kt = rows(k, T), vt = rows(v, T), at = rows(attn, T);
    const Tensor positions = rows(pos, T);
    tm.run(Part::GemmAttn, 4, [&] {
      lin_x(qt, x, A.q_proj);
      lin_x(gt, x, A.gate_proj);
      lin_x(kt, x, A.k_proj);
      lin_x(vt, x, A.v_proj);
    });
    const Tensor q3 = qt.reshape({T, nh, hd}), k3 = kt.reshape({T, nkv, hd});
    tm.run(Part::HeadNormRope, 2, [&] {
      ops::head_norm_rope_forward(ctx, q3, Tensor(), q3, A.q_norm, positions, rope, c.rms_norm_eps);
      ops::head_norm_rope_forward(ctx, k3, Tensor(), k3, A.k_norm, positions, rope, c.rms_norm_eps);
    });
    tm.run(Part::Attention, 1, [&] {
      ops::attention_varlen_causal_forward(ctx, at.reshape({T, nh, hd}), q3, k3, vt.reshape({T, nkv, hd}), tcu,
                                           1.0f / std::sqrt(static_cast<float>(hd)));
    });
    tm.run(Part::SigmoidGate, 1, [&] { ops::sigmoid_gate_forward(ctx, at, at, gt); });
    tm.run(Part::GemmAttn, 1, [&] { lin(dst, at, A.o_proj, ops::Accumulate::No, residual); });
  }

  // DecoderStackTarget::layer_forward (src/model/decoder_stack.cpp) around Qwen35Target::mixer_forward, op for op.
  // With --fp8-scaling token (fused, the default of --fp8-token-quant) the input norm writes x's codes beside x,
  // the post-attention norm only gate|up's codes and the SwiGLU only down_proj's, as the stack does (docs/fp8.md
  // "Per-token activations, quantized once"); `--fp8-token-quant per-linear` quantizes each linear's input.
  void layer(const Qwen35LayerWeights& L, const Tensor& in, const Tensor& dst, const Tensor& tcu, Timer& tm) {
    const float eps = cfg.text.rms_norm_eps;
    const Tensor x = rows(x_norm, T);
    const Tensor xc = fused_token_quant ? rows(x_codes, T) : Tensor(), xs = fused_token_quant ? rows(x_scales, T) : Tensor();
    tm.run(Part::Norms, 1, [&] {
      if (fused_token_quant) return ops::rmsnorm_fp8_forward(ctx, x, xc, xs, in, L.input_layernorm, eps);
      ops::rmsnorm_forward(ctx, x, Tensor(), in, L.input_layernorm, eps);
    });
    if (L.kind == Qwen35LayerKind::LinearAttention) {
      linear_attn(L.linear, x, in, dst, tcu, tm);
    } else {
      full_attn(L.attn, x, in, dst, tcu, tm);
    }
    const Tensor gu = rows(mlp_gate_up, T), at = rows(mlp_act, T);
    if (fused_token_quant) {
      const int64_t H = cfg.text.hidden_size;
      const Tensor values = H <= ops::kRmsNormFp8CodesOnlyWidth ? Tensor() : x;  // the op's codes-only width
      const Tensor ac = fp8.token_codes(T, cfg.text.intermediate_size), as = fp8.token_scales(T);
      tm.run(Part::Norms, 1, [&] { ops::rmsnorm_fp8_forward(ctx, values, xc, xs, dst, L.post_attention_layernorm, eps); });
      tm.run(Part::GemmMlp, 1, [&] { fp8.token_gemm(ctx, gu, xc, xs, L.gate_up_proj.fp8_codes, L.gate_up_proj.fp8_scales); });
      tm.run(Part::Swiglu, 1, [&] { ops::swiglu_fp8_forward(ctx, Tensor(), ac, as, gu); });
      tm.run(Part::GemmMlp, 1, [&] {
        fp8.token_gemm(ctx, dst, ac, as, L.down_proj.fp8_codes, L.down_proj.fp8_scales, ops::Accumulate::Yes);
      });
      return;
    }
    tm.run(Part::Norms, 1, [&] { ops::rmsnorm_forward(ctx, x, Tensor(), dst, L.post_attention_layernorm, eps); });
    tm.run(Part::GemmMlp, 1, [&] { lin(gu, x, L.gate_up_proj); });
    tm.run(Part::Swiglu, 1, [&] { ops::swiglu_fused_forward(ctx, at, gu); });
    tm.run(Part::GemmMlp, 1, [&] { lin(dst, at, L.down_proj, ops::Accumulate::Yes); });
  }

  // DecoderStackTarget::forward after its host-side checks and uploads (done once in set_batch): embedding, then
  // the model's own layer stack (captured layers into their features slot, the final norm into
  // out.final_norm; that final norm and any repeated-capture copies are not bracketed by the timer).
  void forward(const CaptureOut& out, Timer& tm) {
    const Tensor tcu = rows(cu, ncu);
    tm.run(Part::Embedding, 1,
           [&] { ops::embedding_forward(ctx, rows(stream[0], T), rows(tokens, T), w.embed_tokens); });
    capture_stack_forward(ctx, plan, stream, T, cfg.text.hidden_size, out, w.norm, cfg.text.rms_norm_eps,
                          [&](int l, const Tensor& in, const Tensor& dst) { layer(w.layers[l], in, dst, tcu, tm); });
  }
};

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

constexpr double kGiB = 1073741824.0;

}  // namespace

// One table for the forward and its breakdown: the columns ref_hybrid_forward.py prints too.
std::vector<bench::Column> hybrid_columns() {
  using bench::num;
  using bench::text;
  return {text("case", 19), text("impl", 8), text("model", 11), num("T", "", 0), num("nseq", "", 0),
          num("ms", "ms", 2, 8), num("min_ms", "ms", 2), num("max_ms", "ms", 2), num("pct", "%", 1),
          num("ops", "", 0), num("tok_per_s", "tok/s", 1, 9), num("tflops", "TFLOP/s", 1), num("peak_gib", "GiB", 2),
          num("growth_gib", "GiB", 2)};
}

int main(int argc, char** argv) {
  bench::Writer w("bench_hybrid_forward", argc, argv);
  bench::ForwardOptions opt;
  opt.model = "27b";
  opt.seqlens = "4096,4096,4096,4096,4096,4096,4096,4096";
  bool lm_head = true, dry = false;
  bench::TokenQuant token_quant = bench::TokenQuant::Fused;
  for (int i = 1; i < argc; ++i) {
    if (bench::parse_forward_option(argc, argv, i, opt)) continue;
    const std::string a = argv[i];
    if (a == "--no-lm-head") lm_head = false;
    else if (a == "--dry-run") dry = true;
    else if (bench::parse_token_quant_option(argc, argv, i, token_quant)) continue;
    else DF_FAIL(BadOptions, "unknown option " << a, "see the usage at the top of bench/bench_hybrid_forward.cpp");
  }
  const std::string& model = opt.model;
  const int iters = opt.iters, warmup = opt.warmup;
  DF_CHECK(iters >= 1 && warmup >= 0, BadOptions, "--iters must be >= 1 and --warmup >= 0");
  const std::vector<Shape> all = shapes();
  const Shape* shape = nullptr;
  for (const Shape& s : all)
    if (model == s.name) shape = &s;
  DF_CHECK(shape, BadOptions, "unknown --model " << model << " (27b, tiny-hybrid)");
  const Qwen35Config cfg = parse_qwen35_config(shape->config, std::string("--model ") + shape->name);
  const Qwen3Config& tc = cfg.text;
  const ops::GdnHeads gh = cfg.gdn_heads();
  const int L = tc.num_hidden_layers;
  std::vector<int> full_layers;
  for (int l = 0; l < L; ++l)
    if (cfg.kinds[l] == Qwen35LayerKind::FullAttention) full_layers.push_back(l);
  const int n_full = static_cast<int>(full_layers.size()), n_gdn = L - n_full;

  std::vector<int32_t> seqlens = parse_ints(opt.seqlens), cu(1, 0);
  for (int32_t len : seqlens) {
    DF_CHECK(len >= 1, BadOptions, "--seqlens entries must be >= 1, got " << len);
    cu.push_back(cu.back() + len);
  }
  const int64_t T = cu.back();
  // DFlash's default target layer ids for a 5-layer drafter (1,16,31,46,61 on 64 layers), as a job picks them.
  std::vector<int> capture = opt.capture.empty() ? default_target_layer_ids(L, 5) : std::vector<int>();
  for (int32_t c : parse_ints(opt.capture)) capture.push_back(c);

  const int64_t H = tc.hidden_size, K = static_cast<int64_t>(capture.size());
  const bool fp8_linears = opt.linears == bench::ForwardOptions::Linears::Fp8;
  bench::Fp8Path fp8_path = fp8_linears ? bench::fp8_path(nullptr, opt.fp8_scaling) : bench::Fp8Path::Gemm;  // the GPU's, below
  // The shape, memory plan and method as `# ` lines (also all that --dry-run prints).
  auto header = [&](const std::string& device_line, const Model& m) {
    w.begin(device_line, bench::timing_line(warmup, iters) + "; breakdown from one more forward with events around every op");
    w.meta("what", std::string("Qwen3.5/3.6 hybrid target forward (src/model/qwen35_target.cpp op sequence), CUDA, ") +
                       (fp8_linears ? std::string("random e4m3 linears (") + bench::fp8_path_name(fp8_path, opt.fp8_scaling) +
                                          "; in_proj_a/b bf16) + bf16 other"
                                    : std::string("random bf16 weights")));
    w.meta("model", bench::format("%s: vocab %d, hidden %d, intermediate %d, %d layers = %d GDN + %d full attention "
                                  "(layers %s)",
                                  model.c_str(), tc.vocab_size, tc.hidden_size, tc.intermediate_size, L, n_gdn, n_full,
                                  join(full_layers).c_str()));
    w.meta("heads", bench::format("GDN %lld key / %lld value heads x %lld, conv %d; attention %d q / %d kv heads x %d, "
                                  "rotary %d, theta %.0e, eps %.0e",
                                  (long long)gh.nk, (long long)gh.nv, (long long)gh.dk, cfg.linear_conv_kernel_dim,
                                  tc.num_attention_heads, tc.num_key_value_heads, tc.head_dim, cfg.rotary_dim,
                                  tc.rope_theta, tc.rms_norm_eps));
    w.meta("batch", bench::format("%zu sequences, T = %lld tokens (seqlens %s)", seqlens.size(), (long long)T,
                                  opt.seqlens.c_str()));
    w.meta("capture", bench::format("%s + final -> send buffer [%lld, %lld, %lld] bf16 %.2f GiB, final norm %.2f GiB",
                                    join(capture).c_str(), (long long)K, (long long)T, (long long)H,
                                    bytes_of(DType::BF16, {K, T, H}) / kGiB, bytes_of(DType::BF16, {T, H}) / kGiB));
    w.meta("memory", bench::format("weights %.2f GiB (bf16; A_log, dt_bias float32; incl. lm_head %.2f GiB, allocated "
                                   "as the target holds it, unused), activations %.2f GiB (allocated once for T)",
                                   m.weight_bytes / kGiB, m.lm_head_bytes / kGiB, m.act_bytes / kGiB));
    w.meta("peak", "peak_gib = total - lowest free (cudaMemGetInfo after allocation, after each forward, after each op "
                   "of the instrumented one), incl. CUDA context; growth_gib = this program's part");
    if (model == "27b")
      w.meta("reference", "HF transformers 5.17 + flash-linear-attention 0.6.0 on this shape (H200): 8.9 K tokens/s, "
                          "102.6 GiB peak; goal >= 13.4 K tokens/s, < 64 GiB");
    else
      w.meta("reference", "HF reference and goal recorded for --model 27b only (this shape is a smoke run)");
  };
  if (dry) {
    const Model plan(cfg, Ctx{}, capture, T, lm_head, /*dry=*/true, opt.linears, fp8_path, opt.fp8_scaling, token_quant);
    header("none (--dry-run: shape and memory plan only)", plan);
    w.meta("planned", bench::format("%.2f GiB allocations (weights + activations + send buffer + final norm; no CUDA "
                                    "context, no cuBLASLt workspace)",
                                    (plan.weight_bytes + plan.act_bytes + bytes_of(DType::BF16, {K, T, H}) +
                                     bytes_of(DType::BF16, {T, H})) / kGiB));
    return 0;
  }

  DF_CHECK(cuda_device_count() > 0, DeviceFailure, "no CUDA device visible");
  Ctx ctx = make_ctx(Device::CUDA, 0);
  size_t free0 = 0, total = 0;
  BENCH_CUDA(cudaMemGetInfo(&free0, &total));
  size_t min_free = free0;
  auto sample_free = [&] {
    size_t f = 0, t = 0;
    BENCH_CUDA(cudaMemGetInfo(&f, &t));
    min_free = std::min(min_free, f);
  };

  if (fp8_linears) fp8_path = bench::fp8_path(&ctx, opt.fp8_scaling);
  Model m(cfg, ctx, capture, T, lm_head, /*dry=*/false, opt.linears, fp8_path, opt.fp8_scaling, token_quant);
  Buffer features(Device::CUDA, DType::BF16, {std::max<int64_t>(K, 1), T, H});
  Buffer final_out(Device::CUDA, DType::BF16, {T, H});
  const CaptureOut out{K > 0 ? features.t() : Tensor(), opt.no_final_norm ? Tensor() : final_out.t()};
  std::vector<int32_t> tokens(T);
  for (int64_t i = 0; i < T; ++i) tokens[i] = static_cast<int32_t>((i * 2654435761ull) % tc.vocab_size);
  m.set_batch(tokens, cu);
  synchronize(ctx);
  sample_free();
  // The shape first, flushed: an op without a CUDA twin yet stops the run with a fatal error at that op.
  header(bench::device_line(0), m);

  cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  Timer off, on;
  on.on = true;
  on.stream = stream;
  const std::vector<double> ms = bench::time_calls(ctx, warmup, iters, [&] { m.forward(out, off); }, sample_free);
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  // The instrumented pass: events around every op; its own end-to-end time too, so what the brackets
  // miss (the final norm, the event records themselves) shows as a row.
  BENCH_CUDA(cudaEventRecord(e0, stream));
  m.forward(out, on);
  BENCH_CUDA(cudaEventRecord(e1, stream));
  synchronize(ctx);
  float profiled_ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&profiled_ms, e0, e1));
  min_free = std::min(min_free, on.min_free);
  sample_free();
  auto parts = on.totals();
  auto part = [&](std::initializer_list<Part> ps) {
    std::pair<double, int> s{0.0, 0};
    for (Part p : ps) {
      s.first += parts[p].first;
      s.second += parts[p].second;
    }
    return s;
  };

  // Model math: 2 FLOP per weight per token for the linear layers; causal attention counts the visible
  // (lower-triangle) scores only, 4 * nh * hd FLOP per (query, key) pair for QK^T and PV.
  const double dH = double(H), nh = tc.num_attention_heads, nkv = tc.num_key_value_heads, hd = tc.head_dim;
  const double gdn_params = dH * (gh.qkv_dim() + gh.value_dim() + 2.0 * gh.nv) + double(gh.value_dim()) * dH;
  const double attn_params = dH * (2 * nh * hd + 2 * nkv * hd) + nh * hd * dH;
  const double mlp_params = 3.0 * dH * tc.intermediate_size;
  // The layers that run: all, or up to the last capture without a final norm (capture_stack_forward).
  const int layers_run = opt.no_final_norm && K > 0 ? *std::max_element(capture.begin(), capture.end()) + 1 : L;
  const int full_run = static_cast<int>(std::count_if(full_layers.begin(), full_layers.end(),
                                                      [&](int l) { return l < layers_run; }));
  const int gdn_run = layers_run - full_run;
  if (opt.no_final_norm) w.meta("final norm", bench::format("none (a CE job): layers 0..%d of %d run", layers_run - 1, L));
  const double flop_gemm_gdn = 2.0 * T * gdn_params * gdn_run, flop_gemm_attn = 2.0 * T * attn_params * full_run;
  const double flop_gemm_mlp = 2.0 * T * mlp_params * layers_run;
  const double flop_gemm = flop_gemm_gdn + flop_gemm_attn + flop_gemm_mlp;
  double pairs = 0;
  for (int32_t len : seqlens) pairs += double(len) * (len + 1) / 2;
  const double flop_attn = 4.0 * nh * hd * pairs * full_run;
  // The delta rule's recurrent form: per token and value head, decay, S^T k, rank-1 update, S^T q on a
  // dk x dv state: ~8 dk dv FLOP (a chunked kernel does more, but this is the work that has to happen).
  const double flop_delta = 8.0 * T * gh.nv * gh.dk * gh.dv * gdn_run;
  const double t_med = median(ms) * 1e-3;
  const double tok_s = T / t_med;
  const double peak_gib = (total - min_free) / kGiB, growth_gib = (free0 - min_free) / kGiB;

  struct Row {
    const char* name;
    std::pair<double, int> t;
    double flop;  // 0: no rate column
    int indent;
  };
  const double bracketed = part({Part::GemmGdn, Part::GemmAttn, Part::GemmMlp, Part::Conv, Part::Gates,
                                 Part::DeltaRule, Part::GatedNorm, Part::HeadNormRope, Part::Attention,
                                 Part::SigmoidGate, Part::Embedding, Part::Norms, Part::Swiglu})
                               .first;
  const std::vector<Row> table = {
      {"gemm", part({Part::GemmGdn, Part::GemmAttn, Part::GemmMlp}), flop_gemm, 0},
      {"gemm.gdn_proj", part({Part::GemmGdn}), flop_gemm_gdn, 1},
      {"gemm.attn_proj", part({Part::GemmAttn}), flop_gemm_attn, 1},
      {"gemm.mlp", part({Part::GemmMlp}), flop_gemm_mlp, 1},
      {"gdn", part({Part::Conv, Part::Gates, Part::DeltaRule, Part::GatedNorm}), 0, 0},
      {"gdn.conv1d_silu", part({Part::Conv}), 0, 1},
      {"gdn.gates", part({Part::Gates}), 0, 1},
      {"gdn.delta_rule", part({Part::DeltaRule}), flop_delta, 1},
      {"gdn.gated_rmsnorm", part({Part::GatedNorm}), 0, 1},
      {"attention", part({Part::HeadNormRope, Part::Attention, Part::SigmoidGate}), 0, 0},
      {"attention.norm_rope", part({Part::HeadNormRope}), 0, 1},
      {"attention.varlen", part({Part::Attention}), flop_attn, 1},
      {"attention.gate", part({Part::SigmoidGate}), 0, 1},
      {"rest", part({Part::Embedding, Part::Norms, Part::Swiglu}), 0, 0},
      {"rest.embedding", part({Part::Embedding}), 0, 1},
      {"rest.rmsnorm", part({Part::Norms}), 0, 1},
      {"rest.swiglu", part({Part::Swiglu}), 0, 1},
      {"unbracketed", {profiled_ms - bracketed, 0}, 0, 0},
  };
  w.meta("cases", bench::format("forward: the timed forwards (median, min, max); the others: the instrumented "
                                "forward, %.2f ms end to end (%.2f ms inside op brackets), pct of its end-to-end "
                                "time, ops = op calls; TFLOP/s from the model math; gemm.*: GDN, attention, MLP "
                                "projections; gdn.*: causal_conv1d_silu, gdn_gates, gated_delta_rule, gated_rmsnorm; "
                                "attention.*: head norm + rope, attention_varlen_causal, sigmoid gate; rest.*: "
                                "embedding, rmsnorm (2 per layer), swiglu_fused; unbracketed: final norm, gaps",
                                profiled_ms, bracketed));
  if (fp8_linears && fp8_path == bench::Fp8Path::Gemm) w.meta("fp8 gemm plans", bench::fp8_plans_meta(ctx, warmup));
  if (fp8_linears && fp8_path == bench::Fp8Path::Gemm && opt.fp8_scaling == ops::Fp8Scaling::TokenChannel)
    w.meta("fp8 token quant",
           m.fused_token_quant ? "fused: the input norm writes x's e4m3 codes beside x, the post-attention norm only "
                                 "gate|up's, the SwiGLU only down_proj's (in rest.rmsnorm / rest.swiglu); o_proj and "
                                 "out_proj quantize their input (in gemm)"
                               : "per-linear: each linear quantizes its input (the quantization in gemm)");
  w.columns(hybrid_columns());
  const bench::Cell mc = model, tt = static_cast<long long>(T), ns = seqlens.size(), _ = bench::none;
  const bool token = opt.fp8_scaling == ops::Fp8Scaling::TokenChannel;
  const bench::Cell impl = !fp8_linears                       ? "ours"
                           : fp8_path == bench::Fp8Path::Dequant ? (token ? "ours-fp8tok-dequant" : "ours-fp8-dequant")
                           : token ? (m.fused_token_quant ? "ours-fp8tok" : "ours-fp8tok-perlinear")
                                   : "ours-fp8";
  w.row({"forward", impl, mc, tt, ns, t_med * 1e3, *std::min_element(ms.begin(), ms.end()),
         *std::max_element(ms.begin(), ms.end()), _, _, tok_s, (flop_gemm + flop_attn + flop_delta) / t_med / 1e12,
         peak_gib, growth_gib});
  for (const Row& r : table)
    w.row({r.name, impl, mc, tt, ns, r.t.first, _, _, 100.0 * r.t.first / profiled_ms,
           r.t.second ? bench::Cell(r.t.second) : _, _,
           r.flop > 0 && r.t.first > 0 ? bench::Cell(r.flop / (r.t.first * 1e-3) / 1e12) : _});
  return 0;
}
