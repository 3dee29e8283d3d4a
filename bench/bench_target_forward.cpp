// Times the CUDA target forward (Qwen3 dense, random bf16 weights) over a packed batch, the way a target
// rank runs it: embedding, decoder layers through the op layer (include/dflash/ops.h), captured layer
// outputs written straight into a send buffer [k, T, H] and the final norm into its own slot.
//
// The weights are random (device-side fill), so no checkpoint is read: a 32B checkpoint would not fit the
// GPU machine's disk. The op sequence is the one src/model/qwen3_target.cpp runs (inside the decoder stack
// of src/model/decoder_stack.cpp).
//
//   bench_target_forward --model 8b --seqlens 4096,4096,4096,4096 --capture 1,9,17,25,33
//   bench_target_forward --model 32b --mixed
//   bench_target_forward --model 8b --no-final-norm     (a CE job's forward: stops after the last capture)
//   bench_target_forward --gemm-peak
//   bench_target_forward --model 8b --fp8      (the linears as block-scaled FP8 GEMMs: an FP8 target on sm_90;
//                                               elsewhere, or with DFLASH_FP8_LINEAR=dequant, dequantized per GEMM)
//   bench_target_forward --model 8b --fp8 --fp8-scaling token   (compressed-tensors FP8-Dynamic's GEMMs: one
//                                               scale per token x one per output channel, OUTER_VEC_32F)
//   bench_target_forward --model 8b --fp8 --fp8-scaling token --fp8-token-quant per-linear
//                                              (each linear quantizing its own input, the path before the
//                                              norms and the SwiGLU wrote the codes: the A/B of docs/fp8.md
//                                              "Per-token activations, quantized once"; default fused)
//   options: --iters N (5), --warmup N (2), --json (one JSON line per case; bench/README.md, "Output format")
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/ops.h"
#include "bench_common.h"
#include "bench_fp8.h"
#include "model/scratch_plan.h"
#include "random_fill.cuh"

using namespace dflash;
using bench::median;
using bench::parse_ints;
using bench::TokenQuant;

namespace {

struct Shape {
  const char* name;
  int64_t vocab, hidden, inter, layers, nh, nkv, hd;
};
const Shape kShapes[] = {
    {"8b", 151936, 4096, 12288, 36, 32, 8, 128},
    {"32b", 151936, 5120, 25600, 64, 64, 8, 128},
};

// The fused projections of src/model/qwen3_weights.h: qkv [(nh + 2nkv) hd, H], gate_up [2I, H].
// --fp8: the four linears as FP8 codes + scales instead (the bf16 buffers stay empty).
struct Layer {
  Buffer in_norm, qkv, o, q_norm, k_norm, post_norm, gate_up, down;
  bench::Fp8Linear qkv8, o8, gate_up8, down8;
};

// Where time goes: each op is bracketed by events when `timed` is set (one instrumented pass).
// NormRope and Swiglu are the two fused elementwise ops, reported inside "rest".
enum class Part { Gemm, Attention, Rest, NormRope, Swiglu };
struct Timer {
  bool on = false;
  cudaStream_t stream = nullptr;
  std::vector<std::pair<Part, std::pair<cudaEvent_t, cudaEvent_t>>> marks;
  size_t next = 0;
  template <class F> void run(Part p, F&& f) {
    if (!on) return f();
    if (next == marks.size()) {
      cudaEvent_t a, b;
      BENCH_CUDA(cudaEventCreate(&a));
      BENCH_CUDA(cudaEventCreate(&b));
      marks.push_back({p, {a, b}});
    }
    auto& m = marks[next++];
    m.first = p;
    BENCH_CUDA(cudaEventRecord(m.second.first, stream));
    f();
    BENCH_CUDA(cudaEventRecord(m.second.second, stream));
  }
  std::map<Part, double> totals_ms() {
    std::map<Part, double> t;
    for (size_t i = 0; i < next; ++i) {
      float ms = 0;
      BENCH_CUDA(cudaEventElapsedTime(&ms, marks[i].second.first, marks[i].second.second));
      t[marks[i].first] += ms;
    }
    next = 0;
    return t;
  }
};

struct Model {
  Shape s;
  Ctx ctx;
  Buffer embed, final_norm;
  std::vector<Layer> layers;
  // activations, allocated once for max_tokens
  Buffer resid, h, proj;  // resid, proj: the two stream buffers
  // As in Qwen3Target: the attention half (qkv, q, k, v, attn) and the MLP half (gate_up, act) of a layer
  // share one allocation, `work`, sized for the larger half.
  Buffer work;
  Tensor qkv, q, k, v, attn, gate_up, act;
  size_t attn_half_bytes = 0, mlp_half_bytes = 0;
  Buffer tokens, pos, cu;
  int64_t T = 0;
  bench::ForwardOptions::Linears linears;
  bench::Fp8Scratch fp8;  // --fp8: the activations' codes and scales, or the dequantize path's scratch
  // Fused token quantization: x's codes [N, H] and scales [N] (the norms'); the SwiGLU's [N, I] and [N] go
  // into fp8's scratch, as DecoderStackTarget keeps them in its one FP8 activation scratch.
  bool fused_token_quant = false;
  Buffer x_codes, x_scales;

  Model(const Shape& shape, const Ctx& c, int64_t max_tokens, bench::ForwardOptions::Linears lin,
        bench::Fp8Path fp8_path = bench::Fp8Path::Gemm, ops::Fp8Scaling fp8_scaling = ops::Fp8Scaling::Block128,
        TokenQuant token_quant = TokenQuant::Fused)
      : s(shape), ctx(c), linears(lin) {
    uint64_t seed = 1;
    auto weight = [&](std::initializer_list<int64_t> dims, float mean, float std) {
      Buffer b(Device::CUDA, DType::BF16, dims);
      cuda::fill_random(ctx, b, seed++, mean, std);
      return b;
    };
    const int64_t H = s.hidden, I = s.inter, QD = s.nh * s.hd, KD = s.nkv * s.hd;
    embed = weight({s.vocab, H}, 0.f, 0.02f);
    final_norm = weight({H}, 1.f, 0.05f);
    const bool fp8_linears = linears == bench::ForwardOptions::Linears::Fp8;
    bench::Fp8Weights w8;
    for (int64_t l = 0; l < s.layers; ++l) {
      Layer L;
      L.in_norm = weight({H}, 1.f, 0.05f);
      L.q_norm = weight({s.hd}, 1.f, 0.05f);
      L.k_norm = weight({s.hd}, 1.f, 0.05f);
      L.post_norm = weight({H}, 1.f, 0.05f);
      if (fp8_linears) {
        L.qkv8 = w8.make(ctx, QD + 2 * KD, H, 0.02f, 1);
        L.o8 = w8.make(ctx, H, QD, 0.02f, 1);
        L.gate_up8 = w8.make(ctx, 2 * I, H, 0.02f, 1);
        L.down8 = w8.make(ctx, H, I, 0.02f, 1);
      } else {
        L.qkv = weight({QD + 2 * KD, H}, 0.f, 0.02f);
        L.o = weight({H, QD}, 0.f, 0.02f);
        L.gate_up = weight({2 * I, H}, 0.f, 0.02f);
        L.down = weight({H, I}, 0.f, 0.02f);
      }
      layers.push_back(std::move(L));
    }
    if (fp8_linears)
      fp8 = bench::Fp8Scratch(ctx, fp8_path, max_tokens, std::max({H, I, QD}),
                              std::max({(QD + 2 * KD) * H, H * QD, 2 * I * H, H * I}), fp8_scaling);
    const int64_t N = max_tokens;
    fused_token_quant = fp8_linears && fp8_path == bench::Fp8Path::Gemm &&
                        fp8_scaling == ops::Fp8Scaling::TokenChannel && token_quant == TokenQuant::Fused;
    if (fused_token_quant) {
      x_codes = Buffer(Device::CUDA, DType::F8E4M3, {N, H});
      x_scales = Buffer(Device::CUDA, DType::F32, {N});
    }
    resid = Buffer(Device::CUDA, DType::BF16, {N, H});
    h = Buffer(Device::CUDA, DType::BF16, {N, H});
    proj = Buffer(Device::CUDA, DType::BF16, {N, H});
    // The plan of Qwen3Target's constructor.
    const DType bf16 = DType::BF16;
    ScratchPlan plan(N);
    const int r_qkv = plan.reserve(bf16, QD + 2 * KD), r_q = plan.reserve(bf16, QD), r_k = plan.reserve(bf16, KD),
              r_v = plan.reserve(bf16, KD), r_attn = plan.reserve(bf16, QD);
    attn_half_bytes = plan.phase_bytes();
    plan.new_phase();
    const int r_gate_up = plan.reserve(bf16, 2 * I), r_act = plan.reserve(bf16, I);
    mlp_half_bytes = plan.phase_bytes();
    work = Buffer(Device::CUDA, DType::U8, {static_cast<int64_t>(plan.bytes())});
    qkv = plan.view(work, r_qkv);
    q = plan.view(work, r_q).reshape({N, s.nh, s.hd});
    k = plan.view(work, r_k).reshape({N, s.nkv, s.hd});
    v = plan.view(work, r_v).reshape({N, s.nkv, s.hd});
    attn = plan.view(work, r_attn);
    gate_up = plan.view(work, r_gate_up);
    act = plan.view(work, r_act);
    tokens = Buffer(Device::CUDA, DType::I32, {N});
    pos = Buffer(Device::CUDA, DType::I32, {N});
    cu = Buffer(Device::CUDA, DType::I32, {N + 1});
  }

  // Uploads the packed batch's tokens, positions (restarting per sequence) and cu_seqlens.
  void set_batch(const std::vector<int32_t>& tok, const std::vector<int32_t>& cu_seqlens) {
    T = static_cast<int64_t>(tok.size());
    ncu = bench::upload_packed_batch(ctx, tokens, pos, cu, tok, cu_seqlens);
  }
  int64_t ncu = 0;

  // features [k, T, H]: outputs of the capture layers; final [T, H]: final norm of the last layer.
  // The op sequence of Qwen3Target's forward (src/model/decoder_stack.cpp + qwen3_target.cpp): a captured layer writes its output
  // straight into its feature slot, other layers alternate between two stream buffers.
  // final_out empty: a CE job's forward (src/model/capture_stack.cpp), which stops after the last capture.
  void forward(const std::vector<int>& capture, const Tensor& features, const Tensor& final_out, Timer& tm) {
    const int64_t H = s.hidden;
    const float eps = 1e-6f, scale = 1.f / std::sqrt(static_cast<float>(s.hd));
    const ops::RopeSpec rope{1e6f, static_cast<int>(s.hd)};
    Tensor x = h.t().slice_rows(0, T);
    Tensor tq = q.slice_rows(0, T), tk = k.slice_rows(0, T), tv = v.slice_rows(0, T);
    Tensor ta = attn.slice_rows(0, T), tqkv = qkv.slice_rows(0, T);
    Tensor tgu = gate_up.slice_rows(0, T), tact = act.slice_rows(0, T);
    Tensor tpos = pos.t().slice_rows(0, T), tcu = cu.t().slice_rows(0, ncu);
    Tensor stream[2] = {resid.t().slice_rows(0, T), proj.t().slice_rows(0, T)};
    Tensor txc, txs, tac, tas;  // fused token quantization: the norms' and the SwiGLU's codes and scales
    if (fused_token_quant) {
      txc = x_codes.t().slice_rows(0, T), txs = x_scales.t().slice_rows(0, T);
      tac = fp8.token_codes(T, s.inter), tas = fp8.token_scales(T);
    }
    Tensor in = stream[0];
    tm.run(Part::Rest, [&] { ops::embedding_forward(ctx, in, tokens.t().slice_rows(0, T), embed); });
    size_t slot = 0;
    const int64_t layers_run = final_out.empty() ? capture.back() + 1 : s.layers;
    for (int64_t l = 0; l < layers_run; ++l) {
      const Layer& L = layers[l];
      Tensor dst;
      if (slot < capture.size() && capture[slot] == l) {
        dst = Tensor(static_cast<char*>(features.data) + slot * T * H * 2, DType::BF16, Device::CUDA, {T, H});
        ++slot;
      } else {
        dst = in.data == stream[0].data ? stream[1] : stream[0];
      }
      const bool f8 = linears == bench::ForwardOptions::Linears::Fp8;
      if (fused_token_quant) {  // DecoderStackTarget::norm with NormCodes::PerToken, then the GEMM on x's codes
        tm.run(Part::Rest, [&] { ops::rmsnorm_fp8_forward(ctx, x, txc, txs, in, L.in_norm, eps); });
        tm.run(Part::Gemm, [&] { fp8.token_gemm(ctx, tqkv, txc, txs, L.qkv8); });
      } else {
        tm.run(Part::Rest, [&] { ops::rmsnorm_forward(ctx, x, Tensor(), in, L.in_norm, eps); });
        tm.run(Part::Gemm, [&] { f8 ? fp8.linear(ctx, tqkv, x, L.qkv8) : ops::matmul_forward(ctx, tqkv, x, L.qkv); });
      }
      tm.run(Part::NormRope, [&] {
        ops::qkv_norm_rope_forward(ctx, tq, tk, tv, tqkv, L.q_norm, L.k_norm, tpos, rope, eps);
      });
      tm.run(Part::Attention, [&] {
        ops::attention_varlen_causal_forward(ctx, ta.reshape({T, s.nh, s.hd}), tq, tk, tv, tcu, scale);
      });
      tm.run(Part::Gemm, [&] {
        f8 ? fp8.linear(ctx, dst, ta, L.o8, ops::Accumulate::No, in) : ops::matmul_residual_forward(ctx, dst, ta, L.o, in);
      });
      if (fused_token_quant) {  // DecoderStackTarget::norm, then mlp_activation: the SwiGLU writes only codes
        tm.run(Part::Rest, [&] { ops::rmsnorm_fp8_forward(ctx, x, txc, txs, dst, L.post_norm, eps); });
        tm.run(Part::Gemm, [&] { fp8.token_gemm(ctx, tgu, txc, txs, L.gate_up8); });
        tm.run(Part::Swiglu, [&] { ops::swiglu_fp8_forward(ctx, Tensor(), tac, tas, tgu); });
        tm.run(Part::Gemm, [&] { fp8.token_gemm(ctx, dst, tac, tas, L.down8, ops::Accumulate::Yes); });
        in = dst;
        continue;
      }
      tm.run(Part::Rest, [&] { ops::rmsnorm_forward(ctx, x, Tensor(), dst, L.post_norm, eps); });
      tm.run(Part::Gemm, [&] { f8 ? fp8.linear(ctx, tgu, x, L.gate_up8) : ops::matmul_forward(ctx, tgu, x, L.gate_up); });
      tm.run(Part::Swiglu, [&] { ops::swiglu_fused_forward(ctx, tact, tgu); });
      tm.run(Part::Gemm, [&] {
        f8 ? fp8.linear(ctx, dst, tact, L.down8, ops::Accumulate::Yes)
           : ops::matmul_forward(ctx, dst, tact, L.down, ops::Accumulate::Yes);
      });
      in = dst;
    }
    if (!final_out.empty())
      tm.run(Part::Rest, [&] { ops::rmsnorm_forward(ctx, final_out, Tensor(), in, final_norm, eps); });
  }
};

}  // namespace

namespace {

// 10 timed (after 3 warm-up) bf16 8192^3 GEMMs: median ms.
double gemm_peak_ms(const Ctx& ctx) {
  const int64_t n = 8192;
  Buffer a(Device::CUDA, DType::BF16, {n, n}), b(Device::CUDA, DType::BF16, {n, n}), c(Device::CUDA, DType::BF16, {n, n});
  cuda::fill_random(ctx, a, 101, 0.f, 1.f);
  cuda::fill_random(ctx, b, 102, 0.f, 1.f);
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  std::vector<double> ms;
  for (int i = 0; i < 13; ++i) {
    BENCH_CUDA(cudaEventRecord(e0, static_cast<cudaStream_t>(ctx.stream)));
    ops::matmul_forward(ctx, c, a, b);
    BENCH_CUDA(cudaEventRecord(e1, static_cast<cudaStream_t>(ctx.stream)));
    synchronize(ctx);
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 3) ms.push_back(t);
  }
  return median(ms);
}

// One table for the forward and its breakdown (and the GEMM peak): the columns ref_target_forward.py prints too.
std::vector<bench::Column> forward_columns() {
  using bench::num;
  using bench::text;
  return {text("case", 14), text("impl", 8), text("model", 5), num("T", "", 0), num("nseq", "", 0),
          num("ms", "ms", 2, 8), num("min_ms", "ms", 2), num("pct", "%", 1), num("tok_per_s", "tok/s", 0, 9),
          num("tflops", "TFLOP/s", 1), num("gb_per_s", "GB/s", 0), num("mem_gib", "GiB", 2)};
}

}  // namespace

int main(int argc, char** argv) {
  bench::Writer w("bench_target_forward", argc, argv);
  bench::ForwardOptions opt;
  opt.model = "8b";
  opt.seqlens = "4096,4096,4096,4096";
  bool gemm_peak = false;
  TokenQuant token_quant = TokenQuant::Fused;
  for (int i = 1; i < argc; ++i) {
    if (bench::parse_forward_option(argc, argv, i, opt)) continue;
    const std::string a = argv[i];
    if (a == "--gemm-peak") gemm_peak = true;
    else if (bench::parse_token_quant_option(argc, argv, i, token_quant)) continue;
    else DF_FAIL(BadOptions, "unknown option " << a, "see the usage at the top of bench/bench_target_forward.cpp");
  }
  DF_CHECK(cuda_device_count() > 0, DeviceFailure, "no CUDA device visible");
  Ctx ctx = make_ctx(Device::CUDA, 0);
  if (gemm_peak) {
    w.begin(bench::device_line(0), bench::timing_line(3, 10));
    w.meta("case", "gemm_peak: bf16 8192^3 through cuBLASLt (ops::matmul_forward)");
    w.columns(forward_columns());
    const double ms = gemm_peak_ms(ctx);
    w.row({"gemm_peak", "ours", bench::none, bench::none, bench::none, ms, bench::none, bench::none, bench::none,
           2.0 * 8192.0 * 8192.0 * 8192.0 / (ms * 1e-3) / 1e12});
    return 0;
  }
  const Shape* shape = nullptr;
  for (const Shape& s : kShapes)
    if (opt.model == s.name) shape = &s;
  DF_CHECK(shape, BadOptions, "unknown --model " << opt.model << " (8b, 32b)");
  const Shape& s = *shape;

  std::vector<int32_t> seqlens = parse_ints(opt.seqlens), cu(1, 0);
  for (int32_t len : seqlens) cu.push_back(cu.back() + len);
  const int64_t T = cu.back();
  std::vector<int> capture;
  if (opt.capture.empty()) {  // DFlash default target layer ids for a 5-layer drafter: round(1 + i(L-4)/4)
    for (int i = 0; i < 5; ++i) capture.push_back(static_cast<int>(std::lround(1 + i * (s.layers - 4) / 4.0)));
  } else {
    for (int32_t c : parse_ints(opt.capture)) capture.push_back(c);
  }
  std::sort(capture.begin(), capture.end());

  size_t free0 = 0, total = 0;
  BENCH_CUDA(cudaMemGetInfo(&free0, &total));
  const bool fp8_linears = opt.linears == bench::ForwardOptions::Linears::Fp8;
  const bench::Fp8Path fp8_path = fp8_linears ? bench::fp8_path(&ctx, opt.fp8_scaling) : bench::Fp8Path::Gemm;
  Model m(s, ctx, T, opt.linears, fp8_path, opt.fp8_scaling, token_quant);
  const int64_t H = s.hidden, K = static_cast<int64_t>(capture.size());
  Buffer features(Device::CUDA, DType::BF16, {K, T, H}), final_buf(Device::CUDA, DType::BF16, {T, H});
  const Tensor final_out = opt.no_final_norm ? Tensor() : final_buf.t();
  const int64_t layers_run = opt.no_final_norm ? capture.back() + 1 : s.layers;
  std::vector<int32_t> tokens(T);
  for (int64_t i = 0; i < T; ++i) tokens[i] = static_cast<int32_t>((i * 2654435761ull) % s.vocab);
  m.set_batch(tokens, cu);
  synchronize(ctx);

  cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  Timer off, on;
  on.on = true;
  on.stream = stream;
  const std::vector<double> ms = bench::time_calls(
      ctx, opt.warmup, opt.iters, [&] { m.forward(capture, features, final_out, off); }, [] {});
  m.forward(capture, features, final_out, on);
  synchronize(ctx);
  auto parts = on.totals_ms();
  size_t free1 = 0;
  BENCH_CUDA(cudaMemGetInfo(&free1, &total));

  // Model math: 2 FLOPs per weight per token for the linear layers, and causal attention counting only
  // the visible (lower-triangle) scores: 4 * nh * hd per (query, key) pair for QK^T and PV.
  const double linear_params = double(layers_run) * (double(H) * s.nh * s.hd * 2 + double(H) * s.nkv * s.hd * 2 +
                                                    3.0 * H * s.inter);
  double pairs = 0;
  for (int32_t len : seqlens) pairs += double(len) * (len + 1) / 2;
  const double gemm_flop = 2.0 * linear_params * T, attn_flop = 4.0 * s.nh * s.hd * pairs * layers_run;
  const double t_med = median(ms) * 1e-3;
  const double rest = parts[Part::Rest] + parts[Part::NormRope] + parts[Part::Swiglu];
  const double total_parts = parts[Part::Gemm] + parts[Part::Attention] + rest;
  // Bytes the two fused elementwise ops move over all layers (bf16 read + write): qkv_norm_rope reads the
  // fused row and writes q, k, v (as many values); swiglu_fused reads 2I and writes I values per token.
  const double norm_rope_bytes = 2.0 * 2 * T * double(s.nh + 2 * s.nkv) * s.hd * layers_run;
  // bf16 gate|up read (4 bytes a column of I) + the bf16 activation written (2), or its e4m3 codes (1: fused).
  const double swiglu_bytes = (m.fused_token_quant ? 5.0 : 6.0) * T * double(s.inter) * layers_run;
  std::string cap;
  for (size_t i = 0; i < capture.size(); ++i) cap += (i ? "," : "") + std::to_string(capture[i]);
  w.begin(bench::device_line(0), bench::timing_line(opt.warmup, opt.iters));
  w.meta("model", bench::format("%s (Qwen3 dense, random %s weights), %lld layers", s.name,
                                fp8_linears ? (std::string("e4m3 linear (") + bench::fp8_path_name(fp8_path, opt.fp8_scaling) +
                                               ") + bf16 other").c_str()
                                            : "bf16",
                                (long long)s.layers));
  w.meta("batch", bench::format("%zu sequences, T = %lld tokens (seqlens %s)", seqlens.size(), (long long)T,
                                opt.seqlens.c_str()));
  w.meta("capture", opt.no_final_norm
                        ? bench::format("%s, no final norm (CE job: layers 0..%lld of %lld run)", cap.c_str(),
                                        (long long)layers_run - 1, (long long)s.layers)
                        : cap + " + final");
  w.meta("memory", bench::format("in use %.2f GiB (process incl. context: total - free), this program's growth "
                                 "%.2f GiB; layer scratch (one buffer for %lld tokens): attention half %.2f GiB, "
                                 "MLP half %.2f GiB -> %.2f GiB",
                                 (total - free1) / 1073741824.0, (free0 - free1) / 1073741824.0, (long long)T,
                                 m.attn_half_bytes / 1073741824.0, m.mlp_half_bytes / 1073741824.0,
                                 std::max(m.attn_half_bytes, m.mlp_half_bytes) / 1073741824.0));
  w.meta("cases", bench::format("forward: the timed forwards (median); the others: one instrumented forward "
                                "(%.2f ms, events around every op), pct of it; rest = embedding, norms, "
                                "qkv_norm_rope, swiglu_fused; TFLOP/s from the model math, GB/s bf16 read + write",
                                total_parts));
  if (fp8_linears && fp8_path == bench::Fp8Path::Gemm) w.meta("fp8 gemm plans", bench::fp8_plans_meta(ctx, opt.warmup));
  if (fp8_linears && fp8_path == bench::Fp8Path::Gemm && opt.fp8_scaling == ops::Fp8Scaling::TokenChannel)
    w.meta("fp8 token quant",
           m.fused_token_quant ? "fused: the norms write x's e4m3 codes (rmsnorm_fp8_forward, in rest), the SwiGLU only "
                                 "down_proj's (swiglu_fp8_forward, in swiglu_fused); o_proj quantizes its input (in gemm)"
                               : "per-linear: each linear quantizes its input (the quantization in gemm)");
  w.columns(forward_columns());
  const bool token = opt.fp8_scaling == ops::Fp8Scaling::TokenChannel;
  const bench::Cell impl = !fp8_linears                       ? "ours"
                           : fp8_path == bench::Fp8Path::Dequant ? (token ? "ours-fp8tok-dequant" : "ours-fp8-dequant")
                           : token ? (m.fused_token_quant ? "ours-fp8tok" : "ours-fp8tok-perlinear")
                                   : "ours-fp8";
  const bench::Cell model = s.name, tt = static_cast<long long>(T), ns = seqlens.size(), _ = bench::none;
  auto pct = [&](double ms) { return 100 * ms / total_parts; };
  w.row({"forward", impl, model, tt, ns, t_med * 1e3, *std::min_element(ms.begin(), ms.end()), _, T / t_med,
         (gemm_flop + attn_flop) / t_med / 1e12, _, (total - free1) / 1073741824.0});
  w.row({"gemm", impl, model, tt, ns, parts[Part::Gemm], _, pct(parts[Part::Gemm]), _,
         gemm_flop / (parts[Part::Gemm] * 1e-3) / 1e12});
  w.row({"attention", impl, model, tt, ns, parts[Part::Attention], _, pct(parts[Part::Attention]), _,
         attn_flop / (parts[Part::Attention] * 1e-3) / 1e12});
  w.row({"rest", impl, model, tt, ns, rest, _, pct(rest)});
  w.row({"qkv_norm_rope", impl, model, tt, ns, parts[Part::NormRope], _, pct(parts[Part::NormRope]), _, _,
         norm_rope_bytes / (parts[Part::NormRope] * 1e-3) / 1e9});
  w.row({"swiglu_fused", impl, model, tt, ns, parts[Part::Swiglu], _, pct(parts[Part::Swiglu]), _, _,
         swiglu_bytes / (parts[Part::Swiglu] * 1e-3) / 1e9});
  return 0;
}
