// dflash-eval: a drafter's acceptance length tau with its target, by DFlash's own greedy speculative
// decoding (include/dflash/spec_decode.h), on either backend.
//
//   dflash-eval --target DIR (--drafter DIR | --fresh-drafter) --prompts DATA.h5 [options]
//
// Prompts come from a token dataset (docs/data.md): each record's tokens before its first loss_mask = 1
// position (what dflash-tokenize writes for a conversation: the chat up to the assistant's answer).
// tau is reported as the reference benchmark does: the mean over prompts of each prompt's mean
// acceptance length per target verification, counted as the official dflash_generate counts it (the tokens
// a step keeps: accepted drafts + 1, cut at the token limit and after a stop token; the last block is
// drafted and verified over only the rows left before the limit: official_verify_rows, official_step_count,
// include/dflash/spec_decode.h; docs/recipe.md section 6 cites the official code read).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/backend.h"
#include "dflash/data.h"
#include "dflash/drafter.h"
#include "dflash/error.h"
#include "dflash/eval_prompts.h"
#include "dflash/hf_config.h"
#include "dflash/spec_decode.h"
#include "dflash/target.h"
#include "dflash/target_quant.h"
#include "dflash/tool_args.h"
#include "dflash/version.h"

using namespace dflash;

namespace {

const char* kUsage =
    "usage: dflash-eval --target DIR (--drafter DIR | --fresh-drafter) --prompts DATA.h5 [options]\n"
    "       dflash-eval --help | --version\n"
    "  --target DIR          the target checkpoint (config.json + safetensors)\n"
    "  --drafter DIR         a drafter in the release format (what dflash-train exports)\n"
    "  --fresh-drafter       an untrained drafter instead (the baseline: tau 1.0), with\n"
    "    --draft-layers N    its layers (default 1)   --seed N  its init seed (default 0)\n"
    "  --prompts DATA.h5     token dataset; a record's prompt = its tokens before the first loss_mask 1\n"
    "  --max-prompts N       the first N usable records (default 32)\n"
    "  --max-prompt-length N longer prompts are skipped and counted (default 2048)\n"
    "  --max-new-tokens N    tokens generated per prompt (default 128)\n"
    "  --stop-token ID       stop after this id (repeatable; default: eos_token_id of the target's\n"
    "                        config.json and generation_config.json)   --no-stop  never stop early\n"
    "  --backend cpu|cuda    float32 reference or bf16 GPU (default cpu)   --gpu N  CUDA device (default 0)\n"
    "  --check-greedy        also decode each prompt with the target alone and require the same tokens\n"
    "                        (speculative decoding is lossless; exit 9 if not)\n"
    "  --temperature T       sampled decoding at T > 0 (default 0: greedy), as the official dflash_generate:\n"
    "    --top-p P --top-k K the target's (and a DFlash drafter's) sampling (defaults 1, 0 = off);\n"
    "                        drafts accepted by rejection sampling (lossless in distribution); draws seeded\n"
    "                        by --seed; DFlash2 drafters draw from the selector's walk\n"
    "  --prompt-batch N      prompts decoding together: each step packs their sequences into one target\n"
    "                        forward (default 16; 1 = one after another; the same tokens and tau either way)\n"
    "  --max-batch-tokens N  the most tokens one packed target forward holds: prompts wait for room\n"
    "                        (default 32768; the target's buffers are sized for min(this, what\n"
    "                        --prompt-batch prompts + their new tokens need))\n"
    "  --target-precision P  bf16|fp8|fp8-dynamic: how the target's linears run, as dflash-train's option\n"
    "                        (fp8 quantizes a bf16 checkpoint on load into 128x128 blocks; default: the\n"
    "                        checkpoint's own precision): a drafter's tau under the FP8 target it is served with\n"
    "  --json PATH           write every number (per prompt and overall) as JSON\n";

struct EvalArgs {
  std::string target, drafter, prompts, json, backend = "cpu", target_precision;
  bool fresh = false, check_greedy = false, no_stop = false, help = false;
  int draft_layers = 1, max_prompts = 32, max_prompt_length = kDefaultMaxPromptLength, max_new_tokens = 128, gpu = 0;
  int prompt_batch = kDefaultPromptBatch;
  int64_t max_batch_tokens = 32768;
  uint64_t seed = 0;
  std::vector<int32_t> stop;
  SamplingSpec sampling;
};

EvalArgs parse_args(int argc, char** argv) {
  EvalArgs a;
  ToolArgs args(argc, argv, kUsage);
  while (args.next()) {
    if (args.help()) {
      a.help = true;
      return a;
    } else if (args.is("--target")) a.target = args.value();
    else if (args.is("--drafter")) a.drafter = args.value();
    else if (args.is("--fresh-drafter")) args.no_value(), a.fresh = true;
    else if (args.is("--draft-layers")) a.draft_layers = static_cast<int>(args.integer(1, 256));
    else if (args.is("--seed")) a.seed = static_cast<uint64_t>(args.integer(0, 1LL << 62));
    else if (args.is("--prompts")) a.prompts = args.value();
    else if (args.is("--max-prompts")) a.max_prompts = static_cast<int>(args.integer(1, 1 << 30));
    else if (args.is("--max-prompt-length")) a.max_prompt_length = static_cast<int>(args.integer(1, 1 << 24));
    else if (args.is("--max-new-tokens")) a.max_new_tokens = static_cast<int>(args.integer(1, 1 << 20));
    else if (args.is("--stop-token")) a.stop.push_back(static_cast<int32_t>(args.integer(0, (1LL << 31) - 1)));
    else if (args.is("--no-stop")) args.no_value(), a.no_stop = true;
    else if (args.is("--backend")) a.backend = args.value();
    else if (args.is("--gpu")) a.gpu = static_cast<int>(args.integer(0, 1023));
    else if (args.is("--check-greedy")) args.no_value(), a.check_greedy = true;
    else if (args.is("--json")) a.json = args.value();
    else if (args.is("--target-precision")) a.target_precision = args.value();
    else if (args.is("--prompt-batch")) a.prompt_batch = static_cast<int>(args.integer(1, 1 << 16));
    else if (args.is("--max-batch-tokens")) a.max_batch_tokens = args.integer(1, 1LL << 31);
    else if (args.is("--temperature")) a.sampling.temperature = static_cast<float>(args.real(0.0, 100.0));
    else if (args.is("--top-p")) a.sampling.top_p = static_cast<float>(args.real(1e-6, 1.0));
    else if (args.is("--top-k")) a.sampling.top_k = static_cast<int>(args.integer(0, 1 << 24));
    else args.unknown();
  }
  DF_CHECK_HINT(!a.target.empty() && !a.prompts.empty(), BadOptions, "--target and --prompts are required", kUsage);
  DF_CHECK_HINT(a.fresh != !a.drafter.empty(), BadOptions, "give exactly one of --drafter DIR and --fresh-drafter",
                kUsage);
  DF_CHECK_HINT(a.backend == "cpu" || a.backend == "cuda", BadOptions, "--backend must be cpu or cuda", kUsage);
  DF_CHECK_HINT(!(a.no_stop && !a.stop.empty()), BadOptions, "--no-stop and --stop-token contradict", kUsage);
  DF_CHECK_HINT(!(a.check_greedy && a.sampling.temperature > 0), BadOptions,
                "--check-greedy compares with greedy decoding: it needs --temperature 0",
                "sampled decoding is lossless in distribution, not token for token: drop one of them");
  a.sampling.seed = a.seed;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  if (print_version_if_asked(argc, argv, "dflash-eval")) return 0;
  process_identity().role = "tool";
  const EvalArgs a = parse_args(argc, argv);
  if (a.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const Device device = a.backend == "cuda" ? Device::CUDA : Device::CPU;
  if (device == Device::CUDA) process_identity().gpu = a.gpu;
  const Ctx ctx = make_ctx(device, a.gpu);

  TargetConfig tcfg = load_target_config(a.target);
  resolve_target_precision(tcfg.quant, a.target_precision);
  TrainOptions topt;
  topt.seed = a.seed;
  const TokenDataset ds(a.prompts, tcfg.text.vocab_size);
  const EvalPrompts prompts = load_eval_prompts(ds, a.max_prompts, a.max_prompt_length);
  const size_t longest = prompts.longest();

  // The target packs up to --prompt-batch prompts per forward, bounded by --max-batch-tokens; the drafter
  // drafts their blocks together (their sequences + a block each).
  std::vector<size_t> lengths;
  for (const auto& p : prompts.ids) lengths.push_back(p.size());
  const int64_t packed = packed_tokens_for(lengths, a.max_new_tokens, a.prompt_batch, a.max_batch_tokens,
                                           "--max-batch-tokens");
  // The drafter first (its config names the layers the target must capture), then the target.
  topt.max_anchors = a.prompt_batch;
  const DrafterSource source = DrafterSource::from_dirs(a.target, a.fresh ? "" : a.drafter, a.draft_layers, topt);
  const int64_t block = source.drafter.block_size;
  const int64_t max_tokens = static_cast<int64_t>(longest) + a.max_new_tokens + block;
  DrafterTrainer drafter(source, topt, ctx, std::max(max_tokens, packed + a.prompt_batch * block));
  const DrafterConfig& dc = drafter.config();
  auto target = make_target_model(tcfg, a.target, ctx, dc.target_layer_ids, packed);
  SpecDecoder dec(*target, drafter, ctx, max_tokens, packed, a.prompt_batch);
  dec.set_sampling(a.sampling);
  const std::vector<int32_t> stop = a.no_stop ? std::vector<int32_t>{} : a.stop.empty() ? default_stop_ids(a.target) : a.stop;

  std::printf("# dflash-eval %s\n", DFLASH_VERSION);
  const char* linears = tcfg.quant.precision == TargetPrecision::Bf16 ? "bf16"
                        : tcfg.quant.token_channel()                    ? "fp8 per token x per channel"
                                                                        : "fp8 blocks";
  std::printf("# target   %s (%s, %d layers, vocab %d, %s linears)\n", a.target.c_str(),
              target_family_name(tcfg.family), tcfg.text.num_hidden_layers, tcfg.text.vocab_size, linears);
  std::printf("# drafter  %s (%d layers, block %d, mask token %d, target layers", a.fresh ? "fresh, untrained" : a.drafter.c_str(),
              dc.layers.num_hidden_layers, dc.block_size, dc.mask_token_id);
  for (int l : dc.target_layer_ids) std::printf(" %d", l);
  std::printf(")\n# backend  %s (%s)\n", a.backend.c_str(), device == Device::CPU ? "float32" : "bf16");
  if (a.sampling.temperature > 0)
    std::printf("# sampling temperature %g, top-p %g, top-k %d, seed %llu (rejection sampling; %s drafts)\n",
                a.sampling.temperature, a.sampling.top_p, a.sampling.top_k, static_cast<unsigned long long>(a.seed),
                dc.arch == DraftArch::DFlash2 ? "the selector's sampled walk" : "the drafter's sampled");
  else
    std::printf("# sampling greedy (temperature 0)\n");
  std::printf("# prompts  %zu from %s (skipped: %zu with no prompt, %zu longer than %d); %d new tokens each; stop ids",
              prompts.ids.size(), a.prompts.c_str(), prompts.no_prompt, prompts.too_long, a.max_prompt_length,
              a.max_new_tokens);
  for (int32_t s : stop) std::printf(" %d", s);
  std::printf("%s\n", stop.empty() ? " none" : "");
  std::printf("%8s %8s %8s %8s %8s %8s %10s%s\n", "prompt", "record", "prompt", "new", "steps", "tau", "tok/s",
              a.check_greedy ? "  greedy" : "");
  std::printf("%8s %8s %8s %8s %8s %8s %10s%s\n", "", "", "tokens", "tokens", "", "", "", a.check_greedy ? "  check" : "");

  nlohmann::json jp = nlohmann::json::array();
  std::map<int, int64_t> hist;
  TauSums sums;  // tau as dflash-train's --eval-tau-every computes it (include/dflash/eval_prompts.h)
  int mismatches = 0;
  std::vector<DecodePrompt> todo;
  for (size_t i = 0; i < prompts.ids.size(); ++i) todo.push_back({&prompts.ids[i], i});  // stream: the prompt's index
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<SpecDecodeResult> results = dec.generate_batch(todo, a.max_new_tokens, stop);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < prompts.ids.size(); ++i) {
    const SpecDecodeResult& r = results[i];
    std::string check;
    if (a.check_greedy) {
      const bool same = dec.greedy(prompts.ids[i], a.max_new_tokens, stop) == r.tokens;
      check = same ? "  same" : "  DIFFERENT";
      mismatches += same ? 0 : 1;
    }
    for (int x : r.acceptance) ++hist[x];
    sums.add(r);
    std::printf("%8zu %8zu %8zu %8zu %8zu %8.3f %10.1f%s\n", i, prompts.record[i], prompts.ids[i].size(),
                r.tokens.size(), r.acceptance.size(), r.tau(), r.tokens.size() / std::max(r.seconds, 1e-9),
                check.c_str());
    std::fflush(stdout);
    jp.push_back({{"record", prompts.record[i]}, {"prompt_tokens", prompts.ids[i].size()},
                  {"new_tokens", r.tokens.size()}, {"tau", r.tau()}, {"acceptance", r.acceptance},
                  {"seconds", r.seconds}, {"tokens", r.tokens}});
  }
  const double tau = sums.tau();
  const auto steps = static_cast<int64_t>(sums.steps), new_tokens = static_cast<int64_t>(sums.new_tokens);
  const double accepted = sums.accepted;
  std::printf("tau %.3f  (mean over %zu prompts of each prompt's mean acceptance length; over all %lld steps %.3f)\n",
              tau, prompts.ids.size(), static_cast<long long>(steps),
              steps ? accepted / static_cast<double>(steps) : 0.0);
  std::printf("acceptance length histogram:");
  for (const auto& [len, count] : hist) std::printf(" %d:%.1f%%", len, 100.0 * count / static_cast<double>(steps));
  std::printf("\ntokens/s %.1f  (%lld tokens in %.2f s, %d prompt(s) at a time; no KV cache: this tool's speed, not a "
              "serving engine's)\n",
              new_tokens / std::max(seconds, 1e-9), static_cast<long long>(new_tokens), seconds, dec.prompt_batch());
  const DecodeTimes& dt = dec.times();
  std::printf("time     %.2f s: target %.2f s (forward, lm_head, logits download), drafter %.2f s, host verification "
              "%.2f s; %lld packed steps\n",
              seconds, dt.target, dt.draft, dt.verify, static_cast<long long>(dt.steps));
  if (a.check_greedy)
    std::printf("greedy check: %d of %zu prompts differ from the target's own greedy decoding\n", mismatches,
                prompts.ids.size());
  if (!a.json.empty()) {
    nlohmann::json j = {{"tau", tau}, {"prompts", jp}, {"steps", steps}, {"new_tokens", new_tokens},
                        {"seconds", seconds}, {"prompt_batch", dec.prompt_batch()},
                        {"seconds_split", {{"target", dt.target}, {"drafter", dt.draft}, {"verify", dt.verify},
                                           {"packed_steps", dt.steps}}},
                        {"packed_tokens", dec.packed_tokens()}, {"backend", a.backend}, {"block_size", dc.block_size},
                        {"target", a.target}, {"target_linears", linears}, {"drafter", a.fresh ? "" : a.drafter}, {"stop", stop},
                        {"greedy_mismatches", a.check_greedy ? nlohmann::json(mismatches) : nlohmann::json()}};
    std::ofstream out(a.json + ".tmp");
    out << j.dump(1) << "\n";
    out.close();
    DF_CHECK(out.good() && std::rename((a.json + ".tmp").c_str(), a.json.c_str()) == 0, SystemFailure,
             "cannot write " << a.json);
  }
  if (mismatches > 0)
    fatal(ExitCode::Internal, std::to_string(mismatches) + " prompts decoded differently from the target's greedy",
          "speculative decoding must be lossless: report this with the command line");
  return 0;
}
