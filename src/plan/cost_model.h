// The cost model of a dflash-train job (issue 44, item 1): how long a target rank's forward, a drafter rank's
// training step, a batch's hidden-state transport and the drafters' gradient allreduce take on one GPU kind.
// Each is a count of FLOPs or bytes, from the shapes alone, turned into time by the GPU kind's calibration
// constants (src/plan/gpu_calibration.h; docs/cost_model.md has the formulas and where each constant comes
// from). Pure: plain structs in, seconds out; no options, no runtime, no device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dflash/hs_batch.h"  // HsDType, SlotShape
#include "plan/gpu_calibration.h"

namespace dflash::plan {

// ---- the target's forward --------------------------------------------------------------------------------
enum class TargetArch : uint8_t { DenseQwen3, HybridQwen35 };

// The target's text model, as far as its forward runs: `layers_run` is the capture cut (a CE job stops after
// the last captured layer, src/model/capture_stack.cpp; a job that sends the final norm runs every layer).
struct TargetShape {
  TargetArch arch = TargetArch::DenseQwen3;
  int layers_run = 0;
  int64_t hidden = 0, intermediate = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // the (full) attention layers'
  // Hybrid only: how many of the layers run are Gated DeltaNet (linear attention), and their heads.
  int linear_layers_run = 0;
  int64_t linear_key_heads = 0, linear_value_heads = 0, linear_key_head_dim = 0, linear_value_head_dim = 0;
  // How the layers' linears run (--target-precision, docs/fp8.md): Fp8 (the fine-grained block format)
  // divides their GEMM time by the kind's fp8_gemm_speedup, Fp8Token (per token x per channel: FP8-Dynamic)
  // by its fp8_token_gemm_speedup (each 1 where the FP8 GEMM falls back to bf16).
  enum class Linears : uint8_t { Bf16, Fp8, Fp8Token } linears = Linears::Bf16;
};

// A packed batch: its tokens and the causal attention's (query, key) pairs, sum over records of L(L+1)/2,
// the quadratic term.
struct PackedBatchShape {
  int64_t tokens = 0;
  double causal_pairs = 0;
};
PackedBatchShape packed_batch_of(const std::vector<int64_t>& record_lengths);
// `tokens` tokens in records of `record_length` (the last one shorter).
PackedBatchShape packed_batch_uniform(int64_t tokens, int64_t record_length);

// ---- the drafter's step ----------------------------------------------------------------------------------
enum class DrafterArch : uint8_t { DFlash, DFlash2 };
enum class LossObjective : uint8_t { CE, KL };
enum class OptimizerState : uint8_t { Fp32, Bf16 };

struct DrafterShape {
  DrafterArch arch = DrafterArch::DFlash;
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t vocab = 0;          // the target's, for the frozen lm_head and the loss
  int block = 16;
  int captured_layers = 5;    // target layers fused by fc: K x hidden in
  std::vector<int64_t> layer_windows;  // one per drafter layer: 0 = full attention, W > 0 = sliding over W keys
  LossObjective objective = LossObjective::CE;
  OptimizerState state = OptimizerState::Fp32;
  // DFlash2 only (docs/dflash2.md): convs of conv_kernel taps over groups of conv_group channels, a selector
  // over the unary top-k with rank-r codebooks [vocab, r].
  int conv_kernel = 2, conv_group = 16, selector_top_k = 16, selector_rank = 256;
  double parameters = 0;      // trainable parameters; 0 = count them from the shape (drafter_parameters)
};
double drafter_parameters(const DrafterShape& d);

// What one drafter step trains on: the batch's context tokens, its anchors (blocks of `block` rows), drawn
// uniformly within records of `record_length` tokens (the bench's single sequence: record_length = tokens).
struct DrafterBatchShape {
  int64_t context_tokens = 0;
  int64_t anchors = 0;
  int64_t record_length = 0;
};

// ---- transport and the allreduce -------------------------------------------------------------------------
// How a batch's hidden states move from a target rank to a drafter rank (docs/pipeline.md "Data planes"):
// device to device over NVLink (nccl or cuda-mpi), over PCIe peer to peer, or staged through host memory.
enum class TransportLink : uint8_t { NvLink, Pcie, HostStaged };
const char* transport_link_name(TransportLink l);

// Bytes of one batch on the wire: the captured layers (and the final norm when the objective needs it) x
// tokens x hidden in bf16 (--hs-dtype fp8: a byte each + a float32 scale per token row; SlotShape's rule),
// plus the index arrays.
double batch_wire_bytes(int64_t tokens, int64_t hidden, int captured_layers, bool final_norm,
                        HsDType wire = HsDType::Backend);

// ---- times -----------------------------------------------------------------------------------------------
// Each phase's time in seconds and the counts it came from, so a report can show what dominates.
struct TargetForwardCost {
  double gemm_flops = 0, attention_flops = 0, linear_attention_flops = 0, elementwise_bytes = 0;
  double gemm_s = 0, attention_s = 0, linear_attention_s = 0, elementwise_s = 0, overhead_s = 0;
  double seconds() const { return gemm_s + attention_s + linear_attention_s + elementwise_s + overhead_s; }
};
TargetForwardCost target_forward_cost(const TargetShape& t, const PackedBatchShape& b, const GpuCalibration& gpu);

struct DrafterStepCost {
  double gemm_flops = 0, lm_head_flops = 0, logits_bytes = 0, attention_flops = 0, attention_blocks = 0;
  double optimizer_bytes = 0, elementwise_bytes = 0, parameters = 0;
  double gemm_s = 0, lm_head_s = 0, attention_s = 0, optimizer_s = 0, elementwise_s = 0, overhead_s = 0;
  double seconds() const { return gemm_s + lm_head_s + attention_s + optimizer_s + elementwise_s + overhead_s; }
};
DrafterStepCost drafter_step_cost(const DrafterShape& d, const DrafterBatchShape& b, const GpuCalibration& gpu);

// Seconds to move `bytes` over one link of this GPU kind (fatal BadInput where the kind has no such link,
// e.g. NVLink on an RTX PRO 6000).
double transport_seconds(double bytes, TransportLink link, const GpuCalibration& gpu);
bool has_link(TransportLink link, const GpuCalibration& gpu);

// A ring allreduce of the drafter's fp32 gradient over `drafters` ranks: 2 (n - 1) / n x bytes at the bus
// bandwidth (the GPU kind's NCCL bus bandwidth inside a node; `internode_gbps` per GPU once the ring leaves
// it). 0 for one drafter.
double allreduce_seconds(double parameters, int drafters, int nodes, const GpuCalibration& gpu, double internode_gbps);

}  // namespace dflash::plan
