// ModelPlan and RunPlan: see run_plan.h.
#include "run_plan.h"

#include <sstream>

#include "dflash/backend.h"
#include "dflash/schedule.h"  // grad_accum_for

namespace dflash {

DrafterSource ModelPlan::drafter_source(const Options& o) const {
  DrafterSource s;
  s.target = target.text;
  s.target_dir = o.target_dir;
  s.drafter = drafter;
  s.drafter_dir = o.drafter_dir;
  return s;
}

EvalBudget ModelPlan::eval_budget(const Options& o) const {
  EvalBudget b;
  if (o.inject_eval_budget_bytes > 0) b.bytes_per_drafter = o.inject_eval_budget_bytes;
  b.bytes_per_token = static_cast<double>(slot_shape.value_bytes(1));  // kept as values (drafter_eval.cpp)
  return b;
}

ModelPlan plan_job(const Options& o) {
  ModelPlan p;
  p.target = load_target_config(o.target_dir);
  resolve_target_precision(p.target.quant, o.target_precision);
  const Qwen3Config& t = p.target.text;
  // --drafter brings its own layers and ids; a fresh drafter's recipe options must fit the target.
  p.drafter = drafter_config_for(t, o.drafter_dir, o.draft_layers, o.train);
  p.capture_layers = p.drafter.target_layer_ids;

  p.slot_shape.max_tokens = o.token_budget;
  p.slot_shape.num_layers = static_cast<int64_t>(p.capture_layers.size());
  p.slot_shape.hidden = t.hidden_size;
  p.slot_shape.final_norm = o.train.loss == LossKind::KL;
  p.slot_shape.device = o.backend;
  p.slot_shape.dtype = compute_dtype(o.backend);
  p.slot_shape.wire = o.hs_dtype;

  p.loader.token_budget = o.token_budget;
  p.loader.prefetch_depth = o.prefetch_depth;
  p.loader.max_epochs = o.epochs;
  p.loader.seed = o.train.seed;
  p.loader.long_record = o.long_record == LongRecordPolicy::Skip ? LongRecord::Skip : LongRecord::Cut;
  return p;
}

int grad_accum_of(const Options& o, int num_drafters) {
  return o.global_batch_tokens > 0 ? grad_accum_for(o.global_batch_tokens, o.token_budget, num_drafters) : o.grad_accum;
}

std::string grad_accum_line(const Options& o, int grad_accum, int num_drafters) {
  const long long D = num_drafters, K = grad_accum, per_step = static_cast<long long>(o.token_budget) * D * K;
  std::ostringstream os;
  os << "[dflash] batch: " << K << " micro-batch(es) per optimizer step x " << D << " drafter(s) x <= "
     << o.token_budget << " tokens = <= " << per_step << " tokens per optimizer step";
  if (o.global_batch_tokens > 0) os << " (--global-batch-tokens " << o.global_batch_tokens << ")";
  else os << " (--grad-accum " << K << ")";
  return os.str();
}

void set_resolved(std::vector<std::pair<std::string, std::string>>& resolved, const std::string& name,
                  const std::string& value) {
  for (auto& [k, v] : resolved)
    if (k == name) v = value;
}

std::string RunPlan::resolved_json(const Options& o) const { return resolved_options_json(resolved, o.resolved_kind); }

}  // namespace dflash
