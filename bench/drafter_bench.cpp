// Times the DFlash drafter's training step on CUDA (src/drafter/cuda/drafter_step*.cu): forward, backward, fused
// lm_head loss, clip + AdamW, on random weights and features of a real drafter shape, and prints the time
// per step (CUDA events, warm-up, median), the device memory the step holds, a breakdown by phase and the
// bf16 GEMM ceiling measured on the same GPU, through the bench writer (bench_common.h).
//
//   drafter_bench --model 8b  --context 3072 --anchors 512 --objective ce     (the headline shape)
//   drafter_bench --model 8b  --objective kl
//   drafter_bench --model 27b --context 4096 --anchors 512                    (4 sliding(2048) + 1 full)
//   drafter_bench --gemm-peak
//   drafter_bench --attention-probe [--model 27b --context 4096]              (one layer's block attention)
//   drafter_bench --model 8b --deterministic                                 (the cost of --deterministic)
//   drafter_bench --model 8b --optimizer-state bf16        (bf16 weights and AdamW moments, stochastic rounding)
//   drafter_bench --model 8b --chunk-blocks 7      (loss chunks of 7 x 15 rows instead of the trainer's rule)
//   any of them with --json: one JSON line per case instead of the rows (bench/README.md, "Output format")
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/drafter_model.h"
#include "dflash/ops.h"
#include "dflash/target.h"
#include "block_attention.cuh"
#include "dflash/drafter_ops.h"
#include "drafter_blas.cuh"
#include "drafter/cuda/drafter_step.cuh"
#include "bench_common.h"
#include "random_fill.cuh"
#include "drafter/loss_chunk.h"
#include "drafter/objective.h"

using namespace dflash;

namespace {

struct Args {
  std::string model = "8b";
  std::string objective = "ce";
  int64_t context = 3072, anchors = 512;
  int64_t chunk_blocks = 0;  // 0: the trainer's rule (train::loss_chunk_rows); else blocks of B - 1 rows
  int warmup = 2, steps = 10;
  bool gemm_peak = false;
  bool attention_probe = false;
  bool deterministic = false;  // fixed-order sums instead of atomics, untimed GEMM choice (--deterministic)
  std::string draft_arch = "dflash";  // dflash2: convs + selector (docs/dflash2.md), block 8 unless --block
  int block = 0;                      // 0: 16 (dflash) / 8 (dflash2)
  float softcap = 0.f, multiplier = 1.f;
  // A fresh drafter's own attention heads (dflash-train --draft-heads/--draft-head-dim/--draft-kv-heads; 0: the
  // target's): the Qwen3.8-27B DFlash2 release has 32 x 128 with 8 KV heads on a 24 x 256 target.
  int draft_heads = 0, draft_head_dim = 0, draft_kv_heads = 0;
  OptimizerState state = OptimizerState::Fp32;  // --optimizer-state fp32|bf16
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) fatal(ExitCode::BadOptions, "missing value for " + k);
      return argv[++i];
    };
    if (k == "--model") a.model = val();
    else if (k == "--objective") a.objective = val();
    else if (k == "--context") a.context = std::stoll(val());
    else if (k == "--anchors") a.anchors = std::stoll(val());
    else if (k == "--chunk-blocks") {
      a.chunk_blocks = std::stoll(val());
      if (a.chunk_blocks < 1) fatal(ExitCode::BadOptions, "--chunk-blocks must be >= 1 (leave it out for the trainer's rule)");
    }
    else if (k == "--warmup") a.warmup = std::stoi(val());
    else if (k == "--steps") a.steps = std::stoi(val());
    else if (k == "--gemm-peak") a.gemm_peak = true;
    else if (k == "--attention-probe") a.attention_probe = true;
    else if (k == "--optimizer-state") {
      const std::string v = val();
      if (v != "fp32" && v != "bf16") fatal(ExitCode::BadOptions, "--optimizer-state must be fp32 or bf16");
      a.state = v == "bf16" ? OptimizerState::Bf16 : OptimizerState::Fp32;
    }
    else if (k == "--deterministic") a.deterministic = true;
    else if (k == "--draft-arch") a.draft_arch = val();
    else if (k == "--block") a.block = std::stoi(val());
    else if (k == "--logit-softcap") a.softcap = std::stof(val());
    else if (k == "--output-multiplier") a.multiplier = std::stof(val());
    else if (k == "--draft-heads") a.draft_heads = std::stoi(val());
    else if (k == "--draft-head-dim") a.draft_head_dim = std::stoi(val());
    else if (k == "--draft-kv-heads") a.draft_kv_heads = std::stoi(val());
    else fatal(ExitCode::BadOptions, "unknown option " + k, "see the usage lines at the top of bench/drafter_bench.cpp");
  }
  return a;
}

// Drafter shapes: a fresh drafter with the target's widths (fresh_drafter_config).
DrafterConfig drafter_shape(const std::string& model) {
  DrafterConfig c;
  Qwen3Config& L = c.layers;
  L.num_hidden_layers = 5;
  L.rms_norm_eps = 1e-6f;
  L.rope_theta = 1e6f;
  c.block_size = 16;
  if (model == "8b") {  // Qwen3-8B target
    L.vocab_size = 151936;
    L.hidden_size = 4096;
    L.intermediate_size = 12288;
    L.num_attention_heads = 32;
    L.num_key_value_heads = 8;
    L.head_dim = 128;
    L.layer_types.assign(5, "full_attention");
    c.num_target_layers = 36;
    c.target_layer_ids = {1, 9, 17, 25, 33};
    c.mask_token_id = 151669;
  } else if (model == "27b") {  // Qwen3.6-27B target: 24/4 heads of 256; 4 sliding (2048) + 1 full
    L.vocab_size = 248320;
    L.hidden_size = 5120;
    L.intermediate_size = 17408;
    L.num_attention_heads = 24;
    L.num_key_value_heads = 4;
    L.head_dim = 256;
    L.layer_types = {"sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                     "full_attention"};
    L.sliding_window = 2048;
    c.num_target_layers = 64;
    c.target_layer_ids = {1, 16, 31, 46, 61};
    c.mask_token_id = 248070;
  } else {
    fatal(ExitCode::BadOptions, "--model must be 8b or 27b");
  }
  return c;
}

using bench::median;

// The step's table (ref_drafter_step.py and ref_dflash2_step.py print it too) and the GEMM peak's.
std::vector<bench::Column> step_columns() {
  using bench::num;
  using bench::text;
  return {text("case", 18), text("impl", 18), text("model", 5), text("arch", 7), num("block", "", 0),
          text("objective", 9), text("state", 5), num("det", "", 0), num("ms", "ms", 1, 7), num("min_ms", "ms", 1),
          num("max_ms", "ms", 1), num("pct", "%", 1), num("tflop", "TFLOP", 2), num("tflops", "TFLOP/s", 0),
          num("mem_gib", "GiB", 2)};
}

size_t used_bytes() {
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  return total_b - free_b;
}

// bf16 GEMM ceiling: out [M, N] = in [M, K] · W [N, K]^T through the same cuBLASLt path the step uses;
// median ms of 10 after 3 warm-up.
double gemm_ms(const Ctx& ctx, int64_t M, int64_t N, int64_t K) {
  Buffer in(Device::CUDA, DType::BF16, {M, K}), W(Device::CUDA, DType::BF16, {N, K}), out(Device::CUDA, DType::BF16, {M, N});
  cuda::fill_random(ctx, in, 1, 0.f, 1.f);
  cuda::fill_random(ctx, W, 2, 0.f, 1.f);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(a, static_cast<cudaStream_t>(ctx.stream));
    ops::matmul_forward(ctx, out, in, W);
    cudaEventRecord(b, static_cast<cudaStream_t>(ctx.stream));
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (i >= 3) t.push_back(ms);
  }
  return median(t);
}

// Block attention alone on one layer's shape: 8b (N=512 sorted anchors x 16, T=3072, 32/8 heads of 128,
// full; three chunk budgets) or 27b (N=512 x 16, T=--context, 24/4 heads of 256, sliding window 2048 and
// full; the default budget): GPU time (events) against the host time spent enqueuing. Host time close to
// GPU time means the op is launch-bound (many cuBLAS calls per chunk), not bandwidth- or math-bound.
// TFLOP/s counts the visible-key work only, as the step's breakdown does: 4·hd flops per (query row, head,
// visible key) forward (2 products), 2.5 times that backward (5 products: S recomputed, dP, dq, dk, dv).
void attention_probe(const Ctx& ctx, const Args& args, bench::Writer& w) {
  const bool big = args.model == "27b";
  const int64_t N = 512, B = 16, T = big ? args.context : 3072, nh = big ? 24 : 32, nkv = big ? 4 : 8,
                hd = big ? 256 : 128, NB = N * B;
  auto bf = [&](std::initializer_list<int64_t> d, uint64_t seed) {
    Buffer b(Device::CUDA, DType::BF16, d);
    cuda::fill_random(ctx, b, seed, 0.f, 1.f);
    return b;
  };
  Buffer q = bf({NB, nh, hd}, 1), kc = bf({T, nkv, hd}, 2), vc = bf({T, nkv, hd}, 3), kb = bf({NB, nkv, hd}, 4),
         vb = bf({NB, nkv, hd}, 5), dout = bf({NB, nh, hd}, 6), out = bf({NB, nh, hd}, 7), dq = bf({NB, nh, hd}, 8),
         dkc = bf({T, nkv, hd}, 9), dvc = bf({T, nkv, hd}, 10), dkb = bf({NB, nkv, hd}, 11), dvb = bf({NB, nkv, hd}, 12);
  Buffer lse(Device::CUDA, DType::F32, {NB, nh});
  std::mt19937 rng(3);
  std::vector<int32_t> all(T - 1);
  for (int64_t t = 0; t + 1 < T; ++t) all[t] = static_cast<int32_t>(t);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int32_t> an(all.begin(), all.begin() + N), sb(N, 0);
  std::sort(an.begin(), an.end());
  Buffer d_an(Device::CUDA, DType::I32, {N}), d_sb(Device::CUDA, DType::I32, {N});
  copy_tensor(ctx, d_an, cpu_view(an.data(), {N}));
  copy_tensor(ctx, d_sb, cpu_view(sb.data(), {N}));
  const bool fused = cuda::block_attention_fused_supported(nh, nkv, hd, B) &&
                     !(std::getenv("DFLASH_BLOCK_ATTENTION") && std::string(std::getenv("DFLASH_BLOCK_ATTENTION")) == "chunked");
  cudaStream_t st = static_cast<cudaStream_t>(ctx.stream);
  cudaEvent_t a, b, c;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventCreate(&c);
  using bench::num;
  using bench::text;
  w.meta("probe", bench::format("block attention alone, one %s layer: %lld sorted anchors x %lld, T = %lld, %lld/%lld "
                                "heads of %lld; GPU time (CUDA events) vs host enqueue time; TFLOP/s over the "
                                "visible keys (backward 2.5x the forward's work)",
                                big ? "27b" : "8b", (long long)N, (long long)B, (long long)T, (long long)nh,
                                (long long)nkv, (long long)hd));
  w.columns({text("case", 9), text("impl", 7), text("model", 5), num("window", "", 0), num("budget_mi", "Mi scores", 0),
             num("fwd_ms", "ms", 2), num("fwd_tflops", "TFLOP/s", 0), num("bwd_ms", "ms", 2),
             num("bwd_tflops", "TFLOP/s", 0), num("host_ms", "ms", 2)});
  const std::vector<int64_t> budgets = big ? std::vector<int64_t>{int64_t(192) << 20}
                                           : std::vector<int64_t>{int64_t(96) << 20, int64_t(192) << 20, int64_t(384) << 20};
  for (int window : big ? std::vector<int>{2048, 0} : std::vector<int>{0}) {
    ops::BlockAttnSpec spec;
    spec.scale = 1.f / std::sqrt(float(hd));
    spec.window = window;
    double visible = 0;  // sum over query rows of visible keys (context + own block), per head
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < B; ++o) {
        const int64_t lo = window > 0 ? std::max<int64_t>(sb[n], an[n] + o - (window - 1)) : sb[n];
        visible += double(std::max<int64_t>(0, an[n] - lo)) + double(window > 0 ? o + 1 : B);
      }
    const double fwd_flop = 4.0 * double(hd) * double(nh) * visible;
    for (int64_t budget : budgets) {
      cuda::set_block_attention_score_budget(budget);
      std::vector<double> fwd, bwd, host;
      for (int it = 0; it < 6; ++it) {
        synchronize(ctx);
        const auto h0 = std::chrono::steady_clock::now();
        cudaEventRecord(a, st);
        cuda::block_attention_forward(ctx, out, lse, q, kc, vc, kb, vb, d_an, d_sb, an, sb, spec);
        cudaEventRecord(b, st);
        cuda::block_attention_backward(ctx, dq, dkc, dvc, dkb, dvb, dout, out, lse, q, kc, vc, kb, vb, d_an, d_sb, an,
                                       sb, spec);
        cudaEventRecord(c, st);
        const auto h1 = std::chrono::steady_clock::now();
        cudaEventSynchronize(c);
        float f = 0, g = 0;
        cudaEventElapsedTime(&f, a, b);
        cudaEventElapsedTime(&g, b, c);
        if (it > 0) {
          fwd.push_back(f);
          bwd.push_back(g);
          host.push_back(std::chrono::duration<double, std::milli>(h1 - h0).count());
        }
      }
      const double mf = median(fwd), mb = median(bwd);
      w.row({"attention", fused ? "fused" : "chunked", big ? "27b" : "8b", window, (long long)(budget >> 20), mf,
             fwd_flop / (mf * 1e9), mb, 2.5 * fwd_flop / (mb * 1e9), median(host)});
    }
  }
  cuda::set_block_attention_score_budget(0);
}

}  // namespace

int main(int argc, char** argv) {
  bench::Writer w("drafter_bench", argc, argv);
  const Args args = parse(argc, argv);
  DF_CHECK(cuda_device_count() > 0, DeviceFailure, "no CUDA device visible");
  set_deterministic_kernels(args.deterministic);  // before the context: it sizes the mode's scratch
  Ctx ctx = make_ctx(Device::CUDA, 0);
  const size_t base_used = used_bytes();
  if (args.attention_probe) {
    w.begin(bench::device_line(0), bench::timing_line(1, 5));
    attention_probe(ctx, args, w);
    return 0;
  }
  if (args.gemm_peak) {
    w.begin(bench::device_line(0), bench::timing_line(3, 10));
    w.meta("cases", "bf16 GEMMs out [M, N] = in [M, K] W^T through the step's cuBLASLt path: gemm.square "
                    "8192 x 8192 x 8192, gemm.lm_head_chunk 2048 x 151936 x 4096, gemm.mlp 8192 x 12288 x 4096");
    w.columns(step_columns());
    const struct { const char* name; int64_t M, N, K; } gemms[] = {
        {"gemm.square", 8192, 8192, 8192}, {"gemm.lm_head_chunk", 2048, 151936, 4096}, {"gemm.mlp", 8192, 12288, 4096}};
    for (const auto& g : gemms) {
      const double ms = gemm_ms(ctx, g.M, g.N, g.K), flop = 2.0 * g.M * g.N * g.K;
      w.row({g.name, "ours", bench::none, bench::none, bench::none, bench::none, bench::none, bench::none, ms,
             bench::none, bench::none, bench::none, flop / 1e12, flop / (ms * 1e-3) / 1e12});
    }
    return 0;
  }
  DrafterConfig c = drafter_shape(args.model);
  if (args.draft_arch == "dflash2") {  // the releases' shape: 2 taps, groups of 16, top-16, rank 256
    c.arch = DraftArch::DFlash2;
    c.block_size = 8;
  } else if (args.draft_arch != "dflash") {
    fatal(ExitCode::BadOptions, "--draft-arch must be dflash or dflash2");
  }
  if (args.block > 0) c.block_size = args.block;
  if (args.draft_heads > 0) c.layers.num_attention_heads = args.draft_heads;
  if (args.draft_head_dim > 0) c.layers.head_dim = args.draft_head_dim;
  if (args.draft_kv_heads > 0) c.layers.num_key_value_heads = args.draft_kv_heads;
  if (c.layers.num_attention_heads % c.layers.num_key_value_heads != 0)
    fatal(ExitCode::BadOptions, "--draft-heads must be a multiple of --draft-kv-heads");
  c.output_multiplier = args.multiplier;
  c.final_logit_softcapping = args.softcap;
  w.begin(bench::device_line(0), bench::timing_line(args.warmup, args.steps));
  w.meta("drafter", bench::format("draft-arch %s block %d softcap %g multiplier %g", args.draft_arch.c_str(),
                                  c.block_size, c.final_logit_softcapping, c.output_multiplier));
  const ops::LossObjective objective = args.objective == "kl" ? ops::LossObjective::KL : ops::LossObjective::CE;
  const int64_t T = args.context, N = args.anchors, B = c.block_size, H = c.layers.hidden_size, V = c.layers.vocab_size;
  const int64_t K = static_cast<int64_t>(c.target_layer_ids.size());
  const std::vector<ParamSpec> layout = drafter_param_layout(c);
  const int64_t chunk_rows = args.chunk_blocks > 0 ? args.chunk_blocks * (B - 1)
                                                  : train::loss_chunk_rows(Device::CUDA, V, N * (B - 1));
  cuda::DrafterStepCuda step(c, layout, ctx, T, N, chunk_rows, args.state, /*sr_seed=*/7);
  w.meta("optimizer state", optimizer_state_name(args.state));
  // random weights: linear ~ U with std 0.02, norms 1 (as init_drafter_weights), fp32 master then bf16 copy
  // (the bf16 state: the bf16 weights directly)
  const bool bf16_state = args.state == OptimizerState::Bf16;
  for (size_t i = 0; i < layout.size(); ++i) {
    const ParamSpec& p = layout[i];
    Tensor t = bf16_state ? Tensor(static_cast<uint16_t*>(step.params_bf16().data) + p.offset, DType::BF16, Device::CUDA,
                                   {static_cast<int64_t>(p.numel())})
                          : Tensor(static_cast<float*>(step.params().data) + p.offset, DType::F32, Device::CUDA,
                                   {static_cast<int64_t>(p.numel())});
    cuda::fill_random(ctx, t, 100 + i, p.is_norm() ? 1.f : 0.f, p.is_norm() ? 0.f : 0.02f);
  }
  step.reset_from_params();
  Buffer embed(Device::CUDA, DType::BF16, {V, H}), lm_head(Device::CUDA, DType::BF16, {V, H});
  Buffer features(Device::CUDA, DType::BF16, {K, T, H}), final_norm(Device::CUDA, DType::BF16, {T, H});
  cuda::fill_random(ctx, embed, 1, 0.f, 0.02f);
  cuda::fill_random(ctx, lm_head, 2, 0.f, 0.02f);
  cuda::fill_random(ctx, features, 3, 0.f, 1.f);
  cuda::fill_random(ctx, final_norm, 4, 0.f, 1.f);
  step.set_frozen(embed, lm_head);
  // one packed sequence of T tokens, N distinct sorted anchors with a successor in the sequence
  PackedBatch batch;
  batch.cu_seqlens = {0, static_cast<int32_t>(T)};
  std::mt19937 rng(5);
  for (int64_t t = 0; t < T; ++t) batch.tokens.push_back(static_cast<int32_t>(rng() % 150000));
  batch.loss_mask.assign(static_cast<size_t>(T), 1);
  std::vector<int32_t> all(static_cast<size_t>(T - 1));
  for (int64_t t = 0; t + 1 < T; ++t) all[t] = static_cast<int32_t>(t);
  std::shuffle(all.begin(), all.end(), rng);
  DrafterStepInput step_in;
  step_in.anchors.assign(all.begin(), all.begin() + N);
  std::sort(step_in.anchors.begin(), step_in.anchors.end());
  step_in.seq_begin.assign(static_cast<size_t>(N), 0);
  std::vector<int32_t> seq_end(static_cast<size_t>(N), static_cast<int32_t>(T));
  train::LossRows rows;
  train::build_loss_rows(batch, step_in.anchors, seq_end, static_cast<int>(B), 7.0f, rows);
  FeatureBatch fbatch;  // the batch as the trainer hands it to the step (views: nothing copied)
  fbatch.batch = &batch;
  fbatch.features = features;
  // The job sends the target's final norm only for KL (slot_shape.final_norm): with CE the step gets none
  // and skips the teacher logits that only the "agree" metric would use (an extra lm_head GEMM).
  if (objective == ops::LossObjective::KL) fbatch.final_norm = final_norm;
  step_in.tokens = batch.tokens.data();
  step_in.ctx_pos.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) step_in.ctx_pos[t] = static_cast<int32_t>(t);
  train::DrafterBatch b;
  b.fb = &fbatch;
  b.in = &step_in;
  b.rows = &rows;

  ops::AdamWHyper hp;
  hp.lr = 1e-4f;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> times;
  double loss0 = 0, loss = 0, norm = 0;
  for (int i = 0; i < args.warmup + args.steps; ++i) {
    cudaEventRecord(e0, static_cast<cudaStream_t>(ctx.stream));
    const cuda::DrafterStepResult r = step.forward_backward(b, objective);
    norm = step.optimizer_step(hp, i + 1, 1.0f);
    cudaEventRecord(e1, static_cast<cudaStream_t>(ctx.stream));
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i == 0) loss0 = r.loss;
    loss = r.loss;
    if (i >= args.warmup) times.push_back(ms);
  }
  const double used = static_cast<double>(used_bytes() - base_used) / (1ull << 30);
  // breakdown: one more step with every op bracketed by events (slightly slower than the timed steps)
  step.set_profiling(true);
  step.forward_backward(b, objective);
  step.optimizer_step(hp, args.warmup + args.steps + 1, 1.0f);
  const std::vector<double> ph = step.phase_ms();
  // model FLOPs per step (2 per multiply-add): GEMMs forward x3 (forward, input grad, weight grad) except
  // the frozen lm_head (forward + input grad) and fc (no input grad); attention over the visible keys.
  const Qwen3Config& L = c.layers;
  const double NB = double(N) * B, R = double(rows.size()), Hd = H, I = L.intermediate_size;
  const double QD = double(L.num_attention_heads) * L.head_dim, KV = double(L.num_key_value_heads) * L.head_dim;
  const double layer_gemm = 2 * NB * Hd * (QD + 2 * KV + QD) + 2 * NB * Hd * 3 * I + 2 * double(T) * Hd * 2 * KV;
  const double gemm_flops = L.num_hidden_layers * 3 * layer_gemm + 2 * 2 * double(T) * K * Hd * Hd;
  const double head_flops = (objective == ops::LossObjective::KL ? 3 : 2) * 2 * R * Hd * V;  // logits (+ teacher) + dh
  double keys = 0;  // visible (query row, key) pairs per head
  for (int64_t n = 0; n < N; ++n) keys += double(B) * (step_in.anchors[n] + B);
  const double attn_flops_full = 4 * keys * L.num_attention_heads * L.head_dim * 3.5;  // fwd 2 GEMMs, bwd 5 (x2 recompute)
  const double step_ms = median(times);
  w.meta("step", bench::format("%s objective=%s context=%lld anchors=%lld (rows %lld, loss chunks of %lld rows%s) "
                               "params=%.2fB%s",
                               args.model.c_str(), args.objective.c_str(), (long long)T, (long long)N,
                               (long long)rows.size(), (long long)chunk_rows,
                               args.chunk_blocks > 0 ? ", --chunk-blocks" : " as the trainer",
                               double(step.params_bf16().numel()) / 1e9, args.deterministic ? ", --deterministic" : ""));
  w.meta("loss", bench::format("%.4f -> %.4f; grad norm %.3f", loss0, loss, norm));
  w.meta("memory", bench::format("mem_gib = device memory held by the step (cudaMemGetInfo delta, incl. cuBLAS "
                                 "workspaces); drafter scratch (attention/loss/optimizer) %.2f GiB",
                                 double(cuda::scratch_bytes(ctx)) / (1ull << 30)));
  double total = 0;
  for (double x : ph) total += x;
  w.meta("cases", bench::format("step: the timed steps (median, min, max); the others: one profiled step (%.1f ms, "
                                "events around every op), pct of it: gemm = cuBLAS linear + fc GEMMs, attention = "
                                "block attention fwd+bwd (visible keys only), loss = lm_head GEMMs + loss kernels, "
                                "optimizer = clip + AdamW, rest = norms/RoPE/SwiGLU/copies; tflop = the phase's "
                                "model work",
                                total));
  w.columns(step_columns());
  const bench::Cell mdl = args.model, arch = args.draft_arch, blk = c.block_size, obj = args.objective,
                    st = optimizer_state_name(args.state), det = args.deterministic ? 1 : 0, _ = bench::none;
  w.row({"step", "ours", mdl, arch, blk, obj, st, det, step_ms, *std::min_element(times.begin(), times.end()),
         *std::max_element(times.begin(), times.end()), _, _, _, used});
  const char* phase_cases[] = {"gemm", "attention", "loss", "optimizer", "rest"};
  const double phase_flop[] = {gemm_flops, attn_flops_full, head_flops, 0, 0};
  for (int i = 0; i < 5; ++i)
    w.row({phase_cases[i], "ours", mdl, arch, blk, obj, st, det, ph[i], _, _, 100 * ph[i] / total,
           phase_flop[i] > 0 ? bench::Cell(phase_flop[i] / 1e12) : _,
           phase_flop[i] > 0 ? bench::Cell(phase_flop[i] / (ph[i] * 1e-3) / 1e12) : _});
  return 0;
}
