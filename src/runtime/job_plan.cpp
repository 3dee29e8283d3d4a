// JobPlan: see job_plan.h.
#include "job_plan.h"

#include "dflash/backend.h"

namespace dflash {

DrafterSource JobPlan::drafter_source(const Options& o) const {
  DrafterSource s;
  s.target = target.text;
  s.target_dir = o.target_dir;
  s.drafter = drafter;
  s.drafter_dir = o.drafter_dir;
  return s;
}

double JobPlan::wire_bytes_per_token() const {
  return static_cast<double>(slot_shape.hidden) *
         static_cast<double>(slot_shape.num_layers + (slot_shape.final_norm ? 1 : 0)) *
         static_cast<double>(dtype_size(slot_shape.dtype));
}

EvalBudget JobPlan::eval_budget(const Options& o) const {
  EvalBudget b;
  if (o.inject_eval_budget_bytes > 0) b.bytes_per_drafter = o.inject_eval_budget_bytes;
  b.bytes_per_token = wire_bytes_per_token();
  return b;
}

JobPlan plan_job(const Options& o) {
  JobPlan p;
  p.target = load_target_config(o.target_dir);
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

  p.loader.token_budget = o.token_budget;
  p.loader.prefetch_depth = o.prefetch_depth;
  p.loader.max_epochs = o.epochs;
  p.loader.seed = o.train.seed;
  p.loader.long_record = o.long_record == LongRecordPolicy::Skip ? LongRecord::Skip : LongRecord::Cut;
  return p;
}

}  // namespace dflash
