// DrafterTau: src/runtime/drafter_tau.h.
#include "drafter_tau.h"

#include <algorithm>
#include <cstdio>

#include "dflash/error.h"
#include "dflash/eval_set.h"  // eval_share
#include "dflash/hf_config.h"

namespace dflash {

int tau_max_prompt_length(const Options& o, int block_size) {
  const int64_t room = o.token_budget - o.eval_tau_max_new_tokens - block_size;
  DF_CHECK_HINT(room >= 1, BadOptions,
                "--eval-tau-max-new-tokens " << o.eval_tau_max_new_tokens << " + the block of " << block_size
                                             << " leave no room for a prompt in --token-budget " << o.token_budget
                                             << " (the drafter's buffers hold prompt + new tokens + block)",
                "lower --eval-tau-max-new-tokens, or raise --token-budget");
  return static_cast<int>(std::min<int64_t>(kDefaultMaxPromptLength, room));
}

std::shared_ptr<const EvalPrompts> load_tau_prompts(const Options& o, int block_size, const TokenDataset& eval_data) {
  const int limit = tau_max_prompt_length(o, block_size);
  return std::make_shared<const EvalPrompts>(load_eval_prompts(eval_data, o.eval_tau_prompts, limit, "--eval-data"));
}

bool tau_due(int64_t step, const Options& o, const RunPlan& plan) {
  if (o.eval_tau_every <= 0 || step <= 0) return false;
  if (step % o.eval_tau_every == 0) return true;
  return (o.max_steps > 0 && step == o.max_steps) || (plan.schedule.total_steps > 0 && step == plan.schedule.total_steps);
}

DrafterTau::DrafterTau(const JobContext& job, DrafterTrainer& trainer) : job_(job) {
  const Options& o = job.opt;
  const Topology& topo = job.topo;
  DF_CHECK(job.tau_prompts != nullptr, Internal, "--eval-tau-every without the prompts loaded");
  const EvalPrompts& p = *job.tau_prompts;
  for (int64_t i : eval_share(static_cast<int64_t>(p.ids.size()), static_cast<int>(topo.drafters.size()),
                              topo.drafter_index_of(topo.world_rank)))
    mine_.push_back(static_cast<size_t>(i));
  stop_ = default_stop_ids(o.target_dir);  // dflash-eval's default
  const DrafterConfig& dc = trainer.config();
  const int64_t max_tokens = static_cast<int64_t>(p.longest()) + o.eval_tau_max_new_tokens + dc.block_size;
  DF_CHECK(max_tokens <= o.token_budget, Internal, "tau decoding needs " << max_tokens << " tokens, above --token-budget");
  // --eval-tau-prompt-batch of this drafter's prompts decode together, one packed target forward of at most
  // --token-budget tokens (the bound the target ranks' own forwards have).
  std::vector<size_t> lengths;
  for (size_t i : mine_) lengths.push_back(p.ids[i].size());
  const int64_t packed = std::max(max_tokens, packed_tokens_for(lengths, o.eval_tau_max_new_tokens, o.eval_tau_prompt_batch,
                                                                 o.token_budget, "--token-budget"));
  target_ = make_target_model(job.plan.target, o.target_dir, job.ctx, dc.target_layer_ids, packed);
  decoder_ = std::make_unique<SpecDecoder>(*target_, trainer, job.ctx, max_tokens, packed, o.eval_tau_prompt_batch);
  if (!topo.is_metrics_writer()) return;
  std::string stops;
  for (int32_t s : stop_) stops += " " + std::to_string(s);
  std::printf("[dflash] eval tau: %zu prompt(s) of %s (skipped: %zu with no prompt, %zu longer than %d tokens), %d new "
              "tokens each, stop ids%s; every %lld step(s) and after the last; each drafter decodes its share (%zu here, %d "
              "at a time in packed forwards of <= %lld tokens) with its own copy of the target (dflash-eval --max-prompts %d --max-prompt-length %d --max-new-tokens %d "
              "measures the same)\n",
              p.ids.size(), o.eval_data.c_str(), p.no_prompt, p.too_long, tau_max_prompt_length(o, dc.block_size),
              o.eval_tau_max_new_tokens, stops.empty() ? " none" : stops.c_str(), static_cast<long long>(o.eval_tau_every),
              mine_.size(), o.eval_tau_prompt_batch, static_cast<long long>(packed), o.eval_tau_prompts, tau_max_prompt_length(o, dc.block_size), o.eval_tau_max_new_tokens);
  std::fflush(stdout);
}

DrafterTau::~DrafterTau() = default;

TauSums DrafterTau::measure(const std::function<void()>& progress) {
  const auto t0 = mpi::Clock::now();
  TauSums sums;
  std::vector<DecodePrompt> todo;
  for (size_t i : mine_) todo.push_back({&job_.tau_prompts->ids[i], i});  // stream: the prompt's index, as dflash-eval
  for (const SpecDecodeResult& r : decoder_->generate_batch(todo, job_.opt.eval_tau_max_new_tokens, stop_, progress))
    sums.add(r);
  // The targets wait for credits meanwhile, against --peer-timeout: say so well before it bites.
  const double took = mpi::seconds_since(t0), limit = job_.opt.peer_timeout_s;
  sums.seconds = took;  // the prompts decoded together: their own times overlap
  if (took > 0.5 * limit) {
    std::fprintf(stderr,
                 "[dflash] warning: rank %d measured tau in %.0f s, over half of --peer-timeout %.0f s (the targets wait "
                 "for credits meanwhile): raise --peer-timeout, or lower --eval-tau-prompts / --eval-tau-max-new-tokens\n",
                 job_.topo.world_rank, took, limit);
    std::fflush(stderr);
  }
  return sums;
}

void DrafterTau::fill(EvalMetrics& m, const TauSums& all) {
  m.tau = all.tau();
  m.tau_prompts = static_cast<int64_t>(all.prompts);
  m.tau_new_tokens = static_cast<int64_t>(all.new_tokens);
  m.tau_steps = static_cast<int64_t>(all.steps);
  m.tau_seconds = all.seconds;
}

}  // namespace dflash
