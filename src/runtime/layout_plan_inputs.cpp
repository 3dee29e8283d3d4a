// The layout plan's request from the job: see layout_plan_inputs.h.
#include "layout_plan_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "dflash/drafter_model.h"  // drafter_param_count
#include "dry_run_plan.h"
#include "model/fp8_weights.h"  // fp8_gemm_scaling
#include "model/qwen35_config.h"

namespace dflash {

namespace {

plan::TargetShape target_shape(const Options& o, const ModelPlan& m) {
  const Qwen3Config& t = m.target.text;
  plan::TargetShape s;
  // A CE job stops after the last captured layer (src/model/capture_stack.h); KL also needs the final norm.
  const int last = m.capture_layers.empty() ? t.num_hidden_layers - 1
                                            : *std::max_element(m.capture_layers.begin(), m.capture_layers.end());
  s.layers_run = o.train.loss == LossKind::KL ? t.num_hidden_layers : std::min(t.num_hidden_layers, last + 1);
  s.hidden = t.hidden_size;
  s.intermediate = t.intermediate_size;
  s.heads = t.num_attention_heads;
  s.kv_heads = t.num_key_value_heads;
  s.head_dim = t.head_dim;
  // An FP8 target's linears at the speed of the FP8 GEMM its format runs as (fp8_gemm_scaling); a format no
  // FP8 GEMM takes runs dequantized, at bf16 GEMM speed.
  const std::optional<ops::Fp8Scaling> fp8 = fp8_gemm_scaling(m.target.quant);
  s.linears = m.target.quant.precision != TargetPrecision::Fp8 || !fp8 ? plan::TargetShape::Linears::Bf16
              : *fp8 == ops::Fp8Scaling::TokenChannel               ? plan::TargetShape::Linears::Fp8Token
                                                                    : plan::TargetShape::Linears::Fp8;
  if (m.target.qwen35) {
    const Qwen35Config& h = *m.target.qwen35;
    s.arch = plan::TargetArch::HybridQwen35;
    for (int l = 0; l < s.layers_run && l < static_cast<int>(h.kinds.size()); ++l)
      s.linear_layers_run += h.kinds[static_cast<size_t>(l)] == Qwen35LayerKind::LinearAttention ? 1 : 0;
    s.linear_key_heads = h.linear_num_key_heads;
    s.linear_value_heads = h.linear_num_value_heads;
    s.linear_key_head_dim = h.linear_key_head_dim;
    s.linear_value_head_dim = h.linear_value_head_dim;
  }
  return s;
}

plan::DrafterShape drafter_shape(const Options& o, const ModelPlan& m) {
  const DrafterConfig& d = m.drafter;
  plan::DrafterShape s;
  s.arch = d.arch == DraftArch::DFlash2 ? plan::DrafterArch::DFlash2 : plan::DrafterArch::DFlash;
  s.hidden = d.layers.hidden_size;
  s.intermediate = d.layers.intermediate_size;
  s.heads = d.layers.num_attention_heads;
  s.kv_heads = d.layers.num_key_value_heads;
  s.head_dim = d.layers.head_dim;
  s.vocab = m.target.text.vocab_size;
  s.block = d.block_size;
  s.captured_layers = static_cast<int>(m.capture_layers.size());
  for (int l = 0; l < d.layers.num_hidden_layers; ++l) {
    const bool sliding = l < static_cast<int>(d.layers.layer_types.size()) &&
                         d.layers.layer_types[static_cast<size_t>(l)] == "sliding_attention";
    s.layer_windows.push_back(sliding ? d.layers.sliding_window : 0);
  }
  s.objective = o.train.loss == LossKind::KL ? plan::LossObjective::KL : plan::LossObjective::CE;
  s.state = o.train.optimizer_state == OptimizerState::Bf16 ? plan::OptimizerState::Bf16 : plan::OptimizerState::Fp32;
  s.conv_kernel = d.d2.conv_kernel_size;
  s.conv_group = d.d2.conv_group_size;
  s.selector_top_k = d.d2.selector_top_k;
  s.selector_rank = d.d2.selector_rank;
  return s;
}

}  // namespace

plan::PlanRequest layout_plan_request(const Options& o, const ModelPlan& model, const RoleMemory& memory,
                                      const plan::GpuCalibration& gpu, int nodes, int gpus_per_node,
                                      double record_tokens) {
  plan::PlanRequest r;
  plan::JobCostInputs& j = r.job;
  const int64_t budget = o.token_budget;
  const int64_t record = std::max<int64_t>(1, std::min<int64_t>(budget, std::llround(record_tokens)));
  j.target = target_shape(o, model);
  j.target_batch = plan::packed_batch_uniform(budget, record);
  j.drafter = drafter_shape(o, model);
  // The anchors of one packed batch: --anchors-per-record in each of its records, capped by --max-anchors
  // (include/dflash/anchors.h); per batch only: --max-anchors.
  const int64_t records = (budget + record - 1) / record;
  const int64_t anchors = o.train.anchors_per_record > 0
                              ? std::min<int64_t>(o.train.max_anchors, o.train.anchors_per_record * records)
                              : o.train.max_anchors;
  j.drafter_batch = plan::DrafterBatchShape{budget, anchors, record};
  j.final_norm_sent = o.train.loss == LossKind::KL;
  j.hs_dtype = o.hs_dtype;
  j.global_batch_tokens = o.global_batch_tokens;
  j.grad_accum = o.grad_accum;
  r.cluster.gpu = gpu;
  r.cluster.nodes = nodes;
  r.cluster.gpus_per_node = gpus_per_node;
  // How hidden states travel: host-staged when asked, else device to device over the kind's link.
  r.cluster.link = o.data_plane == DataPlaneChoice::Host ? plan::TransportLink::HostStaged
                   : plan::has_link(plan::TransportLink::NvLink, gpu) ? plan::TransportLink::NvLink
                                                                       : plan::TransportLink::Pcie;
  // The plan adds the gradient accumulator (P fp32) where a layout's K > 1; the dry run's drafter figure holds
  // it already when this job's options ask for accumulation (plan_role_memory).
  const double accum = 4.0 * static_cast<double>(drafter_param_count(model.drafter));
  r.memory.target_bytes = memory.target;
  r.memory.drafter_bytes = memory.drafter - (o.grad_accum > 1 || o.global_batch_tokens > 0 ? accum : 0);
  r.memory.accumulator_bytes = accum;
  r.memory.colocated_bytes = memory.colocated();  // what check_colocated_fit and the dry run's check hold it to
  r.power_budget_w = o.power_budget_w;
  if (o.topology_choice == TopologyChoice::Given)
    r.chosen = o.topology.colocated() ? plan::Layout{plan::LayoutKind::Colocated, gpus_per_node, gpus_per_node}
                                      : plan::Layout{plan::LayoutKind::Split, o.topology.targets_per_node, o.topology.drafters_per_node};
  return r;
}

}  // namespace dflash
