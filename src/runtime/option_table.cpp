// dflash-train's options, one row each (src/runtime/option_table.h): name, placeholder, help, the field
// it sets (its default read from there), its range check, and what the docs table says beyond --help.
// The rows are in the order of the resolved record ("[dflash] options: ..." at startup); --help groups
// them by section.
#include "option_table.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <type_traits>
#include <utility>

#include "dflash/backend.h"     // default_backend (--backend auto)
#include "dflash/checkpoint.h"  // parse_checkpoint_every
#include "dflash/error.h"
#include "dflash/schedule.h"  // kMostMicroBatches
#include "report_sidecar.h"  // parse_report_to

namespace po = boost::program_options;

namespace dflash {
namespace {

// Keeps a parameter out of template argument deduction (std::type_identity_t in C++20): a row's range
// is a lambda, its type the field's.
template <class T> struct Same { using type = T; };
template <class T> using Range = std::function<bool(typename Same<T>::type)>;

template <class T> std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

template <class T> std::string default_text_of(const T& v) {
  if constexpr (std::is_floating_point_v<T>) return person_number(v, std::is_same_v<T, float>);
  else return std::to_string(v);
}

// "a, b or c": the rule of a choice, as its error message names it.
template <class E> std::string one_of(const std::vector<std::pair<std::string, E>>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i].first;
  return s;
}

class Table {
 public:
  std::vector<OptionRow> rows;
  OptionSection section = OptionSection::Job;  // of the rows added next

  OptionRow& add(const std::string& name, const std::string& value_name, const std::string& help) {
    OptionRow& r = rows.emplace_back();
    r.name = name, r.value_name = value_name, r.help = help, r.section = section;
    return r;
  }
  OptionRow& command(const char* name, const char* help) {
    OptionRow& r = add(name, "", help);
    r.recorded = Recorded::No;
    return r;
  }
  // A number bound to *field, its default *field; `ok` (optional) is its range, `rule` says it.
  template <class T>
  OptionRow& number(const char* name, T* field, const char* value_name, const char* help,
                    Range<T> ok = nullptr, const char* rule = "") {
    OptionRow& r = optional_number(name, field, value_name, help, "", std::move(ok), rule);
    r.default_text = default_text_of(*field);
    const T d = *field;
    const std::string text = *r.default_text, vn = value_name;
    r.semantic = [field, d, text, vn] { return po::value<T>(field)->default_value(d, text)->value_name(vn); };
    return r;
  }
  // A number without a default: absent from the resolved record unless given; doc_default says what then.
  template <class T>
  OptionRow& optional_number(const char* name, T* field, const char* value_name, const char* help,
                             const char* doc_default, Range<T> ok = nullptr, const char* rule = "") {
    OptionRow& r = add(name, value_name, help);
    r.doc_default = doc_default;
    const std::string vn = value_name;
    r.semantic = [field, vn] { return po::value<T>(field)->value_name(vn); };
    if (ok) {
      const std::string flag = name, why = rule;
      r.check = [field, ok, flag, why](const po::variable_value&) { check_range(ok(*field), flag, str(*field), why); };
    }
    return r;
  }
  // A text bound to *field: its default *field when that is not empty, else none (doc_default says what).
  OptionRow& text(const char* name, std::string* field, const char* value_name, const char* help,
                  const char* doc_default = "") {
    OptionRow& r = add(name, value_name, help);
    r.doc_default = doc_default;
    const std::string vn = value_name;
    if (field->empty()) {
      r.semantic = [field, vn] { return po::value<std::string>(field)->value_name(vn); };
    } else {
      r.default_text = *field;
      const std::string d = *field;
      r.semantic = [field, d, vn] { return po::value<std::string>(field)->default_value(d)->value_name(vn); };
    }
    return r;
  }
  // A text the check turns into something else; its default `def` (a struct's value spelled out).
  OptionRow& word(const char* name, const std::string& def, const char* value_name, const char* help) {
    OptionRow& r = add(name, value_name, help);
    r.default_text = def;
    const std::string vn = value_name;
    r.semantic = [def, vn] { return po::value<std::string>()->default_value(def)->value_name(vn); };
    return r;
  }
  // One of a few names into an enum field; the default is the field's value's name.
  template <class E>
  OptionRow& choice(const char* name, E* field, const char* value_name, const char* help,
                    std::vector<std::pair<std::string, E>> names) {
    std::string def = "?";
    for (const auto& [n, e] : names)
      if (e == *field) def = n;
    OptionRow& r = word(name, def, value_name, help);
    const std::string flag = name;
    r.check = [field, names, flag](const po::variable_value& v) {
      const std::string& given = v.as<std::string>();
      for (const auto& [n, e] : names)
        if (n == given) return void(*field = e);
      check_range(false, flag, given, one_of(names));
    };
    return r;
  }
  OptionRow& flag(const char* name, bool* field, const char* help) {
    OptionRow& r = add(name, "", help);
    r.default_text = *field ? "on" : "off";
    r.semantic = [field] { return po::bool_switch(field); };
    return r;
  }
};

template <class E> std::vector<std::pair<std::string, E>> named(std::initializer_list<E> values, const char* (*name)(E)) {
  std::vector<std::pair<std::string, E>> v;
  for (E e : values) v.emplace_back(name(e), e);
  return v;
}

}  // namespace

namespace {
thread_local std::string g_option_origin;  // OptionOrigin's: the --config line of the value being checked
}  // namespace

OptionOrigin::OptionOrigin(const std::string& where) { g_option_origin = where; }
OptionOrigin::~OptionOrigin() { g_option_origin.clear(); }

void check_range(bool ok, const std::string& flag, const std::string& value, const std::string& rule) {
  DF_CHECK_HINT(ok, BadOptions,
                "bad value " << value << " for --" << flag << (g_option_origin.empty() ? "" : " (" + g_option_origin + ")"),
                "--" + flag + " must be " + rule);
}

std::string person_number(double v, bool single_precision) {
  auto reads_back = [&](const char* s) {
    const double r = std::strtod(s, nullptr);
    return single_precision ? static_cast<float>(r) == static_cast<float>(v) : r == v;
  };
  auto short_exponent = [](std::string s) {  // 6e-04 -> 6e-4, 1.2e+02 -> 1.2e2
    const size_t e = s.find('e');
    if (e == std::string::npos) return s;
    std::string exp = s.substr(e + 1);
    const bool neg = exp[0] == '-';
    exp.erase(0, exp.find_first_not_of("+-0"));
    return s.substr(0, e) + "e" + (neg ? "-" : "") + (exp.empty() ? "0" : exp);
  };
  char buf[64];
  std::string plain, sci;  // the fewest digits that read back, without and with an exponent
  for (int p = 1; p <= 17 && plain.empty(); ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    if (reads_back(buf) && !std::strchr(buf, 'e')) plain = buf;
  }
  for (int p = 0; p <= 16 && sci.empty(); ++p) {
    std::snprintf(buf, sizeof buf, "%.*e", p, v);
    if (reads_back(buf)) sci = short_exponent(buf);
  }
  // 120, 0.999; 6e-4 and 1e-8 rather than 0.0006 and 0.00000001.
  return plain.empty() || sci.size() < plain.size() ? sci : plain;
}

std::vector<OptionRow> option_rows(Options& o) {
  Table t;
  TrainOptions& tr = o.train;
  using S = OptionSection;
  auto at_least = [](auto lo) { return [lo](decltype(lo) v) { return v >= lo; }; };

  t.section = S::Job;
  t.command("help", "print this help and exit");
  t.command("help-all", "print this help with the test hooks and exit");
  t.command("version", "print the version and exit");
  t.section = S::DryRun;
  t.flag("dry-run", &o.dry_run, "print the resolved options, the topology (every rank's role) and the schedule, then exit: no model or data is loaded")
      .recorded = Recorded::No;  // it never trains: checkpoints and their resume invariants are as before it existed
  t.rows.back().doc = "print the resolved options, every rank's role and memory and the schedule, load nothing, exit (above)";
  // --ranks, --nodes, --gpus-per-node: checked with the other dry-run flags (resolve_planned_world), whose
  // first error is that they need --dry-run.
  t.optional_number("ranks", &o.plan_ranks, "N", "with --dry-run: plan a world of N ranks (on one node, or over --nodes) in this one process, without mpirun", "the MPI world");
  t.optional_number("nodes", &o.plan_nodes, "N", "with --dry-run: plan N nodes of --gpus-per-node ranks each", "the MPI world");
  t.optional_number("gpus-per-node", &o.plan_ranks_per_node, "G", "with --dry-run: ranks (one per GPU) on each planned node", "the MPI world");
  t.text("gpu", &o.plan_gpu, "NAME|GIB", "with --dry-run --backend cuda: check each rank's memory against this GPU: h100 | h200 | b200 | rtx-pro-6000, or its memory in GiB (default: this node's GPU 0 when NVML sees one); with --topology plan: the GPU kind the plan is for",
         "this node's GPU 0 (NVML), else none")
      .doc = "with `--dry-run --backend cuda`: check each rank's fixed memory against `h100`, `h200`, `b200`, `rtx-pro-6000` or a size in GiB; a rank that does not fit ends the dry run with exit 2. With `--topology plan`: the GPU kind whose layout plan picks the split (needed on the CPU backend, where the plan chooses as for that GPU)";
  t.text("calibration", &o.calibration_file, "FILE", "the layout plan's GPU constants: a calibration.json dflash-report wrote from an earlier run (replaces the built-in table's entry of that GPU)", "the built-in table")
      .doc = "the layout plan's GPU constants (`--dry-run`, `--topology plan`): the `calibration.json` `dflash-report` writes from a run, fitted to what that run measured; its GPU's entry replaces the built-in table's (docs/cost_model.md)";
  t.section = S::Job;
  t.text("config", &o.config_file, "FILE", "key = value, YAML (.yaml, .yml) or TOML (.toml) file with the same option names; the command line overrides it");
  t.word("topology", o.topology_text, "T-D", "T-D: target and drafter ranks per node (the rest idle); colocated: every rank holds a target and a drafter (one GPU: no mpirun needed); auto: measure both roles (and colocated), pick the fastest layout; plan: run the cost model's recommended layout without measuring")
      .check = [&o](const po::variable_value& v) {
        o.topology_text = v.as<std::string>();
        // auto and plan are chosen by run_job (auto_measure.h, layout_forecast.h)
        o.topology_choice = o.topology_text == "auto"   ? TopologyChoice::Auto
                            : o.topology_text == "plan" ? TopologyChoice::Plan
                                                        : TopologyChoice::Given;
        if (o.topology_choice == TopologyChoice::Given) o.topology = parse_topology_spec(o.topology_text);
      };
  t.rows.back().doc = "targets and drafters per node, the rest idle; `colocated`: every rank runs a target and a drafter in one process (one GPU: `dflash-train --topology colocated ...` without mpirun; see \"The colocated layout\"); `auto` measures both roles (and the two at once, colocated) first and picks the fastest layout (docs/report.md); `plan` runs the layout the layout plan recommends (the cost model, docs/cost_model.md), measuring nothing";
  t.word("backend", "auto", "NAME", "auto | cpu | cuda (auto: cuda where this build has CUDA and a GPU is visible, or a --dry-run names --gpu; else cpu)")
      .check = [&o](const po::variable_value& v) {
        const std::string& w = v.as<std::string>();
        if (w == "auto") {
          // (--gpu also names the GPU kind --topology plan picks for, on any backend: only a dry run's means cuda)
          const BackendDefault d = o.plan_gpu.empty() || !o.dry_run
                                       ? default_backend()
                                       : BackendDefault{Device::CUDA, "--gpu names the GPU this dry run plans for"};
          o.backend = d.device;
          o.backend_why = "chosen by --backend auto: " + d.why;
          return;
        }
        for (Device d : {Device::CPU, Device::CUDA})
          if (w == device_name(d)) return void((o.backend = d, o.backend_why = "as given"));
        check_range(false, "backend", w, "auto, cpu or cuda");
      };
  {
    OptionRow& r = t.rows.back();
    r.doc = "cpu: float32 reference; cuda: bf16 on the rank's GPU; auto: cuda where this build has the CUDA backend and a GPU is visible (or a `--dry-run` names `--gpu`), else cpu. The startup and the dry run say which and why; the resolved record holds the backend chosen";
    r.resolved_text = [&o] { return std::string(device_name(o.backend)); };
  }
  t.text("target", &o.target_dir, "DIR", "Hugging Face Qwen3 checkpoint directory (config.json + safetensors)", "required");
  t.text("target-precision", &o.target_precision, "bf16|fp8|fp8-dynamic",
         "how the target's linear projections run: fp8 quantizes a bf16 checkpoint on load (128x128 blocks, "
         "dynamic per-token groups of 128, as Qwen's -FP8 releases), fp8-dynamic into llm-compressor's "
         "FP8-Dynamic (a scale per output channel, one per token; docs/fp8.md); bf16 dequantizes an FP8 one",
         "the checkpoint's own");
  t.text("drafter", &o.drafter_dir, "DIR", "release-format drafter to start from (default: a fresh one)", "fresh")
      .doc = "release-format drafter to start from (its `target_layer_ids` are captured)";
  t.number("draft-layers", &o.draft_layers, "N", "layers of a fresh drafter", at_least(1), ">= 1")
      .doc = "layers of a fresh drafter (default layer ids `round(1 + i(L-4)/(n-1))`, for one layer the middle one, `L // 2`: the official `build_target_layer_ids`)";
  t.number("block-size", &tr.block_size, "N", "a fresh drafter's block: the anchor and N-1 tokens guessed at once");
  t.text("mask-token", &o.mask_token, "ID|TOKEN", "a fresh drafter's mask token: auto (an unused id of the target family: Qwen3 151669, Qwen3.5/3.6 248070, else vocab-1), an id, or a token looked up in the target's tokenizer.json")
      .doc = "a fresh drafter's mask token: auto = an unused id of the target family (Qwen3 151669, Qwen3.5/3.6 248070, else vocab-1), an id, or a token looked up in the target's `tokenizer.json`. The mask token is an id inside the target's vocabulary that no text produces, not a new embedding row: the drafter embeds it with the target's own table";
  t.text("target-layers", &o.target_layers, "L1,L2,...", "target layers a fresh drafter reads (l = output of decoder layer l; default: DFlash's rule, round(1 + i(L-4)/(n-1)) for n = --draft-layers > 1, the middle layer L/2 for n = 1)",
         "DFlash's rule (--draft-layers)");
  t.text("draft-layer-types", &o.draft_layer_types, "T1,T2,...", "a fresh drafter's attention, one per layer: full | sliding (default: all full; the Qwen3.6-27B recipe: sliding,sliding,sliding,sliding,full)", "all full");
  t.number("draft-sliding-window", &tr.sliding_window, "N", "keys a sliding drafter layer sees (the Qwen3.6-27B recipe: 2048)")
      .doc = "keys a sliding layer sees (the Qwen3.6-27B recipe: 2048); needed with a sliding layer, refused without one";
  auto heads_ok = std::function<bool(int)>([](int v) { return v >= 0 && v <= 1024; });
  t.number("draft-heads", &tr.draft_heads, "N", "a fresh drafter's query heads (0 = the target's; the Qwen3.8-27B release: 32)", heads_ok, "in [0, 1024]");
  t.number("draft-head-dim", &tr.draft_head_dim, "D", "a fresh drafter's head dim (0 = the target's; the Qwen3.8-27B release: 128)", heads_ok, "in [0, 1024]");
  t.number("draft-kv-heads", &tr.draft_kv_heads, "N", "a fresh drafter's KV heads (0 = the target's; the Qwen3.8-27B release: 8)", heads_ok, "in [0, 1024]");
  t.choice("draft-arch", &tr.draft_arch, "NAME", "a fresh drafter's architecture: dflash | dflash2 (grouped dynamic causal convs + a candidate selector, docs/dflash2.md); a --drafter DIR's config.json says its own",
           {{"dflash", DraftArch::DFlash}, {"dflash2", DraftArch::DFlash2}});
  {
    OptionRow& r = t.rows.back();
    r.doc = "a fresh drafter's architecture; DFlash2 adds grouped dynamic causal convs around every attention and MLP sublayer and a candidate selector (docs/dflash2.md); a `--drafter DIR` brings its own (`architectures` in its config.json) and the flag beside it is refused. CPU and CUDA backends";
    r.check = [&o, to_enum = r.check](const po::variable_value& v) {
      to_enum(v);
      o.draft_arch = v.as<std::string>();  // as given (resolve_drafter_recipe names it)
    };
  }
  t.section = S::DFlash2;
  t.number("conv-kernel-size", &tr.d2.conv_kernel_size, "K", "dflash2: taps of each grouped dynamic causal conv");
  t.number("conv-group-size", &tr.d2.conv_group_size, "N", "dflash2: channels per conv group (must divide the hidden size)");
  t.number("selector-top-k", &tr.d2.selector_top_k, "K", "dflash2: unary candidates the selector reranks per position (1..64)");
  t.number("selector-rank", &tr.d2.selector_rank, "R", "dflash2: rank of the selector's codebooks");
  t.section = S::Job;
  t.number("output-multiplier", &tr.output_multiplier, "X", "a fresh drafter's logit multiplier (compute_logits: z = X * lm_head(h))",
           std::function<bool(float)>([](float v) { return std::isfinite(v) && v > 0; }), "> 0");
  t.number("logit-softcap", &tr.logit_softcap, "C", "a fresh drafter's final logit softcap, z = C tanh(z / C) (0 = off)",
           std::function<bool(float)>([](float v) { return std::isfinite(v) && v >= 0; }), ">= 0 (0 = off)");
  t.add("data", "FILE.h5[:W]", "token dataset (HDF5, docs/data.md); several, each with a weight, train on a mix of them: --data a.h5:0.7 --data b.h5:0.3 (the shares of an epoch's records, docs/data.md \"Mixing datasets\")");
  {
    OptionRow& r = t.rows.back();
    r.doc_default = "required";
    r.doc = "token dataset (docs/data.md); repeated, each with a weight, a mix of datasets: `--data a.h5:0.7 --data b.h5:0.3` gives each file its share of an epoch's records, seeded and resumable (docs/data.md \"Mixing datasets\"). Unlike other options a repeated `--data` is not last-wins: without a weight on each it is refused (exit 2)";
    r.semantic = [] { return po::value<std::vector<std::string>>()->value_name("FILE.h5[:W]"); };
    r.check = [&o](const po::variable_value& v) {
      for (const std::string& d : v.as<std::vector<std::string>>()) o.data.push_back(parse_data_source(d));
      check_data_sources(o.data);
    };
    r.resolved_text = [&o] { return data_sources_text(o.data); };  // one file: its path, as before mixes
  }
  t.text("out", &o.out_dir, "DIR", "run directory: metrics.h5, drafter/ (the exported drafter)", "required");

  t.section = S::Data;
  t.number("token-budget", &o.token_budget, "N", "max tokens per packed batch", at_least(int64_t{2}), ">= 2");
  t.number("prefetch-depth", &o.prefetch_depth, "N", "batches the loader may hold ready per target (q_pre)", at_least(1), ">= 1");
  t.number("hs-queue-depth", &o.hs_queue_depth, "N", "receive slots = credits per drafter (q_hs)",
           std::function<bool(int)>([](int v) { return v >= 1 && v <= 1024; }), "in [1, 1024]")
      .doc = "receive slots = credits per drafter (q_hs), 1..1024";
  t.choice("data-plane", &o.data_plane, "NAME", "how hidden states travel: auto (nccl, else cuda-mpi, else host) | nccl (GPU to GPU; a GPU per rank) | cuda-mpi (a CUDA-aware MPI) | host (through host memory; always works)",
           named({DataPlaneChoice::Auto, DataPlaneChoice::Nccl, DataPlaneChoice::CudaMpi, DataPlaneChoice::Host}, data_plane_choice_name))
      .doc = "how hidden-state tensors travel: auto (nccl, else cuda-mpi, else host) | nccl | cuda-mpi | host (see \"Backends and the GPU job\"); may change on a resume";
  t.choice("hs-dtype", &o.hs_dtype, "DTYPE", "hidden states on the wire: bf16 (the backend's dtype: bf16 on CUDA, float32 on the CPU backend) | fp8 (e4m3 with one float32 scale per token row, dequantized by the drafter: about half of bf16's bytes)",
           named({HsDType::Backend, HsDType::Fp8}, hs_dtype_name))
      .doc = "the form hidden states take between a target's forward and a drafter's step, on every data plane: `bf16` = the backend's activation dtype as computed (bf16 on CUDA; float32 on the CPU backend), `fp8` = e4m3 codes with one float32 scale per token row (amax / 448, speculators' FP8 connector), quantized by the target after its forward and dequantized by the drafter: slots, send buffers and the bytes per batch about halve on CUDA (docs/fp8.md \"The FP8 wire\"); may not change on a resume";
  t.choice("batch-order", &o.batch_order, "NAME", "arrival (first come, best throughput) | fixed (a pure function of the topology: same losses on every run and across a resume)",
           named({BatchOrder::Arrival, BatchOrder::Fixed}, batch_order_name))
      .doc = "which batch a drafter trains next: the first to arrive (best throughput), or a pure function of the topology (same losses on every run and across a resume with several targets; see \"Order and determinism\"); may not change on a resume";
  // auto follows --batch-order, whose row runs first.
  t.word("deterministic", "auto", "WHEN", "auto (on with --batch-order fixed) | on | off: CUDA kernels that sum in a fixed order, so the same inputs give bit-identical steps and a resume reproduces the straight run (about 4% slower)")
      .check = [&o](const po::variable_value& v) {
        const std::string& w = v.as<std::string>();
        if (w == "auto") o.deterministic = o.batch_order == BatchOrder::Fixed;
        else if (w == "on") o.deterministic = true;
        else if (w == "off") o.deterministic = false;
        else check_range(false, "deterministic", w, "auto, on or off");
      };
  t.choice("long-record", &o.long_record, "NAME", "record longer than --token-budget: error | cut | skip",
           named({LongRecordPolicy::Error, LongRecordPolicy::Cut, LongRecordPolicy::Skip}, long_record_name))
      .doc = "a record longer than the budget: refuse to start (naming it), cut it, or drop it; skip dropping every record is refused too";
  t.number("epochs", &o.epochs, "N", "passes over the data (0 = forever; with --max-steps and no --epochs: as many as --max-steps takes, as HF Trainer)", at_least(0), ">= 0")
      .doc = "passes over the data; 0 = forever (needs `--max-steps`). With `--max-steps` and no `--epochs` the data repeats until `--max-steps` (HF Trainer's `max_steps` convention: the resolved `--epochs` is 0); with both, whichever ends first ends the run and the startup says so (`[dflash] note: the data (--epochs 1) ends at step 38, before --max-steps 100 ...`). May change on a resume: docs/checkpoint.md \"Extending a run\"";
  t.rows.back().resolved_text = [&o] { return str(o.epochs); };  // 0 with --max-steps and no --epochs
  t.number("max-steps", &o.max_steps, "N", "stop after this many (optimizer) steps (0 = when the data ends); without --epochs the data repeats until then", at_least(int64_t{0}), ">= 0")
      .doc = "stop after N (optimizer) steps (0: when the data ends); may change on a resume (extending a finished run)";
  t.number("peer-timeout", &o.peer_timeout_s, "SECONDS", "seconds any wait on a peer may take before the job ends with exit 7",
           std::function<bool(double)>([](double v) { return v > 0 && std::isfinite(v); }), "> 0 seconds");
  t.number("grad-bucket-mb", &o.grad_bucket_mb, "MIB", "with several drafters: MiB of gradient per allreduce bucket; buckets are summed while the backward still runs (as PyTorch DDP); 0 = one allreduce after the backward",
           std::function<bool(double)>([](double v) { return v >= 0 && std::isfinite(v); }), ">= 0 MiB (0 = one bucket)")
      .doc = "with several drafters: MiB of gradient per allreduce bucket, summed while the backward runs (see \"Backends and the GPU job\", Gradients); 0 = one allreduce after the backward; may change on a resume";

  t.section = S::Training;
  t.choice("loss", &tr.loss, "NAME", "ce | kl", {{"ce", LossKind::CE}, {"kl", LossKind::KL}})
      .doc = "ce | kl: the drafter's loss against the target (include/dflash/drafter.h)";
  t.flag("dpace", &tr.dpace, "D-PACE position weights");
  t.section = S::DFlash2;
  t.number("selector-loss-alpha", &tr.selector_loss_alpha, "X", "dflash2: weight of the selector's CE over its training candidates beside the unary loss",
           std::function<bool(float)>([](float v) { return std::isfinite(v) && v >= 0; }), ">= 0");
  t.choice("selector-candidates", &tr.selector_candidates, "NAME", "dflash2: the selector's training candidates: strict (the unary top-K as serving sees it; a label outside it gives no selector term: SpecForge now) | insert (the label put into slot K-1 when missing: speculators, and this project before issue 47)",
           {{"strict", SelectorCandidates::Strict}, {"insert", SelectorCandidates::Insert}});
  auto ratio = std::function<bool(double)>([](double v) { return std::isfinite(v) && v >= 0 && v <= 1; });
  t.number("selector-warmup-ratio", &tr.selector_warmup_ratio, "X", "dflash2: the selector term's weight is 0 for the first int(X x the run's planned steps) steps (SpecForge's dflash2_selector_warmup_ratio)", ratio, "in [0, 1]");
  t.number("selector-ramp-ratio", &tr.selector_ramp_ratio, "X", "dflash2: then rises linearly to --selector-loss-alpha over int(X x the run's planned steps) steps (SpecForge's dflash2_selector_ramp_ratio)", ratio, "in [0, 1]");
  t.flag("selector-stop-gradient", &tr.selector_stop_gradient, "dflash2: detach the selector's inputs (its loss moves only the selector)");
  t.section = S::Training;
  t.number("gamma", &tr.gamma, "X", "position decay exp(-(k-1)/gamma)", std::function<bool(float)>([](float v) { return v > 0; }), "> 0");
  // Bounded before anything is sized by them: 2^20 anchors x 16 block rows is far beyond any GPU's memory,
  // and a value like 2000000000 would otherwise end in an allocation failure instead of this message.
  constexpr int kMostAnchors = 1 << 20;
  t.number("max-anchors", &tr.max_anchors, "N", "anchors per packed batch at most: the drafter's buffers (loss rows, block attention) are sized by it (default 512; with --anchors-per-record N: N per 3072 tokens of --token-budget)",
           std::function<bool(int)>([](int v) { return v >= 1 && v <= kMostAnchors; }), "in [1, 1048576]")
      .doc = "anchors per packed batch at most: sizes the drafter's loss chunks, block attention and step buffers (the `--dry-run` memory plan's \"block activations\"); with `--anchors-per-record N` and no `--max-anchors`: N per 3072 tokens of `--token-budget`";
  t.rows.back().resolved_text = [&o] { return str(o.train.max_anchors); };  // the cap as resolved (default_max_anchors)
  t.number("anchors-per-record", &tr.anchors_per_record, "N", "up to N anchors in each record of a packed batch, among its valid positions, redrawn every step (the reference trainers' rule: 512); 0 = per batch only",
           std::function<bool(int)>([](int v) { return v >= 0 && v <= kMostAnchors; }), "in [0, 1048576] (0 = per batch only)")
      .doc = "up to N anchors in each record (sequence) of a batch, uniformly among its valid positions, redrawn every step (the reference trainers' rule: 512); more draws than `--max-anchors` are subsampled uniformly; 0 = the per-batch rule alone (include/dflash/anchors.h)";
  t.number("hs-noise", &tr.hs_noise, "STD", "std of Gaussian noise on target features", std::function<bool(float)>([](float v) { return v >= 0; }), ">= 0");
  t.number("grad-accum", &o.grad_accum, "K", "micro-batches (packed batches) per optimizer step on each drafter, the loss normalised over all of them as one large batch; the lr schedule, --max-steps and checkpoints count optimizer steps",
           [](int v) { return v >= 1 && v <= kMostMicroBatches; }, "in [1, 1048576]")
      .doc = "micro-batches (packed batches) per optimizer step on each drafter, one large batch's normalisation over all of them (see \"Gradient accumulation\"); may not change on a resume";
  t.number("global-batch-tokens", &o.global_batch_tokens, "T", "pick --grad-accum so one optimizer step holds about T tokens: K = ceil(T / (--token-budget x drafters)); 0 = --grad-accum decides (the reference recipes step on ~98K to ~262K tokens)",
           at_least(int64_t{0}), ">= 0 (0 = --grad-accum decides)");
  t.number("lr", &tr.lr, "LR", "peak learning rate (AdamW)", std::function<bool(float)>([](float v) { return v > 0 && std::isfinite(v); }), "> 0");
  t.number("warmup-steps", &tr.warmup_steps, "N", "linear warmup steps", at_least(0), ">= 0");
  t.number("warmup-ratio", &o.warmup_ratio, "X", "linear warmup over this fraction of the run's planned steps (instead of --warmup-steps); the lr then decays by cosine to --min-lr-ratio x --lr at the run's end: the data's last batch, or --max-steps",
           std::function<bool(double)>([](double v) { return v >= 0 && v < 1; }), "in [0, 1)")
      .doc = "the warmup as a fraction of the run's steps (instead of `--warmup-steps`). The lr schedule always ends with the run: before the first step the first target counts the batches every shard's loader will pack over `--epochs` (the packing is a pure function of the record lengths, `--token-budget`, `--long-record` and `--seed`: include/dflash/schedule.h), divides by the drafters, caps by `--max-steps`, prints `[dflash] lr schedule: ...` and tells every rank; the cosine reaches `--min-lr-ratio` x `--lr` at that step. `--epochs 0` without `--max-steps` has no end: constant after the warmup";
  t.number("min-lr-ratio", &tr.min_lr_ratio, "X", "where the cosine ends, as a fraction of --lr (0: decays to 0, as SpecForge's schedule)",
           std::function<bool(float)>([](float v) { return v >= 0 && v <= 1; }), "in [0, 1]");
  auto unit = std::function<bool(float)>([](float v) { return v >= 0 && v < 1; });
  t.number("adam-beta1", &tr.beta1, "X", "AdamW beta1 (default: torch.optim.AdamW's, as SpecForge)", unit, "in [0, 1)");
  t.number("adam-beta2", &tr.beta2, "X", "AdamW beta2 (default: torch.optim.AdamW's, as SpecForge)", unit, "in [0, 1)");
  t.number("adam-eps", &tr.eps, "X", "AdamW epsilon", std::function<bool(float)>([](float v) { return v > 0 && std::isfinite(v); }), "> 0");
  // (reads --lr, bound before any check runs)
  t.number("weight-decay", &tr.weight_decay, "X", "AdamW decoupled weight decay, p -= lr * X * p on every parameter (default 0, as SpecForge)",
           std::function<bool(float)>([&tr](float v) { return v >= 0 && v * tr.lr < 1; }), ">= 0 and below 1 / --lr");
  t.choice("optimizer-state", &tr.optimizer_state, "NAME", "fp32 (fp32 master weights and AdamW moments) | bf16 (bf16 weights and moments, each update computed in fp32 and stochastically rounded: 8 B per parameter less on CUDA; checkpoints stay fp32, so a resume may switch)",
           named({OptimizerState::Fp32, OptimizerState::Bf16}, optimizer_state_name));
  // The seed as digits only: an unsigned parse would quietly wrap "-1" to 2^64-1.
  t.word("seed", std::to_string(tr.seed), "N", "seed of data order, init and anchors (0 .. 2^63-1)")
      .check = [&tr](const po::variable_value& v) {
        const std::string& s = v.as<std::string>();
        const bool ok = !s.empty() && s.size() <= 19 && s.find_first_not_of("0123456789") == std::string::npos;
        check_range(ok && std::stoull(s) <= static_cast<uint64_t>(INT64_MAX), "seed", s, "a whole number in [0, 2^63)");
        tr.seed = std::stoull(s);
      };
  t.section = S::Eval;
  t.text("eval-data", &o.eval_data, "FILE.h5", "held-out token dataset (the --data format): loss, acc, acc by block position and streak on it, written to metrics.h5 /eval; its features are computed once at startup", "none");
  t.word("eval-max-tokens", o.eval_max_tokens == 0 ? "auto" : std::to_string(o.eval_max_tokens), "N|auto", "with --eval-data: evaluate at most N of its tokens; a larger file is evaluated on a fixed sample of whole records that fits (the same on every rank, split and resume). auto: what one drafter's 2 GiB of eval features holds at this drafter's shape (about 52K tokens at the Qwen3-8B shape on CUDA)")
      .check = [&o](const po::variable_value& v) {
        const std::string& s = v.as<std::string>();
        if (s == "auto") return void(o.eval_max_tokens = 0);
        const bool digits = !s.empty() && s.size() <= 15 && s.find_first_not_of("0123456789") == std::string::npos;
        check_range(digits && std::stoll(s) >= 1, "eval-max-tokens", s, "auto or a whole number >= 1");
        o.eval_max_tokens = std::stoll(s);
      };
  t.optional_number("eval-every", &o.eval_every, "N", "with --eval-data: evaluate every N steps and after the last (0 = only after the last; default: the --checkpoint-every step interval, else a tenth of the planned steps)",
                    "see \"Evaluation\"", at_least(int64_t{0}), ">= 0 (0 = only after the last step)");
  t.number("eval-tau-every", &o.eval_tau_every, "N", "with --eval-data: every N steps and after the last, also measure tau (acceptance length) by greedy speculative decoding of the eval set's prompts, as dflash-eval does (metrics.h5 /eval/tau, the [eval] line; OUT/drafter-best is kept by it). Costs GPU time: each drafter rank loads the target too and decodes its share of the prompts while training waits (0 = off)",
           at_least(int64_t{0}), ">= 0 (0 = off)");
  t.number("eval-tau-prompts", &o.eval_tau_prompts, "N", "with --eval-tau-every: the first N usable prompts of the eval set (a record's tokens before its first loss_mask 1), split among the drafters", at_least(1), ">= 1");
  t.number("eval-tau-max-new-tokens", &o.eval_tau_max_new_tokens, "N", "with --eval-tau-every: tokens generated per prompt", at_least(1), ">= 1");
  t.number("eval-tau-prompt-batch", &o.eval_tau_prompt_batch, "N", "with --eval-tau-every: prompts each drafter decodes together, one packed target forward of at most --token-budget tokens per step (as dflash-eval --prompt-batch: the same tau); 1 = one after another (> 1: the drafter rank's target copy holds that packed forward's activations, which --dry-run does not count)", at_least(1), ">= 1");

  t.section = S::Output;
  t.number("log-every", &o.log_every, "N", "status line and rank timings every N steps", at_least(1), ">= 1");
  t.number("metrics-flush-every", &o.metrics_flush_every, "N", "flush metrics.h5 after N appends", at_least(1), ">= 1");
  t.choice("export-dtype", &o.export_dtype, "DTYPE", "dtype of the exported drafter: bf16 | f32", {{"bf16", DType::BF16}, {"f32", DType::F32}})
      .doc = "dtype of the exported drafter (bf16: the release format serving engines load)";
  t.text("checkpoint-every", &o.checkpoint_every, "N|Nm", "N steps or Nm minutes (0 = only on SIGUSR1/SIGTERM)", "none")
      .check = [&o](const po::variable_value&) { parse_checkpoint_every(o.checkpoint_every); };  // fatal, naming the flag
  t.rows.back().doc = "N steps or Nm minutes (0 = only on SIGUSR1/SIGTERM, which checkpoint and exit 75; docs/checkpoint.md)";
  t.text("checkpoint-dir", &o.checkpoint_dir, "DIR", "where checkpoints go (default OUT/checkpoints)", "OUT/checkpoints");
  t.number("keep-checkpoints", &o.keep_checkpoints, "N", "complete checkpoints kept (older ones are deleted)", at_least(1), ">= 1");
  t.flag("export-checkpoints", &o.export_checkpoints, "also export each checkpoint's drafter into STEP_DIR/drafter");
  t.text("resume", &o.resume, "auto|PATH", "auto (the newest complete checkpoint, or a fresh start) | PATH (a checkpoint or checkpoint dir)", "a fresh start");
  t.number("power-budget-w", &o.power_budget_w, "W", "with --topology auto (needs power readings) or plan (the GPU kind's board power): the fastest layout within this many watts")
      .doc = "with `--topology auto` and `--rebalance auto` (measured power) and `--topology plan` or `--dry-run`'s layout plan (the GPU kind's board power, docs/cost_model.md): the fastest layout (a split, or colocated) within W watts (0 = no budget)";
  t.text("report-to", &o.report_to, "LIST", "tensorboard,csv,wandb: the run's series in OUT/tensorboard, OUT/csv and (at the end of each job, offline) OUT/wandb while it trains, by tools/dflash-report in the background", "none")
      .check = [&o](const po::variable_value&) { parse_report_to(o.report_to); };  // fatal, naming a bad word
  t.rows.back().doc = "`tensorboard,csv,wandb`: the run's series in `OUT/tensorboard`, `OUT/csv`, `OUT/wandb` while it trains (docs/metrics.md \"Your own tools while it trains\")";
  t.number("report-every", &o.report_every_min, "MIN", "--report-to: minutes between exports",
           std::function<bool(double)>([](double v) { return v > 0 && std::isfinite(v); }), "> 0 minutes");
  t.choice("rebalance", &o.rebalance, "auto|off", "auto: at each checkpoint, when this run's measured service times predict another split of the node's GPUs (or colocated) --rebalance-min-gain faster (within --power-budget-w), every rank takes its new role in place (needs --checkpoint-every)",
           {{"auto", RebalanceMode::Auto}, {"off", RebalanceMode::Off}})
      .doc = "at each checkpoint, when this layout's measured service times predict another split of the node's ranks (or the colocated layout) `--rebalance-min-gain` faster (within `--power-budget-w`), every rank takes its new role in place and the run goes on from that checkpoint, in the same mpirun (docs/checkpoint.md \"Re-splitting live\"); needs `--checkpoint-every`";
  t.number("rebalance-min-gain", &o.rebalance_min_gain_pct, "PCT", "--rebalance auto: the predicted gain (percent) a change of split must reach",
           std::function<bool(double)>([](double v) { return v >= 0 && v < 1000; }), "a percentage in [0, 1000)");
  t.flag("measure-only", &o.measure_only, "with --topology auto: measure each role standalone on every rank, print the what-if table, exit (no training; any rank count)");

  t.section = S::TestHooks;
  t.number("inject-delay-target-ms", &o.inject_delay_target_ms, "MS", "sleep per batch on targets", at_least(0), ">= 0");
  t.number("inject-delay-drafter-ms", &o.inject_delay_drafter_ms, "MS", "sleep per step on drafters", at_least(0), ">= 0");
  t.number("inject-delay-colocated-ms", &o.inject_delay_colocated_ms, "MS", "sleep per batch on a colocated rank's drafter outside its busy time, and in --topology auto's colocated phase after both roles' work: two roles contending for one device (a split is not slowed)", at_least(0), ">= 0");
  t.number("inject-fail-rank", &o.inject_fail_rank, "RANK", "world rank that fails on purpose");
  t.number("inject-fail-step", &o.inject_fail_step, "N", "batch (target) or step (drafter; a colocated rank: its drafter's step) at which it fails; an idle rank fails as soon as it waits for the end of the run");
  t.choice("inject-fail-mode", &o.inject_fail_mode, "MODE", "kill (SIGKILL) | hang (SIGSTOP: silent, alive)", {{"kill", FailMode::Kill}, {"hang", FailMode::Hang}})
      .doc = "SIGKILL itself, or SIGSTOP itself (alive and silent: the peers' deadlines end the job)";
  t.number("inject-stop-step", &o.inject_stop_step, "N", "the drafters act as on a stop signal after optimizer step N: checkpoint, exit 75");
  t.text("inject-trace-dir", &o.inject_trace_dir, "DIR", "each rank appends the batches it sent (targets: their records) or trained on (drafters) to DIR/trace.rankNNNNN", "none")
      .doc = "every rank appends the batches it sent (targets: their record ids) or trained on in applied steps (drafters) to DIR/trace.rankNNNNN (src/runtime/test_trace.h)";
  t.number("inject-eval-budget-bytes", &o.inject_eval_budget_bytes, "BYTES", "eval features a drafter may keep, instead of 2 GiB (0 = 2 GiB): a small one makes the tiny model's eval set too large", at_least(int64_t{0}), ">= 0");

  t.section = S::Hidden;
  t.command("help-markdown", "print docs/pipeline.md's options table (Markdown, made from this table) and exit");

  // --help's opening block: what a first job sets (docs/pipeline.md "Options"), in table order.
  for (const char* first : {"config", "topology", "backend", "target", "data", "out", "token-budget", "epochs",
                            "max-steps", "loss", "max-anchors", "lr", "checkpoint-every", "resume"})
    for (OptionRow& r : t.rows)
      if (r.name == first) r.section = S::FirstJob;
  return std::move(t.rows);
}

}  // namespace dflash
