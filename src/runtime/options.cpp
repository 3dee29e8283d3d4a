// dflash-train's options: Boost.ProgramOptions over the option rows (src/runtime/option_table.h), command line
// first, then --config, notify once; then each row's own check, then the checks of options together.
#include "dflash/options.h"

#include <sys/stat.h>

#include <boost/program_options.hpp>
#include <algorithm>
#include <climits>
#include <map>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "dflash/anchors.h"     // default_max_anchors
#include "dflash/checkpoint.h"  // parse_checkpoint_every (--rebalance needs a checkpoint)
#include "dflash/error.h"
#include "dflash/safe_file.h"  // check_regular_input
#include "dflash/schedule.h"  // grad_accum_for
#include "config_file.h"
#include "option_table.h"

namespace po = boost::program_options;

namespace dflash {

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
// a third of the name's letters (and at least 2) changed, so a made-up flag gets no wild guess; else the one
// option the name begins.
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
  if (!best.empty() || given.size() < 3) return best;
  // A prefix of one option only (--eval-tau-max for --eval-tau-max-new-tokens): Boost no longer guesses it
  // (parse_options), so the message names it.
  for (const auto& opt : desc.options()) {
    const std::string& name = opt->long_name();
    if (name.compare(0, given.size(), given) != 0) continue;
    if (!best.empty()) return "";  // several: no guess
    best = name;
  }
  return best;
}

// A --config file (any of its spellings, src/runtime/config_file.h) as the parser's options: every entry's
// option known and its value readable by that option, or the fatal error naming FILE:LINE (Boost's own
// parser named neither the file nor the line).
// `origins`: each option's FILE:LINE (its last line), for the range checks' errors.
po::parsed_options config_file_options(const std::string& path, const po::options_description& desc,
                                       std::map<std::string, std::string>& origins) {
  po::parsed_options parsed(&desc);
  for (const ConfigEntry& e : read_config_file(path)) {
    const std::string where = "--config " + path + ":" + std::to_string(e.line) + ": ";
    const char* hint = "dflash-train --help lists every option; a --config file names them without the --";
    const po::option_description* d = desc.find_nothrow(e.key, false, false, false);
    if (!d) {
      const std::string near = nearest_option(e.key, desc);
      DF_FAIL(BadOptions, where << "unknown option '" << e.written << "'" << (near.empty() ? "" : "; did you mean " + near + "?"),
              hint);
    }
    DF_CHECK_HINT(!e.list || e.values.size() == 1 || e.key == "data", BadOptions,
                  where << e.written << " takes one value, the list gives " << e.values.size(),
                  "a list is for an option given several times (data)");
    for (const std::string& v : e.values) {
      // The value read as the option will read it, so a bad one is refused here, where its line is known.
      try {
        boost::any scratch;
        d->semantic()->parse(scratch, {v}, true);
      } catch (po::error_with_option_name& err) {
        err.set_option_name(e.key);  // (parse() alone does not know it)
        DF_FAIL(BadOptions, where << "bad value '" << v << "' for " << e.written << " (" << err.what() << ")", hint);
      } catch (const po::error& err) {
        DF_FAIL(BadOptions, where << "bad value '" << v << "' for " << e.written << " (" << err.what() << ")", hint);
      }
      origins[e.key] = "--config " + path + ":" + std::to_string(e.line);
      po::option opt(e.key, {v});
      opt.original_tokens = {e.key, v};
      parsed.options.push_back(std::move(opt));
    }
  }
  return parsed;
}

// --ranks / --nodes / --gpus-per-node / --gpu: a dry run's own world and GPU (docs/pipeline.md "Options").
void resolve_planned_world(Options& o, bool ranks, bool nodes, bool per_node) {
  const char* hint = "the job runs on the world mpirun/srun starts and the GPUs it finds: add --dry-run to see the "
                     "plan for this world here, or drop the flag";
  DF_CHECK_HINT(o.dry_run || !(ranks || nodes || per_node), BadOptions,
                "--ranks, --nodes and --gpus-per-node plan a --dry-run's world", hint);
  const bool plan = o.topology_choice == TopologyChoice::Plan;
  DF_CHECK_HINT(o.dry_run || plan || o.plan_gpu.empty(), BadOptions,
                "--gpu names the GPU a --dry-run or --topology plan plans for", hint);
  // --topology plan on the CPU backend chooses the split the plan gives that GPU kind (how CI runs it).
  DF_CHECK_HINT(o.plan_gpu.empty() || o.backend == Device::CUDA || plan, BadOptions,
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

namespace {

// Options::resolved: every recorded option the variables map holds (given, or with a default), in table
// order, as the parser holds it (a row's resolved_text where the job uses another value), and its type.
void record_resolved(Options& o, const std::vector<OptionRow>& rows, const po::variables_map& vm) {
  using Kind = Options::ValueKind;
  for (const OptionRow& row : rows) {
    if (row.recorded == Recorded::No || !vm.count(row.name)) continue;
    const boost::any& v = vm[row.name].value();
    std::string text;
    Kind kind = Kind::Text;
    if (auto p = boost::any_cast<std::string>(&v)) text = *p;
    else if (auto p = boost::any_cast<int>(&v)) text = str(*p), kind = Kind::Integer;
    else if (auto p = boost::any_cast<int64_t>(&v)) text = str(*p), kind = Kind::Integer;
    else if (auto p = boost::any_cast<uint64_t>(&v)) text = str(*p), kind = Kind::Integer;
    else if (auto p = boost::any_cast<float>(&v)) text = str(*p), kind = Kind::Real;
    else if (auto p = boost::any_cast<double>(&v)) text = str(*p), kind = Kind::Real;
    else if (auto p = boost::any_cast<bool>(&v)) text = *p ? "true" : "false", kind = Kind::Flag;
    if (row.resolved_text) text = row.resolved_text();
    o.resolved.emplace_back(row.name, text);
    if (kind != Kind::Text) o.resolved_kind[row.name] = kind;
  }
}

bool given(const po::variables_map& vm, const char* name) { return vm.count(name) && !vm[name].defaulted(); }

// The checks of options together (each alone is its row's check, src/runtime/option_table.cpp), and the
// values one option gives another: --epochs from --max-steps, the anchor cap, a fresh drafter's recipe.
void check_together(Options& o, const po::variables_map& vm) {
  const char* usage_hint = "dflash-train --help lists every option";
  DF_CHECK_HINT(!o.measure_only || o.topology_choice == TopologyChoice::Auto, BadOptions, "--measure-only measures for --topology auto",
                "add --topology auto, or drop --measure-only");
  DF_CHECK_HINT(o.backend == Device::CUDA || o.data_plane == DataPlaneChoice::Auto || o.data_plane == DataPlaneChoice::Host,
                BadOptions, "--data-plane " << data_plane_choice_name(o.data_plane) << " moves device tensors; the CPU backend has none",
                "use --backend cuda, or --data-plane host (or auto)");
  // HF Trainer's convention: --max-steps without --epochs trains for --max-steps, the data repeating as often
  // as it takes (with both, whichever ends first ends the run, and the startup says which: src/runtime/segment_plan.cpp).
  if (o.max_steps > 0 && !given(vm, "epochs")) o.epochs = 0;
  DF_CHECK_HINT(o.epochs > 0 || o.max_steps > 0, BadOptions, "--epochs 0 (forever) without --max-steps never ends",
                "give --max-steps N or --epochs N");
  if (o.train.anchors_per_record > 0 && !given(vm, "max-anchors"))
    o.train.max_anchors = default_max_anchors(o.train.anchors_per_record, o.token_budget);
  DF_CHECK_HINT(o.warmup_ratio == 0 || o.train.warmup_steps == 0, BadOptions,
                "--warmup-ratio and --warmup-steps both set the warmup", "give one of them");
  DF_CHECK_HINT(o.global_batch_tokens == 0 || !given(vm, "grad-accum"), BadOptions,
                "--grad-accum and --global-batch-tokens both set the micro-batches per step", "give one of them");
  if (o.train.draft_arch != DraftArch::DFlash2)
    for (const char* n : {"conv-kernel-size", "conv-group-size", "selector-top-k", "selector-rank"})
      DF_CHECK_HINT(!given(vm, n), BadOptions, "--" << n << " shapes a DFlash2 drafter",
                    "add --draft-arch dflash2, or drop --" + std::string(n));
  std::vector<std::string> recipe_given;  // the fresh-drafter options given explicitly
  for (const char* n : {"block-size", "mask-token", "target-layers", "draft-layer-types", "draft-sliding-window",
                        "draft-heads", "draft-head-dim", "draft-kv-heads",
                        "draft-arch", "conv-kernel-size", "conv-group-size", "selector-top-k", "selector-rank",
                        "output-multiplier", "logit-softcap"})
    if (given(vm, n)) recipe_given.push_back(n);
  resolve_drafter_recipe(o, recipe_given);
  DF_CHECK_HINT((o.inject_fail_rank >= 0) == (o.inject_fail_step >= 0), BadOptions,
                "--inject-fail-rank and --inject-fail-step go together", "give both or neither");
  DF_CHECK_HINT(o.target_dir.size() && !o.data.empty() && o.out_dir.size(), BadOptions,
                "--target, --data and --out are required", usage_hint);
  DF_CHECK_HINT(o.rebalance == RebalanceMode::Off || parse_checkpoint_every(o.checkpoint_every).unit != CheckpointUnit::Off, BadOptions,
                "--rebalance auto changes the split at a checkpoint, and this run writes none before its end",
                "add --checkpoint-every (e.g. 500 or 30m)");
  DF_CHECK_HINT(!vm.count("eval-every") || !o.eval_data.empty(), BadOptions, "--eval-every without --eval-data: there is nothing to evaluate",
                "give --eval-data FILE.h5 (a held-out dataset), or drop --eval-every");
  DF_CHECK_HINT(!given(vm, "eval-max-tokens") || !o.eval_data.empty(), BadOptions,
                "--eval-max-tokens without --eval-data: there is nothing to evaluate",
                "give --eval-data FILE.h5 (a held-out dataset), or drop --eval-max-tokens");
  DF_CHECK_HINT(o.eval_tau_every == 0 || !o.eval_data.empty(), BadOptions,
                "--eval-tau-every without --eval-data: there are no prompts to decode",
                "give --eval-data FILE.h5 (a held-out dataset; its prompts are the tokens before each record's first loss_mask 1)");
}

}  // namespace

ParseResult parse_options(int argc, const char* const* argv) {
  ParseResult r;
  Options& o = r.options;
  const std::vector<OptionRow> rows = option_rows(o);  // bound to o; defaults read from it
  const OptionDescriptions described = describe_options(rows);
  const po::options_description& desc = described.all;
  po::variables_map vm;
  std::map<std::string, std::string> config_origins;  // options whose value a --config line gave: FILE:LINE
  const char* usage_hint = "dflash-train --help lists every option";
  try {
    // Exact names only: Boost's default style also takes an unambiguous prefix, so --max-anchor was quietly
    // --max-anchors; refused instead, and nearest_option names the option meant.
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    // Command line first: store() keeps the first value, so flags override the file.
    po::parsed_options cli = po::command_line_parser(argc, argv).options(desc).style(style).run();
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
    if (vm.count("help") || vm.count("help-all") || vm.count("version") || vm.count("help-markdown")) {
      std::ostringstream os;
      if (vm.count("version")) os << "dflash-train " << DFLASH_VERSION << "\n";
      else if (vm.count("help-markdown")) os << options_markdown(rows);
      else if (vm.count("help-all")) os << described.with_hooks;
      else os << described.visible;
      r.help_requested = true;
      r.help_text = os.str();
      return r;
    }
    if (vm.count("config")) {
      po::parsed_options file = config_file_options(vm["config"].as<std::string>(), desc, config_origins);
      for (const po::option& opt : cli.options) config_origins.erase(opt.string_key);  // the command line won
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
  // Each option alone: its range, its text into an enum (fatal BadOptions naming the flag).
  for (const OptionRow& row : rows)
    if (row.check && vm.count(row.name)) {
      const auto from = config_origins.find(row.name);
      const OptionOrigin origin(from == config_origins.end() ? "" : from->second);
      row.check(vm[row.name]);
    }

  check_together(o, vm);
  resolve_planned_world(o, vm.count("ranks") > 0, vm.count("nodes") > 0, vm.count("gpus-per-node") > 0);
  o.train.total_steps = o.max_steps;
  o.command_line = shell_line(argc, argv);
  record_resolved(o, rows, vm);  // the resolved configuration: every option with the value the job will use
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
  // A FIFO (or device) given as a dataset would block HDF5's first open for ever: refused by its type first.
  for (const DataSource& d : o.data) {
    DF_CHECK_HINT(path_exists(d.path), BadInput, "--data " << d.path << ": no such file",
                  "make one with dflash-make-tiny or dflash-prep");
    check_regular_input(d.path, "--data");
  }
  if (!o.eval_data.empty()) {
    DF_CHECK_HINT(path_exists(o.eval_data), BadInput, "--eval-data " << o.eval_data << ": no such file",
                  "make a held-out dataset with dflash-prep or dflash-tokenize (the --data format)");
    check_regular_input(o.eval_data, "--eval-data");
  }
  if (!o.drafter_dir.empty())
    DF_CHECK_HINT(path_exists(o.drafter_dir + "/config.json"), BadInput,
                  "--drafter " << o.drafter_dir << ": no config.json there", "point --drafter at a release-format drafter (config.json + model.safetensors)");
}

}  // namespace dflash

namespace dflash {

std::string backend_line(const Options& o) {
  std::ostringstream os;
  os << "[dflash] backend: " << device_name(o.backend);
  if (o.backend_why.rfind("chosen", 0) == 0)
    os << ", " << o.backend_why << " (--backend cpu or --backend cuda to choose)";
  else if (!o.backend_why.empty())
    os << " (" << o.backend_why << ")";
  return os.str();
}

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
