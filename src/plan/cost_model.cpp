// The cost model's counts and times: src/plan/cost_model.h; the formulas are written out in docs/cost_model.md.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "dflash/error.h"

namespace dflash::plan {

namespace {

// Shape-level constants of the model, the same on every GPU kind (fitted on the H200's profiled phases,
// bench/README-drafter.md "final numbers of issue 33"; docs/cost_model.md "Model constants").
constexpr double kBf16 = 2;
// The block attention's backward as a multiple of its forward FLOPs (two GEMMs forward, five backward with
// the scores recomputed): drafter_bench.cpp's own count.
constexpr double kBlockAttentionPasses = 3.5;
// fp32 logits [rows, V] moved by the loss row kernels per lm_head pass: CE writes them once and reads them
// about 1.5 times (the gradient in place); KL also the teacher's logits and its softmax.
constexpr double kLogitsPassesCe = 2.5, kLogitsPassesKl = 6.5;
// Bytes AdamW (with the clip's norm) moves per parameter: fp32 masters, gradient, m, v read and written and
// the bf16 copy (30); the bf16 state: bf16 weights and moments, fp32 gradient (20).
constexpr double kAdamBytesFp32 = 30, kAdamBytesBf16 = 20;
// The drafter's elementwise passes (norms, RoPE, SwiGLU, residual copies, forward and backward) move this
// many times the bytes of their inputs and outputs counted once.
constexpr double kDrafterElementwiseFactor = 2.6;
// The block attention's kernels at head dim 256 (96-row CTAs of 6 warps, kernels/block_attention_fused*)
// reach this share of the head-dim-128 kernels' rate: the 27B step's attention phase, 58.8 ms, against the 8B
// step's rate (bench/README-drafter.md "final numbers of issue 33").
constexpr double kWideHeadAttentionEfficiency = 0.75;
// Index arrays on the wire per token: token id, position, loss mask (int32 each).
constexpr double kIndexBytesPerToken = 12;

void require(bool ok, const char* what) {
  if (!ok) fatal(ExitCode::BadInput, std::string("cost model: ") + what, "every width, layer count and rate must be > 0");
}

// Mean visible context of an anchor drawn uniformly at positions 0..L-1 of its record, under a sliding
// window W (0 = full): mean of min(a, W).
double mean_visible_context(int64_t record_length, int64_t window) {
  const double L = static_cast<double>(record_length);
  if (L <= 1) return 0;
  if (window <= 0 || window >= record_length) return (L - 1) / 2;
  const double W = static_cast<double>(window);
  // a < W: a itself (sum W(W-1)/2); a >= W: W each (L - W of them)
  return (W * (W - 1) / 2 + W * (L - W)) / L;
}

}  // namespace

PackedBatchShape packed_batch_of(const std::vector<int64_t>& record_lengths) {
  PackedBatchShape b;
  for (int64_t l : record_lengths) {
    require(l > 0, "a record of no tokens");
    b.tokens += l;
    b.causal_pairs += static_cast<double>(l) * static_cast<double>(l + 1) / 2;
  }
  return b;
}

PackedBatchShape packed_batch_uniform(int64_t tokens, int64_t record_length) {
  require(tokens > 0 && record_length > 0, "a batch of no tokens");
  std::vector<int64_t> lens(static_cast<size_t>(tokens / record_length), record_length);
  if (tokens % record_length) lens.push_back(tokens % record_length);
  return packed_batch_of(lens);
}

TargetForwardCost target_forward_cost(const TargetShape& t, const PackedBatchShape& b, const GpuCalibration& gpu) {
  require(t.layers_run > 0 && t.hidden > 0 && t.intermediate > 0 && t.heads > 0 && t.kv_heads > 0 && t.head_dim > 0,
          "target shape incomplete");
  require(b.tokens > 0, "target batch of no tokens");
  const bool hybrid = t.arch == TargetArch::HybridQwen35;
  require(t.linear_layers_run >= 0 && t.linear_layers_run <= t.layers_run && (hybrid || t.linear_layers_run == 0),
          "linear-attention layers only in a hybrid target, at most the layers run");
  const double H = t.hidden, I = t.intermediate, QD = double(t.heads) * t.head_dim, KV = double(t.kv_heads) * t.head_dim;
  const double N = static_cast<double>(b.tokens);
  const int full = t.layers_run - t.linear_layers_run, linear = t.linear_layers_run;
  // Weights a token meets per layer (2 FLOP each): the MLP, then the mixer.
  const double mlp = 3 * H * I;
  // full attention: q (doubled by the hybrid's output gate), k, v, o
  const double attn = H * QD * (hybrid ? 2 : 1) + 2 * H * KV + QD * H;
  double lin = 0, Kd = 0, Vd = 0;
  if (linear > 0) {
    require(t.linear_key_heads > 0 && t.linear_value_heads > 0 && t.linear_key_head_dim > 0 && t.linear_value_head_dim > 0,
            "linear-attention heads incomplete");
    Kd = double(t.linear_key_heads) * t.linear_key_head_dim;
    Vd = double(t.linear_value_heads) * t.linear_value_head_dim;
    lin = H * (2 * Kd + Vd) + H * Vd + 2 * H * double(t.linear_value_heads) + Vd * H;  // qkv, z, b|a, out
  }
  TargetForwardCost c;
  c.gemm_flops = 2 * N * (t.layers_run * mlp + full * attn + linear * lin);
  c.attention_flops = 4.0 * double(t.heads) * double(t.head_dim) * b.causal_pairs * full;
  c.linear_attention_flops =
      8.0 * double(t.linear_key_head_dim) * double(t.linear_value_head_dim) * double(t.linear_value_heads) * N * linear;
  // bf16 bytes read + written per token: two RMSNorms and SwiGLU every layer; QK-norm + RoPE (and the hybrid's
  // sigmoid output gate) in attention layers; the causal conv and the gated RMSNorm in Gated DeltaNet layers.
  const double every = (4 * H + 3 * I) * kBf16;
  const double attn_ew = hybrid ? (QD + KV) * 2 * kBf16 + 3 * QD * kBf16 : 2 * (QD + 2 * KV) * kBf16;
  const double lin_ew = (2 * Kd + Vd) * 2 * kBf16 + 3 * Vd * kBf16;
  c.elementwise_bytes = N * (t.layers_run * every + full * attn_ew + linear * lin_ew);
  c.gemm_s = c.gemm_flops / (gpu.gemm_tflops * 1e12) /
             (t.linears == TargetShape::Linears::Fp8        ? gpu.fp8_gemm_speedup
              : t.linears == TargetShape::Linears::Fp8Token ? gpu.fp8_token_gemm_speedup
                                                            : 1.0);
  c.attention_s = c.attention_flops / (gpu.target_attention_tflops * 1e12);
  c.linear_attention_s = linear > 0 ? c.linear_attention_flops / (gpu.linear_attention_tflops * 1e12) : 0;
  c.elementwise_s = c.elementwise_bytes / (gpu.memory_tbps * 1e12);
  c.overhead_s = t.layers_run * gpu.layer_overhead_us * 1e-6;
  for (double* s : {&c.gemm_s, &c.attention_s, &c.linear_attention_s, &c.elementwise_s, &c.overhead_s})
    *s *= gpu.target_time_scale;  // a run's correction (1 in the built-in table)
  return c;
}

double drafter_parameters(const DrafterShape& d) {
  if (d.parameters > 0) return d.parameters;
  const double H = d.hidden, I = d.intermediate, QD = double(d.heads) * d.head_dim, KV = double(d.kv_heads) * d.head_dim;
  const double L = static_cast<double>(d.layer_windows.size());
  // per layer q, k, v, o, the MLP, two norms and the q/k norms; fc [H, K H] and hidden_norm
  double p = L * (H * QD + 2 * H * KV + QD * H + 3 * H * I + 2 * H + 2 * double(d.head_dim)) +
             double(d.captured_layers) * H * H + H + H;  // + the final norm
  if (d.arch == DrafterArch::DFlash2) {  // per layer two convs (base [2, k, H], projection [2kG, H]); the selector
    const double G = H / d.conv_group, k = d.conv_kernel;
    p += L * 2 * (2 * k * H + 2 * k * G * H) + double(d.selector_rank) * H + 2.0 * double(d.vocab) * d.selector_rank;
  }
  return p;
}

DrafterStepCost drafter_step_cost(const DrafterShape& d, const DrafterBatchShape& b, const GpuCalibration& gpu) {
  require(d.hidden > 0 && d.intermediate > 0 && d.heads > 0 && d.kv_heads > 0 && d.head_dim > 0 && d.vocab > 0 &&
              d.block >= 2 && d.captured_layers > 0 && !d.layer_windows.empty(),
          "drafter shape incomplete");
  require(b.context_tokens > 0 && b.anchors > 0, "drafter batch of no tokens or no anchors");
  const double H = d.hidden, I = d.intermediate, QD = double(d.heads) * d.head_dim, KV = double(d.kv_heads) * d.head_dim;
  const double T = static_cast<double>(b.context_tokens), A = static_cast<double>(b.anchors), B = d.block;
  const double NB = A * B, R = A * (B - 1), L = static_cast<double>(d.layer_windows.size()), V = d.vocab;
  const int64_t record = b.record_length > 0 ? b.record_length : b.context_tokens;
  DrafterStepCost c;
  // Layer GEMMs forward, input gradient and weight gradient (x3): the block rows through q, k, v, o and the
  // MLP, the context tokens through k and v; fc forward and weight gradient only (its input is frozen).
  const double row_weights = H * QD + 2 * H * KV + QD * H + 3 * H * I;
  c.gemm_flops = 3 * 2 * L * (NB * row_weights + T * 2 * H * KV) + 2 * 2 * T * d.captured_layers * H * H;
  double elementwise_row = (4 * H + 2 * (QD + 2 * KV) + 3 * I) * kBf16;  // per block row and layer, forward
  if (d.arch == DrafterArch::DFlash2) {
    const double G = H / d.conv_group, k = d.conv_kernel, D2 = 2 * k * G;
    c.gemm_flops += 3 * 2 * L * NB * 2 * (D2 * H) + 3 * 2 * R * H * d.selector_rank;  // conv projections, selector
    elementwise_row += (4 * H + 2 * D2) * kBf16;
  }
  c.lm_head_flops = (d.objective == LossObjective::KL ? 3 : 2) * 2 * R * H * V;
  c.logits_bytes = (d.objective == LossObjective::KL ? kLogitsPassesKl : kLogitsPassesCe) * R * V * 4;
  // Block attention: each block's B rows see the anchor's visible context (window-bounded) and their block.
  double pairs = 0;
  for (int64_t w : d.layer_windows) pairs += NB * (mean_visible_context(record, w) + B);
  c.attention_flops = kBlockAttentionPasses * 4 * double(d.heads) * double(d.head_dim) * pairs;
  c.attention_blocks = A * L;
  c.parameters = drafter_parameters(d);
  c.optimizer_bytes = c.parameters * (d.state == OptimizerState::Bf16 ? kAdamBytesBf16 : kAdamBytesFp32);
  // forward + backward (x3) over the block rows; the context's k/v norm + RoPE per layer, fc's input and
  // hidden_norm once
  c.elementwise_bytes = kDrafterElementwiseFactor *
                        (3 * NB * L * elementwise_row + 3 * T * L * 4 * KV * kBf16 + 2 * T * (d.captured_layers + 2) * H * kBf16);
  c.gemm_s = c.gemm_flops / (gpu.gemm_tflops * 1e12);
  c.lm_head_s = c.lm_head_flops / (gpu.gemm_tflops * 1e12) + c.logits_bytes / (gpu.memory_tbps * 1e12);
  const double attention_rate = gpu.drafter_attention_tflops * (d.head_dim > 128 ? kWideHeadAttentionEfficiency : 1.0);
  c.attention_s = c.attention_flops / (attention_rate * 1e12) + c.attention_blocks * gpu.drafter_block_overhead_us * 1e-6;
  c.optimizer_s = c.optimizer_bytes / (gpu.memory_tbps * 1e12);
  c.elementwise_s = c.elementwise_bytes / (gpu.memory_tbps * 1e12);
  c.overhead_s = gpu.step_overhead_ms * 1e-3;
  for (double* s : {&c.gemm_s, &c.lm_head_s, &c.attention_s, &c.optimizer_s, &c.elementwise_s, &c.overhead_s})
    *s *= gpu.drafter_time_scale;  // a run's correction (1 in the built-in table)
  return c;
}

const char* transport_link_name(TransportLink l) {
  switch (l) {
    case TransportLink::NvLink: return "nvlink";
    case TransportLink::Pcie: return "pcie";
    case TransportLink::HostStaged: return "host-staged";
  }
  return "?";
}

double batch_wire_bytes(int64_t tokens, int64_t hidden, int captured_layers, bool final_norm, HsDType wire) {
  require(tokens > 0 && hidden > 0 && captured_layers > 0, "a batch of no tokens, width or layers");
  SlotShape s;  // a CUDA job's batch
  s.num_layers = captured_layers;
  s.hidden = hidden;
  s.final_norm = final_norm;
  s.dtype = DType::BF16;
  s.wire = wire;
  return double(tokens) * s.wire_bytes_per_token() + double(tokens) * kIndexBytesPerToken;
}

bool has_link(TransportLink link, const GpuCalibration& gpu) {
  switch (link) {
    case TransportLink::NvLink: return gpu.nvlink_gbps > 0;
    case TransportLink::Pcie: return gpu.pcie_gbps > 0;
    case TransportLink::HostStaged: return gpu.host_staged_gbps > 0;
  }
  return false;
}

double transport_seconds(double bytes, TransportLink link, const GpuCalibration& gpu) {
  if (!has_link(link, gpu))
    fatal(ExitCode::BadInput, std::string("cost model: ") + gpu.name + " has no " + transport_link_name(link) + " link",
          "plan this GPU kind with another data plane (pcie or host-staged)");
  const double gbps = link == TransportLink::NvLink ? gpu.nvlink_gbps
                      : link == TransportLink::Pcie ? gpu.pcie_gbps
                                                    : gpu.host_staged_gbps;
  return bytes / (gbps * 1e9);
}

double allreduce_seconds(double parameters, int drafters, int nodes, const GpuCalibration& gpu, double internode_gbps) {
  if (drafters <= 1) return 0;
  require(gpu.allreduce_busbw_gbps > 0, "no allreduce bandwidth for this GPU kind");
  double busbw = gpu.allreduce_busbw_gbps;
  if (nodes > 1) {
    require(internode_gbps > 0, "several nodes need the inter-node bandwidth per GPU");
    busbw = std::min(busbw, internode_gbps);
  }
  const double n = drafters, bytes = parameters * 4;  // the gradient is fp32 (docs/pipeline.md "Optimizer state")
  return 2 * (n - 1) / n * bytes / (busbw * 1e9);
}

}  // namespace dflash::plan
