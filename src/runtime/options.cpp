// dflash-train's options: Boost.ProgramOptions, command line first, then --config, notify once.
#include "dflash/options.h"

#include <sys/stat.h>

#include <boost/program_options.hpp>
#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "dflash/anchors.h"     // default_max_anchors
#include "dflash/checkpoint.h"  // parse_checkpoint_every
#include "report_sidecar.h"       // parse_report_to
#include "dflash/error.h"
#include "dflash/schedule.h"  // grad_accum_for

namespace po = boost::program_options;

namespace dflash {

const char* data_plane_choice_name(DataPlaneChoice c) {
  switch (c) {
    case DataPlaneChoice::Auto: return "auto";
    case DataPlaneChoice::Nccl: return "nccl";
    case DataPlaneChoice::CudaMpi: return "cuda-mpi";
    case DataPlaneChoice::Host: return "host";
  }
  return "?";
}

const char* long_record_name(LongRecordPolicy p) {
  switch (p) {
    case LongRecordPolicy::Error: return "error";
    case LongRecordPolicy::Cut: return "cut";
    case LongRecordPolicy::Skip: return "skip";
  }
  return "?";
}

const char* batch_order_name(BatchOrder b) { return b == BatchOrder::Arrival ? "arrival" : "fixed"; }

std::string TopologySpec::to_string() const {
  return std::to_string(targets_per_node) + "-" + std::to_string(drafters_per_node);
}

TopologySpec parse_topology_spec(const std::string& text) {
  const char* hint = "--topology T-D: T target ranks and D drafter ranks per node, both >= 1, e.g. 7-1 or 6-2";
  DF_CHECK_HINT(text != "auto", BadOptions, "--topology auto is resolved at startup, not parsed as T-D", hint);
  size_t dash = text.find('-');
  auto is_count = [](const std::string& s) {
    return !s.empty() && s.size() <= 4 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  DF_CHECK_HINT(dash != std::string::npos && is_count(text.substr(0, dash)) && is_count(text.substr(dash + 1)),
                BadOptions, "bad --topology '" << text << "'", hint);
  TopologySpec spec;
  spec.targets_per_node = std::stoi(text.substr(0, dash));
  spec.drafters_per_node = std::stoi(text.substr(dash + 1));
  DF_CHECK_HINT(spec.targets_per_node >= 1 && spec.drafters_per_node >= 1, BadOptions,
                "bad --topology '" << text << "': a job needs at least one target and one drafter per node", hint);
  return spec;
}

namespace {

template <class T> std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

bool path_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// Every option with a placeholder for its value (DIR, N, T-D, ...) and its default as a person writes it
// (6e-4, not 0.000600000028); test hooks in a group of their own, shown by --help-all only.
struct Described {
  po::options_description visible{"dflash-train: trains a DFlash drafter; run with mpirun, one rank per GPU.\n"
                                  "Usage: mpirun -np N dflash-train --topology T-D --target DIR --data FILE.h5 --out DIR [options]\n"
                                  "       dflash-train --version | --help | --help-all (also the test hooks)\n\nOptions"};
  po::options_description hooks{"Test hooks (for the test suite; not for training runs)"};
  po::options_description all;
};

Described describe(Options& o, std::vector<std::string>& data_files, std::string& topology, std::string& backend, std::string& loss,
                   std::string& long_record, std::string& export_dtype, std::string& fail_mode,
                   std::string& batch_order, std::string& data_plane, std::string& seed,
                   std::string& deterministic, std::string& rebalance, std::string& eval_max_tokens,
                   std::string& optimizer_state) {
  Described d;
  po::options_description job("Job");
  job.add_options()
    ("help,h", "print this help and exit")
    ("help-all", "print this help with the test hooks and exit")
    ("version", "print the version and exit")
    ("dry-run", po::bool_switch(&o.dry_run), "print the resolved options, the topology (every rank's role) and the schedule, then exit: no model or data is loaded")
    ("ranks", po::value(&o.plan_ranks)->value_name("N"), "with --dry-run: plan a world of N ranks (on one node, or over --nodes) in this one process, without mpirun")
    ("nodes", po::value(&o.plan_nodes)->value_name("N"), "with --dry-run: plan N nodes of --gpus-per-node ranks each")
    ("gpus-per-node", po::value(&o.plan_ranks_per_node)->value_name("G"), "with --dry-run: ranks (one per GPU) on each planned node")
    ("gpu", po::value(&o.plan_gpu)->value_name("NAME|GIB"), "with --dry-run --backend cuda: check each rank's memory against this GPU: h100 | h200 | b200 | rtx-pro-6000, or its memory in GiB (default: this node's GPU 0 when NVML sees one)")
    ("config", po::value(&o.config_file)->value_name("FILE"), "key = value file with the same option names; the command line overrides it")
    ("topology", po::value(&topology)->default_value("1-1")->value_name("T-D"), "T-D: target and drafter ranks per node (the rest idle), or auto: measure both roles, pick the fastest split")
    ("backend", po::value(&backend)->default_value("cpu")->value_name("NAME"), "cpu | cuda")
    ("target", po::value(&o.target_dir)->value_name("DIR"), "Hugging Face Qwen3 checkpoint directory (config.json + safetensors)")
    ("drafter", po::value(&o.drafter_dir)->value_name("DIR"), "release-format drafter to start from (default: a fresh one)")
    ("draft-layers", po::value(&o.draft_layers)->default_value(5)->value_name("N"), "layers of a fresh drafter")
    ("block-size", po::value(&o.train.block_size)->default_value(16)->value_name("N"), "a fresh drafter's block: the anchor and N-1 tokens guessed at once")
    ("mask-token", po::value(&o.mask_token)->default_value("auto")->value_name("ID|TOKEN"), "a fresh drafter's mask token: auto (an unused id of the target family: Qwen3 151669, Qwen3.5/3.6 248070, else vocab-1), an id, or a token looked up in the target's tokenizer.json")
    ("target-layers", po::value(&o.target_layers)->value_name("L1,L2,..."), "target layers a fresh drafter reads (l = output of decoder layer l; default: DFlash's rule, round(1 + i(L-4)/(n-1)) for n = --draft-layers > 1, the middle layer L/2 for n = 1)")
    ("draft-layer-types", po::value(&o.draft_layer_types)->value_name("T1,T2,..."), "a fresh drafter's attention, one per layer: full | sliding (default: all full; the Qwen3.6-27B recipe: sliding,sliding,sliding,sliding,full)")
    ("draft-sliding-window", po::value(&o.train.sliding_window)->default_value(0)->value_name("N"), "keys a sliding drafter layer sees (the Qwen3.6-27B recipe: 2048)")
    ("draft-arch", po::value(&o.draft_arch)->default_value("dflash")->value_name("NAME"), "a fresh drafter's architecture: dflash | dflash2 (grouped dynamic causal convs + a candidate selector, docs/dflash2.md); a --drafter DIR's config.json says its own")
    ("conv-kernel-size", po::value(&o.train.d2.conv_kernel_size)->default_value(2)->value_name("K"), "dflash2: taps of each grouped dynamic causal conv")
    ("conv-group-size", po::value(&o.train.d2.conv_group_size)->default_value(16)->value_name("N"), "dflash2: channels per conv group (must divide the hidden size)")
    ("selector-top-k", po::value(&o.train.d2.selector_top_k)->default_value(16)->value_name("K"), "dflash2: unary candidates the selector reranks per position (1..64)")
    ("selector-rank", po::value(&o.train.d2.selector_rank)->default_value(256)->value_name("R"), "dflash2: rank of the selector's codebooks")
    ("output-multiplier", po::value(&o.train.output_multiplier)->default_value(1.0f, "1")->value_name("X"), "a fresh drafter's logit multiplier (compute_logits: z = X * lm_head(h))")
    ("logit-softcap", po::value(&o.train.logit_softcap)->default_value(0.0f, "0")->value_name("C"), "a fresh drafter's final logit softcap, z = C tanh(z / C) (0 = off)")
    ("data", po::value(&data_files)->value_name("FILE.h5[:W]"), "token dataset (HDF5, docs/data.md); several, each with a weight, train on a mix of them: --data a.h5:0.7 --data b.h5:0.3 (the shares of an epoch's records, docs/data.md \"Mixing datasets\")")
    ("out", po::value(&o.out_dir)->value_name("DIR"), "run directory: metrics.h5, drafter/ (the exported drafter)");
  po::options_description data("Data and flow");
  data.add_options()
    ("token-budget", po::value(&o.token_budget)->default_value(32768)->value_name("N"), "max tokens per packed batch")
    ("prefetch-depth", po::value(&o.prefetch_depth)->default_value(4)->value_name("N"), "batches the loader may hold ready per target (q_pre)")
    ("hs-queue-depth", po::value(&o.hs_queue_depth)->default_value(4)->value_name("N"), "receive slots = credits per drafter (q_hs)")
    ("data-plane", po::value(&data_plane)->default_value("auto")->value_name("NAME"), "how hidden states travel: auto (nccl, else cuda-mpi, else host) | nccl (GPU to GPU; a GPU per rank) | cuda-mpi (a CUDA-aware MPI) | host (through host memory; always works)")
    ("batch-order", po::value(&batch_order)->default_value("arrival")->value_name("NAME"), "arrival (first come, best throughput) | fixed (a pure function of the topology: same losses on every run and across a resume)")
    ("deterministic", po::value(&deterministic)->default_value("auto")->value_name("WHEN"), "auto (on with --batch-order fixed) | on | off: CUDA kernels that sum in a fixed order, so the same inputs give bit-identical steps and a resume reproduces the straight run (about 4% slower)")
    ("long-record", po::value(&long_record)->default_value("error")->value_name("NAME"), "record longer than --token-budget: error | cut | skip")
    ("epochs", po::value(&o.epochs)->default_value(1)->value_name("N"), "passes over the data (0 = forever; with --max-steps and no --epochs: as many as --max-steps takes, as HF Trainer)")
    ("max-steps", po::value(&o.max_steps)->default_value(0)->value_name("N"), "stop after this many (optimizer) steps (0 = when the data ends); without --epochs the data repeats until then")
    ("peer-timeout", po::value(&o.peer_timeout_s)->default_value(120.0, "120")->value_name("SECONDS"), "seconds any wait on a peer may take before the job ends with exit 7")
    ("grad-bucket-mb", po::value(&o.grad_bucket_mb)->default_value(25.0, "25")->value_name("MIB"), "with several drafters: MiB of gradient per allreduce bucket; buckets are summed while the backward still runs (as PyTorch DDP); 0 = one allreduce after the backward");
  po::options_description train("Training");
  train.add_options()
    ("loss", po::value(&loss)->default_value("ce")->value_name("NAME"), "ce | kl")
    ("dpace", po::bool_switch(&o.train.dpace), "D-PACE position weights")
    ("selector-loss-alpha", po::value(&o.train.selector_loss_alpha)->default_value(1.0f, "1")->value_name("X"), "dflash2: weight of the selector's CE over the unary top-K (the gold inserted when missing) beside the unary loss")
    ("selector-stop-gradient", po::bool_switch(&o.train.selector_stop_gradient), "dflash2: detach the selector's inputs (its loss moves only the selector)")
    ("gamma", po::value(&o.train.gamma)->default_value(7.0f, "7")->value_name("X"), "position decay exp(-(k-1)/gamma)")
    ("max-anchors", po::value(&o.train.max_anchors)->default_value(512)->value_name("N"), "anchors per packed batch at most: the drafter's buffers (loss rows, block attention) are sized by it (default 512; with --anchors-per-record N: N per 3072 tokens of --token-budget)")
    ("anchors-per-record", po::value(&o.train.anchors_per_record)->default_value(0)->value_name("N"), "up to N anchors in each record of a packed batch, among its valid positions, redrawn every step (the reference trainers' rule: 512); 0 = per batch only")
    ("hs-noise", po::value(&o.train.hs_noise)->default_value(0.0f, "0")->value_name("STD"), "std of Gaussian noise on target features")
    ("grad-accum", po::value(&o.grad_accum)->default_value(1)->value_name("K"), "micro-batches (packed batches) per optimizer step on each drafter, the loss normalised over all of them as one large batch; the lr schedule, --max-steps and checkpoints count optimizer steps")
    ("global-batch-tokens", po::value(&o.global_batch_tokens)->default_value(0)->value_name("T"), "pick --grad-accum so one optimizer step holds about T tokens: K = ceil(T / (--token-budget x drafters)); 0 = --grad-accum decides (the reference recipes step on ~98K to ~262K tokens)")
    ("lr", po::value(&o.train.lr)->default_value(6e-4f, "6e-4")->value_name("LR"), "peak learning rate (AdamW)")
    ("warmup-steps", po::value(&o.train.warmup_steps)->default_value(0)->value_name("N"), "linear warmup steps")
    ("warmup-ratio", po::value(&o.warmup_ratio)->default_value(0.0, "0")->value_name("X"), "linear warmup over this fraction of the run's planned steps (instead of --warmup-steps); the lr then decays by cosine to --min-lr-ratio x --lr at the run's end: the data's last batch, or --max-steps")
    ("min-lr-ratio", po::value(&o.train.min_lr_ratio)->default_value(0.0f, "0")->value_name("X"), "where the cosine ends, as a fraction of --lr (0: decays to 0, as SpecForge's schedule)")
    ("adam-beta1", po::value(&o.train.beta1)->default_value(0.9f, "0.9")->value_name("X"), "AdamW beta1 (default: torch.optim.AdamW's, as SpecForge)")
    ("adam-beta2", po::value(&o.train.beta2)->default_value(0.999f, "0.999")->value_name("X"), "AdamW beta2 (default: torch.optim.AdamW's, as SpecForge)")
    ("adam-eps", po::value(&o.train.eps)->default_value(1e-8f, "1e-8")->value_name("X"), "AdamW epsilon")
    ("weight-decay", po::value(&o.train.weight_decay)->default_value(0.0f, "0")->value_name("X"), "AdamW decoupled weight decay, p -= lr * X * p on every parameter (default 0, as SpecForge)")
    ("optimizer-state", po::value(&optimizer_state)->default_value("fp32")->value_name("NAME"), "fp32 (fp32 master weights and AdamW moments) | bf16 (bf16 weights and moments, each update computed in fp32 and stochastically rounded: 8 B per parameter less on CUDA; checkpoints stay fp32, so a resume may switch)")
    ("seed", po::value(&seed)->default_value("0")->value_name("N"), "seed of data order, init and anchors (0 .. 2^63-1)")
    ("eval-data", po::value(&o.eval_data)->value_name("FILE.h5"), "held-out token dataset (the --data format): loss, acc, acc by block position and streak on it, written to metrics.h5 /eval; its features are computed once at startup")
    ("eval-max-tokens", po::value(&eval_max_tokens)->default_value("auto")->value_name("N|auto"), "with --eval-data: evaluate at most N of its tokens; a larger file is evaluated on a fixed sample of whole records that fits (the same on every rank, split and resume). auto: what one drafter's 2 GiB of eval features holds at this drafter's shape (about 52K tokens at the Qwen3-8B shape on CUDA)")
    ("eval-every", po::value(&o.eval_every)->value_name("N"), "with --eval-data: evaluate every N steps and after the last (0 = only after the last; default: the --checkpoint-every step interval, else a tenth of the planned steps)")
    ("eval-tau-every", po::value(&o.eval_tau_every)->default_value(0)->value_name("N"), "with --eval-data: every N steps and after the last, also measure tau (acceptance length) by greedy speculative decoding of the eval set's prompts, as dflash-eval does (metrics.h5 /eval/tau, the [eval] line; OUT/drafter-best is kept by it). Costs GPU time: each drafter rank loads the target too and decodes its share of the prompts while training waits (0 = off)")
    ("eval-tau-prompts", po::value(&o.eval_tau_prompts)->default_value(32)->value_name("N"), "with --eval-tau-every: the first N usable prompts of the eval set (a record's tokens before its first loss_mask 1), split among the drafters")
    ("eval-tau-max-new-tokens", po::value(&o.eval_tau_max_new_tokens)->default_value(128)->value_name("N"), "with --eval-tau-every: tokens generated per prompt");
  po::options_description out("Output");
  out.add_options()
    ("log-every", po::value(&o.log_every)->default_value(10)->value_name("N"), "status line and rank timings every N steps")
    ("metrics-flush-every", po::value(&o.metrics_flush_every)->default_value(10)->value_name("N"), "flush metrics.h5 after N appends")
    ("export-dtype", po::value(&export_dtype)->default_value("bf16")->value_name("DTYPE"), "dtype of the exported drafter: bf16 | f32")
    ("checkpoint-every", po::value(&o.checkpoint_every)->value_name("N|Nm"), "N steps or Nm minutes (0 = only on SIGUSR1/SIGTERM)")
    ("checkpoint-dir", po::value(&o.checkpoint_dir)->value_name("DIR"), "where checkpoints go (default OUT/checkpoints)")
    ("keep-checkpoints", po::value(&o.keep_checkpoints)->default_value(3)->value_name("N"), "complete checkpoints kept (older ones are deleted)")
    ("export-checkpoints", po::bool_switch(&o.export_checkpoints), "also export each checkpoint's drafter into STEP_DIR/drafter")
    ("resume", po::value(&o.resume)->value_name("auto|PATH"), "auto (the newest complete checkpoint, or a fresh start) | PATH (a checkpoint or checkpoint dir)")
    ("power-budget-w", po::value(&o.power_budget_w)->default_value(0.0, "0")->value_name("W"), "with --topology auto: the fastest split within this many watts (needs power readings)")
    ("report-to", po::value(&o.report_to)->value_name("LIST"), "tensorboard,csv,wandb: the run's series in OUT/tensorboard, OUT/csv and (at the end of each job, offline) OUT/wandb while it trains, by tools/dflash-report in the background")
    ("report-every", po::value(&o.report_every_min)->default_value(10.0, "10")->value_name("MIN"), "--report-to: minutes between exports")
    ("rebalance", po::value(&rebalance)->default_value("off")->value_name("auto|off"), "auto: at each checkpoint, when this run's measured service times predict another split of the node's GPUs --rebalance-min-gain faster (within --power-budget-w), every rank takes its new role in place (needs --checkpoint-every)")
    ("rebalance-min-gain", po::value(&o.rebalance_min_gain_pct)->default_value(5.0, "5")->value_name("PCT"), "--rebalance auto: the predicted gain (percent) a change of split must reach")
    ("measure-only", po::bool_switch(&o.measure_only), "with --topology auto: measure each role standalone on every rank, print the what-if table, exit (no training; any rank count)");
  d.hooks.add_options()
    ("inject-delay-target-ms", po::value(&o.inject_delay_target_ms)->default_value(0)->value_name("MS"), "sleep per batch on targets")
    ("inject-delay-drafter-ms", po::value(&o.inject_delay_drafter_ms)->default_value(0)->value_name("MS"), "sleep per step on drafters")
    ("inject-fail-rank", po::value(&o.inject_fail_rank)->default_value(-1)->value_name("RANK"), "world rank that fails on purpose")
    ("inject-fail-step", po::value(&o.inject_fail_step)->default_value(-1)->value_name("N"), "batch (target) or step (drafter) at which it fails; an idle rank fails as soon as it waits for the end of the run")
    ("inject-fail-mode", po::value(&fail_mode)->default_value("kill")->value_name("MODE"), "kill (SIGKILL) | hang (SIGSTOP: silent, alive)")
    ("inject-stop-step", po::value(&o.inject_stop_step)->default_value(-1)->value_name("N"), "the drafters act as on a stop signal after optimizer step N: checkpoint, exit 75")
    ("inject-trace-dir", po::value(&o.inject_trace_dir)->value_name("DIR"), "each rank appends the batches it sent (targets: their records) or trained on (drafters) to DIR/trace.rankNNNNN")
    ("inject-eval-budget-bytes", po::value(&o.inject_eval_budget_bytes)->default_value(0)->value_name("BYTES"), "eval features a drafter may keep, instead of 2 GiB (0 = 2 GiB): a small one makes the tiny model's eval set too large");
  d.visible.add(job).add(data).add(train).add(out);
  d.all.add(d.visible).add(d.hooks);
  return d;
}

// A repeated option resolves the way launchers and job scripts expect: the last one wins. A script that
// passes `--topology 7-1 "$@"` then takes `sbatch train-1node.sbatch --topology 6-1` (Boost would refuse
// the second --topology as "multiple occurrences"). Not --data: several are a mix (check_data_sources),
// and a second file must not replace the first without a word.
void keep_last_occurrence(po::parsed_options& parsed) {
  std::vector<po::option> kept;
  std::set<std::string> seen;
  for (auto it = parsed.options.rbegin(); it != parsed.options.rend(); ++it) {
    if (it->string_key.empty() || it->string_key == "data" || seen.insert(it->string_key).second)
      kept.push_back(*it);  // (positional: keep)
  }
  parsed.options.assign(kept.rbegin(), kept.rend());
}

// argv joined into one line a shell would run again: arguments with anything but [A-Za-z0-9_./:=,+@%-]
// single-quoted.
std::string shell_line(int argc, const char* const* argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (i) line += ' ';
    const bool plain = !a.empty() && a.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                         "0123456789_./:=,+@%-") == std::string::npos;
    if (plain) {
      line += a;
      continue;
    }
    line += '\'';
    for (char c : a) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += '\'';
  }
  return line;
}

// Edit distance (insertions, deletions, substitutions, adjacent swaps) between two option names.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The known option nearest to a mistyped one ("--topolgy" -> "topology"), or "" when none is close: at most
// a third of the name's letters (and at least 2) changed, so a made-up flag gets no wild guess.
std::string nearest_option(std::string given, const po::options_description& desc) {
  given.erase(0, given.find_first_not_of('-'));
  if (const size_t eq = given.find('='); eq != std::string::npos) given.resize(eq);
  std::string best;
  size_t best_d = std::max<size_t>(2, given.size() / 3) + 1;
  for (const auto& opt : desc.options()) {
    const std::string& name = opt->long_name();
    const size_t dist = edit_distance(given, name);
    if (dist < best_d) best_d = dist, best = name;
  }
  return best;
}

void check_range(bool ok, const char* flag, const std::string& value, const char* rule) {
  DF_CHECK_HINT(ok, BadOptions, "bad value " << value << " for --" << flag, std::string("--") + flag + " must be " + rule);
}

// --ranks / --nodes / --gpus-per-node / --gpu: a dry run's own world and GPU (docs/pipeline.md "Options").
void resolve_planned_world(Options& o, bool ranks, bool nodes, bool per_node) {
  const char* hint = "the job runs on the world mpirun/srun starts and the GPUs it finds: add --dry-run to see the "
                     "plan for this world here, or drop the flag";
  DF_CHECK_HINT(o.dry_run || !(ranks || nodes || per_node), BadOptions,
                "--ranks, --nodes and --gpus-per-node plan a --dry-run's world", hint);
  DF_CHECK_HINT(o.dry_run || o.plan_gpu.empty(), BadOptions, "--gpu names the GPU a --dry-run plans for", hint);
  DF_CHECK_HINT(o.plan_gpu.empty() || o.backend == Device::CUDA, BadOptions,
                "--gpu " << o.plan_gpu << " with --backend cpu: the CPU backend keeps its tensors in host memory",
                "add --backend cuda to plan a GPU job, or drop --gpu");
  if (!o.plan_gpu.empty()) parse_planned_gpu(o.plan_gpu);  // a bad name fails here, before anything is planned
  if (!(ranks || nodes || per_node)) return;
  constexpr int kMost = 1 << 16;
  if (ranks) check_range(o.plan_ranks >= 1 && o.plan_ranks <= kMost, "ranks", str(o.plan_ranks), "in [1, 65536]");
  if (nodes) check_range(o.plan_nodes >= 1 && o.plan_nodes <= kMost, "nodes", str(o.plan_nodes), "in [1, 65536]");
  if (per_node)
    check_range(o.plan_ranks_per_node >= 1 && o.plan_ranks_per_node <= kMost, "gpus-per-node",
                str(o.plan_ranks_per_node), "in [1, 65536]");
  if (!nodes) o.plan_nodes = 1;
  DF_CHECK_HINT(ranks || per_node, BadOptions, "--nodes " << o.plan_nodes << " without the ranks on each",
                "give --gpus-per-node G (ranks per node), or --ranks N (all of them)");
  if (!per_node) {
    DF_CHECK_HINT(o.plan_ranks % o.plan_nodes == 0, BadOptions,
                  "--ranks " << o.plan_ranks << " does not split evenly over --nodes " << o.plan_nodes,
                  "every node runs the same number of ranks: give --ranks a multiple of --nodes, or --gpus-per-node");
    o.plan_ranks_per_node = o.plan_ranks / o.plan_nodes;
  }
  DF_CHECK_HINT(!ranks || o.plan_ranks == o.plan_nodes * o.plan_ranks_per_node, BadOptions,
                "--ranks " << o.plan_ranks << " is not --nodes " << o.plan_nodes << " x --gpus-per-node "
                           << o.plan_ranks_per_node,
                "give two of --ranks, --nodes and --gpus-per-node");
  o.plan_ranks = o.plan_nodes * o.plan_ranks_per_node;
}

}  // namespace

PlannedGpu parse_planned_gpu(const std::string& text) {
  // memory.total as nvidia-smi reports it (MiB): H200 measured here (bench/results/h200-gpu-checks-*.txt);
  // H100 80GB HBM3 81559, B200 183359, RTX PRO 6000 Blackwell (Workstation and Server) 97887 as reported.
  struct Known {
    const char* name;
    const char* model;
    double mib;
  };
  static const Known known[] = {{"h100", "NVIDIA H100 80GB HBM3", 81559},
                                {"h200", "NVIDIA H200", 143771},
                                {"b200", "NVIDIA B200", 183359},
                                {"rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", 97887}};
  for (const Known& k : known)
    if (text == k.name) return PlannedGpu{k.name, k.model, k.mib * 1048576.0};
  char* end = nullptr;
  const double gib = std::strtod(text.c_str(), &end);
  const bool number = !text.empty() && end && *end == '\0' && text.find_first_not_of("0123456789.") == std::string::npos;
  DF_CHECK_HINT(number && gib > 0 && gib < 1e5, BadOptions, "unknown --gpu '" << text << "'",
                "give h100, h200, b200 or rtx-pro-6000, or the GPU's memory in GiB (e.g. --gpu 96)");
  return PlannedGpu{text + " GiB", "", gib * 1073741824.0};
}

ParseResult parse_options(int argc, const char* const* argv) {
  ParseResult r;
  Options& o = r.options;
  std::vector<std::string> data;
  std::string topology, backend, loss, long_record, export_dtype, fail_mode, batch_order, data_plane, seed,
      deterministic, rebalance, eval_max_tokens, optimizer_state;
  const Described described = describe(o, data, topology, backend, loss, long_record, export_dtype, fail_mode, batch_order,
                                       data_plane, seed, deterministic, rebalance, eval_max_tokens, optimizer_state);
  const po::options_description& desc = described.all;
  po::variables_map vm;
  const char* usage_hint = "dflash-train --help lists every option";
  try {
    // Command line first: store() keeps the first value, so flags override the file.
    po::parsed_options cli = po::command_line_parser(argc, argv).options(desc).run();
    // dflash-train takes no positional arguments; Boost would drop them silently, so that
    // `--checkpoint-every 30 m` meant 30 steps and `--dpace yes` passed. Refused instead.
    for (const po::option& opt : cli.options)
      if (opt.string_key.empty())
        DF_FAIL(BadOptions, "unexpected argument '" << (opt.original_tokens.empty() ? std::string("?") : opt.original_tokens[0])
                                                   << "': dflash-train takes only --name value options",
                "an option's value joins its flag (--checkpoint-every 30m, not 30 m); a switch such as --dpace takes no "
                "value");
    keep_last_occurrence(cli);
    po::store(cli, vm);
    if (vm.count("help") || vm.count("help-all") || vm.count("version")) {
      std::ostringstream os;
      if (vm.count("version")) os << "dflash-train " << DFLASH_VERSION << "\n";
      else if (vm.count("help-all")) os << described.all;
      else os << described.visible;
      r.help_requested = true;
      r.help_text = os.str();
      return r;
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream in(path);
      DF_CHECK_HINT(in.good(), BadOptions, "cannot read --config " << path, "give an existing key = value file");
      po::parsed_options file = po::parse_config_file(in, desc);
      keep_last_occurrence(file);
      po::store(file, vm);
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    const std::string near = nearest_option(e.get_option_name(), desc);
    DF_FAIL(BadOptions, "bad command line: " << e.what() << (near.empty() ? "" : "; did you mean --" + near + "?"),
            usage_hint);
  } catch (const po::error& e) {
    DF_FAIL(BadOptions, "bad command line: " << e.what(), usage_hint);
  }

  o.topology_text = topology;
  o.topology_auto = topology == "auto";  // measured and chosen by run_job (auto_measure.h)
  if (!o.topology_auto) o.topology = parse_topology_spec(topology);
  DF_CHECK_HINT(!o.measure_only || o.topology_auto, BadOptions, "--measure-only measures for --topology auto",
                "add --topology auto, or drop --measure-only");
  if (rebalance == "auto") o.rebalance = RebalanceMode::Auto;
  else if (rebalance == "off") o.rebalance = RebalanceMode::Off;
  else check_range(false, "rebalance", rebalance, "auto or off");
  if (backend == "cpu") o.backend = Device::CPU;
  else if (backend == "cuda") o.backend = Device::CUDA;
  else check_range(false, "backend", backend, "cpu or cuda");
  // The seed as digits only: an unsigned parse would quietly wrap "-1" to 2^64-1.
  const bool seed_ok = !seed.empty() && seed.size() <= 19 && seed.find_first_not_of("0123456789") == std::string::npos;
  check_range(seed_ok && std::stoull(seed) <= static_cast<uint64_t>(INT64_MAX), "seed", seed, "a whole number in [0, 2^63)");
  o.train.seed = std::stoull(seed);
  if (data_plane == "auto") o.data_plane = DataPlaneChoice::Auto;
  else if (data_plane == "nccl") o.data_plane = DataPlaneChoice::Nccl;
  else if (data_plane == "cuda-mpi") o.data_plane = DataPlaneChoice::CudaMpi;
  else if (data_plane == "host") o.data_plane = DataPlaneChoice::Host;
  else check_range(false, "data-plane", data_plane, "auto, nccl, cuda-mpi or host");
  DF_CHECK_HINT(o.backend == Device::CUDA || o.data_plane == DataPlaneChoice::Auto || o.data_plane == DataPlaneChoice::Host,
                BadOptions, "--data-plane " << data_plane << " moves device tensors; the CPU backend has none",
                "use --backend cuda, or --data-plane host (or auto)");
  if (loss == "ce") o.train.loss = LossKind::CE;
  else if (loss == "kl") o.train.loss = LossKind::KL;
  else check_range(false, "loss", loss, "ce or kl");
  if (long_record == "error") o.long_record = LongRecordPolicy::Error;
  else if (long_record == "cut") o.long_record = LongRecordPolicy::Cut;
  else if (long_record == "skip") o.long_record = LongRecordPolicy::Skip;
  else check_range(false, "long-record", long_record, "error, cut or skip");
  if (batch_order == "arrival") o.batch_order = BatchOrder::Arrival;
  else if (batch_order == "fixed") o.batch_order = BatchOrder::Fixed;
  else check_range(false, "batch-order", batch_order, "arrival or fixed");
  if (deterministic == "auto") o.deterministic = o.batch_order == BatchOrder::Fixed;
  else if (deterministic == "on") o.deterministic = true;
  else if (deterministic == "off") o.deterministic = false;
  else check_range(false, "deterministic", deterministic, "auto, on or off");
  if (export_dtype == "f32") o.export_dtype = DType::F32;
  else if (export_dtype == "bf16") o.export_dtype = DType::BF16;
  else check_range(false, "export-dtype", export_dtype, "bf16 or f32");
  if (optimizer_state == "fp32") o.train.optimizer_state = OptimizerState::Fp32;
  else if (optimizer_state == "bf16") o.train.optimizer_state = OptimizerState::Bf16;
  else check_range(false, "optimizer-state", optimizer_state, "fp32 or bf16");
  if (fail_mode == "kill") o.inject_fail_mode = FailMode::Kill;
  else if (fail_mode == "hang") o.inject_fail_mode = FailMode::Hang;
  else check_range(false, "inject-fail-mode", fail_mode, "kill or hang");

  check_range(o.token_budget >= 2, "token-budget", str(o.token_budget), ">= 2");
  check_range(o.prefetch_depth >= 1, "prefetch-depth", str(o.prefetch_depth), ">= 1");
  check_range(o.hs_queue_depth >= 1 && o.hs_queue_depth <= 1024, "hs-queue-depth", str(o.hs_queue_depth), "in [1, 1024]");
  check_range(o.draft_layers >= 1, "draft-layers", str(o.draft_layers), ">= 1");
  check_range(o.epochs >= 0, "epochs", str(o.epochs), ">= 0");
  check_range(o.max_steps >= 0, "max-steps", str(o.max_steps), ">= 0");
  // HF Trainer's convention: --max-steps without --epochs trains for --max-steps, the data repeating as often
  // as it takes (with both, whichever ends first ends the run, and the startup says which: plan_lr_schedule).
  if (o.max_steps > 0 && (!vm.count("epochs") || vm["epochs"].defaulted())) o.epochs = 0;
  DF_CHECK_HINT(o.epochs > 0 || o.max_steps > 0, BadOptions, "--epochs 0 (forever) without --max-steps never ends",
                "give --max-steps N or --epochs N");
  check_range(o.log_every >= 1, "log-every", str(o.log_every), ">= 1");
  check_range(o.metrics_flush_every >= 1, "metrics-flush-every", str(o.metrics_flush_every), ">= 1");
  check_range(o.peer_timeout_s > 0 && std::isfinite(o.peer_timeout_s), "peer-timeout", str(o.peer_timeout_s), "> 0 seconds");
  check_range(o.grad_bucket_mb >= 0 && std::isfinite(o.grad_bucket_mb), "grad-bucket-mb", str(o.grad_bucket_mb), ">= 0 MiB (0 = one bucket)");
  // Bounded before anything is sized by them: 2^20 anchors x 16 block rows is far beyond any GPU's memory,
  // and a value like 2000000000 would otherwise end in an allocation failure instead of this message.
  constexpr int64_t kMostAnchors = int64_t{1} << 20;
  check_range(o.train.max_anchors >= 1 && o.train.max_anchors <= kMostAnchors, "max-anchors", str(o.train.max_anchors),
              "in [1, 1048576]");
  check_range(o.train.anchors_per_record >= 0 && o.train.anchors_per_record <= kMostAnchors, "anchors-per-record",
              str(o.train.anchors_per_record), "in [0, 1048576] (0 = per batch only)");
  const bool cap_defaulted = vm["max-anchors"].defaulted();
  if (o.train.anchors_per_record > 0 && cap_defaulted)
    o.train.max_anchors = default_max_anchors(o.train.anchors_per_record, o.token_budget);
  check_range(o.train.gamma > 0, "gamma", str(o.train.gamma), "> 0");
  check_range(o.train.lr > 0 && std::isfinite(o.train.lr), "lr", str(o.train.lr), "> 0");
  check_range(o.train.warmup_steps >= 0, "warmup-steps", str(o.train.warmup_steps), ">= 0");
  check_range(o.warmup_ratio >= 0 && o.warmup_ratio < 1, "warmup-ratio", str(o.warmup_ratio), "in [0, 1)");
  DF_CHECK_HINT(o.warmup_ratio == 0 || o.train.warmup_steps == 0, BadOptions,
                "--warmup-ratio and --warmup-steps both set the warmup", "give one of them");
  check_range(o.train.hs_noise >= 0, "hs-noise", str(o.train.hs_noise), ">= 0");
  check_range(o.grad_accum >= 1, "grad-accum", str(o.grad_accum), ">= 1");
  check_range(o.global_batch_tokens >= 0, "global-batch-tokens", str(o.global_batch_tokens), ">= 0 (0 = --grad-accum decides)");
  DF_CHECK_HINT(o.global_batch_tokens == 0 || !vm.count("grad-accum") || vm["grad-accum"].defaulted(), BadOptions,
                "--grad-accum and --global-batch-tokens both set the micro-batches per step", "give one of them");
  check_range(o.train.min_lr_ratio >= 0 && o.train.min_lr_ratio <= 1, "min-lr-ratio", str(o.train.min_lr_ratio), "in [0, 1]");
  check_range(o.train.beta1 >= 0 && o.train.beta1 < 1, "adam-beta1", str(o.train.beta1), "in [0, 1)");
  check_range(o.train.beta2 >= 0 && o.train.beta2 < 1, "adam-beta2", str(o.train.beta2), "in [0, 1)");
  check_range(o.train.eps > 0 && std::isfinite(o.train.eps), "adam-eps", str(o.train.eps), "> 0");
  check_range(o.train.weight_decay >= 0 && o.train.weight_decay * o.train.lr < 1, "weight-decay",
              str(o.train.weight_decay), ">= 0 and below 1 / --lr");
  std::vector<std::string> recipe_given;  // the fresh-drafter options given explicitly
  if (o.draft_arch == "dflash") o.train.draft_arch = DraftArch::DFlash;
  else if (o.draft_arch == "dflash2") o.train.draft_arch = DraftArch::DFlash2;
  else check_range(false, "draft-arch", o.draft_arch, "dflash or dflash2");
  check_range(std::isfinite(o.train.output_multiplier) && o.train.output_multiplier > 0, "output-multiplier",
              str(o.train.output_multiplier), "> 0");
  check_range(std::isfinite(o.train.logit_softcap) && o.train.logit_softcap >= 0, "logit-softcap",
              str(o.train.logit_softcap), ">= 0 (0 = off)");
  check_range(std::isfinite(o.train.selector_loss_alpha) && o.train.selector_loss_alpha >= 0, "selector-loss-alpha",
              str(o.train.selector_loss_alpha), ">= 0");
  if (o.train.draft_arch != DraftArch::DFlash2)
    for (const char* n : {"conv-kernel-size", "conv-group-size", "selector-top-k", "selector-rank"})
      DF_CHECK_HINT(!vm.count(n) || vm[n].defaulted(), BadOptions, "--" << n << " shapes a DFlash2 drafter",
                    "add --draft-arch dflash2, or drop --" + std::string(n));
  for (const char* n : {"block-size", "mask-token", "target-layers", "draft-layer-types", "draft-sliding-window",
                        "draft-arch", "conv-kernel-size", "conv-group-size", "selector-top-k", "selector-rank",
                        "output-multiplier", "logit-softcap"})
    if (vm.count(n) && !vm[n].defaulted()) recipe_given.push_back(n);
  resolve_drafter_recipe(o, recipe_given);
  check_range(o.inject_delay_target_ms >= 0, "inject-delay-target-ms", str(o.inject_delay_target_ms), ">= 0");
  check_range(o.inject_delay_drafter_ms >= 0, "inject-delay-drafter-ms", str(o.inject_delay_drafter_ms), ">= 0");
  DF_CHECK_HINT((o.inject_fail_rank >= 0) == (o.inject_fail_step >= 0), BadOptions,
                "--inject-fail-rank and --inject-fail-step go together", "give both or neither");
  DF_CHECK_HINT(o.target_dir.size() && !data.empty() && o.out_dir.size(), BadOptions,
                "--target, --data and --out are required", usage_hint);
  for (const std::string& d : data) o.data.push_back(parse_data_source(d));
  check_data_sources(o.data);
  parse_checkpoint_every(o.checkpoint_every);  // fatal BadOptions naming the flag on a bad value
  parse_report_to(o.report_to);  // fatal BadOptions naming a bad word
  check_range(o.report_every_min > 0 && std::isfinite(o.report_every_min), "report-every", str(o.report_every_min), "> 0 minutes");
  check_range(o.rebalance_min_gain_pct >= 0 && o.rebalance_min_gain_pct < 1000, "rebalance-min-gain",
              str(o.rebalance_min_gain_pct), "a percentage in [0, 1000)");
  DF_CHECK_HINT(o.rebalance == RebalanceMode::Off || parse_checkpoint_every(o.checkpoint_every).unit != CheckpointUnit::Off, BadOptions,
                "--rebalance auto changes the split at a checkpoint, and this run writes none before its end",
                "add --checkpoint-every (e.g. 500 or 30m)");
  if (vm.count("eval-every")) check_range(o.eval_every >= 0, "eval-every", str(o.eval_every), ">= 0 (0 = only after the last step)");
  DF_CHECK_HINT(!vm.count("eval-every") || !o.eval_data.empty(), BadOptions, "--eval-every without --eval-data: there is nothing to evaluate",
                "give --eval-data FILE.h5 (a held-out dataset), or drop --eval-every");
  if (eval_max_tokens != "auto") {
    const bool digits = !eval_max_tokens.empty() && eval_max_tokens.size() <= 15 &&
                        eval_max_tokens.find_first_not_of("0123456789") == std::string::npos;
    check_range(digits && std::stoll(eval_max_tokens) >= 1, "eval-max-tokens", eval_max_tokens, "auto or a whole number >= 1");
    o.eval_max_tokens = std::stoll(eval_max_tokens);
  }
  DF_CHECK_HINT(vm["eval-max-tokens"].defaulted() || !o.eval_data.empty(), BadOptions,
                "--eval-max-tokens without --eval-data: there is nothing to evaluate",
                "give --eval-data FILE.h5 (a held-out dataset), or drop --eval-max-tokens");
  check_range(o.inject_eval_budget_bytes >= 0, "inject-eval-budget-bytes", str(o.inject_eval_budget_bytes), ">= 0");
  check_range(o.eval_tau_every >= 0, "eval-tau-every", str(o.eval_tau_every), ">= 0 (0 = off)");
  check_range(o.eval_tau_prompts >= 1, "eval-tau-prompts", str(o.eval_tau_prompts), ">= 1");
  check_range(o.eval_tau_max_new_tokens >= 1, "eval-tau-max-new-tokens", str(o.eval_tau_max_new_tokens), ">= 1");
  DF_CHECK_HINT(o.eval_tau_every == 0 || !o.eval_data.empty(), BadOptions,
                "--eval-tau-every without --eval-data: there are no prompts to decode",
                "give --eval-data FILE.h5 (a held-out dataset; its prompts are the tokens before each record's first loss_mask 1)");
  resolve_planned_world(o, vm.count("ranks") > 0, vm.count("nodes") > 0, vm.count("gpus-per-node") > 0);
  check_range(o.keep_checkpoints >= 1, "keep-checkpoints", str(o.keep_checkpoints), ">= 1");
  o.train.total_steps = o.max_steps;
  o.command_line = shell_line(argc, argv);

  // The resolved configuration: every option with the value the job will use.
  for (const auto& opt : desc.options()) {
    const std::string& name = opt->long_name();
    // (--dry-run never trains: left out, so checkpoints and their resume invariants are as before it existed)
    if (name == "help" || name == "help-all" || name == "version" || name == "dry-run" || !vm.count(name)) continue;
    const po::variable_value& v = vm[name];
    std::string text;
    using Kind = Options::ValueKind;
    Kind kind = Kind::Text;
    if (auto p = boost::any_cast<std::string>(&v.value())) text = *p;
    else if (auto p = boost::any_cast<int>(&v.value())) text = str(*p), kind = Kind::Integer;
    else if (auto p = boost::any_cast<int64_t>(&v.value())) text = str(*p), kind = Kind::Integer;
    else if (auto p = boost::any_cast<uint64_t>(&v.value())) text = str(*p), kind = Kind::Integer;
    else if (auto p = boost::any_cast<float>(&v.value())) text = str(*p), kind = Kind::Real;
    else if (auto p = boost::any_cast<double>(&v.value())) text = str(*p), kind = Kind::Real;
    else if (auto p = boost::any_cast<bool>(&v.value())) text = *p ? "true" : "false", kind = Kind::Flag;
    if (name == "max-anchors") text = str(o.train.max_anchors);  // the cap as resolved (default_max_anchors)
    if (name == "epochs") text = str(o.epochs);  // 0 with --max-steps and no --epochs
    if (name == "data") text = data_sources_text(o.data);  // one file: its path, as before mixes
    o.resolved.emplace_back(name, text);
    if (kind != Kind::Text) o.resolved_kind[name] = kind;
  }
  return r;
}

std::string Options::to_json() const { return resolved_options_json(resolved, resolved_kind); }

std::string resolved_options_json(const std::vector<std::pair<std::string, std::string>>& resolved,
                                  const std::map<std::string, Options::ValueKind>& kinds) {
  using ValueKind = Options::ValueKind;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : resolved) {
    const auto kind = kinds.find(k);
    switch (kind == kinds.end() ? ValueKind::Text : kind->second) {
      case ValueKind::Text: j[k] = v; break;
      // (the texts are the parser's own printing of its numbers: they parse back)
      case ValueKind::Integer: j[k] = v.size() && v[0] == '-' ? nlohmann::json(std::stoll(v)) : nlohmann::json(std::stoull(v)); break;
      case ValueKind::Real: j[k] = std::stod(v); break;
      case ValueKind::Flag: j[k] = v == "true"; break;
    }
  }
  return j.dump();
}

void check_input_paths(const Options& o) {
  DF_CHECK_HINT(path_exists(o.target_dir + "/config.json"), BadInput,
                "--target " << o.target_dir << ": no config.json there", "point --target at a Hugging Face checkpoint directory");
  for (const DataSource& d : o.data)
    DF_CHECK_HINT(path_exists(d.path), BadInput, "--data " << d.path << ": no such file",
                  "make one with dflash-make-tiny or dflash-prep");
  if (!o.eval_data.empty())
    DF_CHECK_HINT(path_exists(o.eval_data), BadInput, "--eval-data " << o.eval_data << ": no such file",
                  "make a held-out dataset with dflash-prep or dflash-tokenize (the --data format)");
  if (!o.drafter_dir.empty())
    DF_CHECK_HINT(path_exists(o.drafter_dir + "/config.json"), BadInput,
                  "--drafter " << o.drafter_dir << ": no config.json there", "point --drafter at a release-format drafter (config.json + model.safetensors)");
}

}  // namespace dflash

namespace dflash {

std::string optimizer_state_line(const Options& o) {
  if (o.train.optimizer_state != OptimizerState::Bf16) return "";
  const int fp32 = optimizer_state_bytes_per_param(OptimizerState::Fp32, o.backend);
  const int bf16 = optimizer_state_bytes_per_param(OptimizerState::Bf16, o.backend);
  std::ostringstream os;
  os << "[dflash] optimizer state: bf16 weights and AdamW moments, stochastic rounding (";
  if (o.backend == Device::CUDA)
    os << bf16 << " B/param with the fp32 gradients, " << fp32 - bf16 << " B/param less than fp32's " << fp32 << ")";
  else
    os << "the CPU backend keeps them in fp32 storage holding bf16 values: " << bf16 << " B/param, as fp32)";
  return os.str();
}

}  // namespace dflash
