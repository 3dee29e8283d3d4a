// dflash-train's command line (docs/pipeline.md "Options"): parsed once, on every rank, into Options.
//
// Each option is one row of src/runtime/option_table.cpp (name, help, the field below, its check); a row's
// default is the field's initialiser here, the only place it is written. --help, the resolved record and
// docs/pipeline.md's options table (--help-markdown) are made from the rows.
//
// Sources: the command line, then --config FILE (key = value, the same names without "--"); the command
// line wins because Boost.ProgramOptions keeps the first value stored. Within one source a repeated option
// resolves last-wins (as launchers and job scripts expect), except --data: every one is kept (several make
// a mix, each with a weight, or are refused). Every user error ends in fatal(BadOptions) with a message
// naming the flag; a missing input file is BadInput.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dflash/data.h"         // LongRecordPolicy (--long-record)
#include "dflash/data_plane.h"   // DataPlaneChoice (--data-plane)
#include "dflash/hs_batch.h"     // HsDType (--hs-dtype)
#include "dflash/data_source.h"  // DataSource (--data)
#include "dflash/drafter.h"  // TrainOptions, LossKind
#include "dflash/flow_control.h"  // BatchOrder (--batch-order)
#include "dflash/tensor.h"   // DType, Device (--backend is a Device: one enum for both)
#include "dflash/topology.h"  // TopologySpec (--topology)

namespace dflash {

enum class RebalanceMode { Off, Auto };  // --rebalance

// What a test hook does to its rank at --inject-fail-step.
enum class FailMode : uint8_t {
  Kill,  // SIGKILL itself: mpirun notices the dead process and ends the job
  Hang,  // SIGSTOP itself: alive but silent, so its peers' deadlines (--peer-timeout) must end the job
};

// --gpu: the GPU a dry run checks each rank's memory against: a known model's memory as its driver reports
// it (nvidia-smi's memory.total), or a size in GiB. Fatal BadOptions on anything else, naming the known ones.
struct PlannedGpu {
  std::string name;     // "h200", or "96 GiB"
  std::string model;    // "NVIDIA H200" ("" for a size)
  double bytes = 0;
};
PlannedGpu parse_planned_gpu(const std::string& text);

// How --topology names the first segment's split: given (T-D), measured (auto: src/runtime/auto_measure.h) or
// predicted (plan: the cost model's recommendation, src/runtime/layout_forecast.h, without measuring).
enum class TopologyChoice : uint8_t { Given, Auto, Plan };

struct Options {
  std::string config_file;
  std::string topology_text = "1-1";
  TopologySpec topology;        // {0, 0} with --topology auto|plan (run_job chooses the segment's split)
  TopologyChoice topology_choice = TopologyChoice::Given;  // how --topology names the split
  std::string calibration_file;  // --calibration: the layout plan's GPU constants (dflash-report's calibration.json)
  Device backend = Device::CPU;  // --backend: where the job's tensors live (device_name() spells it)
  std::string backend_why;       // how --backend was decided ("chosen by --backend auto: ..."; backend_line says it)
  std::string target_dir;       // HF Qwen3 checkpoint (config.json + safetensors)
  std::string target_precision;  // --target-precision bf16|fp8|fp8-dynamic; "" = the checkpoint's own (docs/fp8.md)
  std::string drafter_dir;      // release-format drafter to start from; empty = fresh
  int draft_layers = 5;
  std::vector<DataSource> data;  // --data: one token dataset (.h5), or several with weights (a mix, data_mix.h)
  std::string eval_data;        // --eval-data: held-out token dataset (.h5); empty = no evaluation
  int64_t eval_every = -1;      // --eval-every: steps between evaluations (0 = only at the end; -1 = not given:
                                // the segment's plan resolves it once the run's length is known: RunPlan)
  // --eval-tau-every: steps between measurements of tau (greedy speculative decoding of the eval set's
  // prompts, dflash-eval's algorithm, on the drafter ranks; 0 = off); --eval-tau-prompts and
  // --eval-tau-max-new-tokens bound the work (src/runtime/drafter_tau.h); --eval-tau-prompt-batch prompts
  // decode together (one packed target forward of at most --token-budget tokens per step).
  int64_t eval_tau_every = 0;
  int eval_tau_prompts = 32;
  int eval_tau_max_new_tokens = 128;
  // --eval-tau-prompt-batch: 1 (one prompt at a time, as before batching): > 1 sizes the drafter rank's target
  // copy for a packed forward of up to --token-budget tokens, memory the dry run does not count
  int eval_tau_prompt_batch = 1;
  // --eval-max-tokens: the most tokens of --eval-data evaluated (their features are kept on the drafters'
  // hosts); a larger file is evaluated on a fixed sample of its records (include/dflash/eval_set.h).
  // 0 = auto: what one drafter's eval-feature budget holds.
  int64_t eval_max_tokens = 0;
  std::string out_dir;          // run directory: metrics.h5, drafter/, drafter-best/

  int64_t token_budget = 32768;
  int prefetch_depth = 4;
  int hs_queue_depth = 4;       // receive slots (= credits) per drafter
  DataPlaneChoice data_plane = DataPlaneChoice::Auto;
  HsDType hs_dtype = HsDType::Backend;  // --hs-dtype bf16|fp8: hidden states on the wire (docs/fp8.md)
  BatchOrder batch_order = BatchOrder::Arrival;
  // CUDA kernels that sum in a fixed order (set_deterministic_kernels, about 4% of the 8B step): identical
  // inputs give bit-identical steps, so a resumed run reproduces the straight run bit for bit.
  // --deterministic auto (the default) turns it on with --batch-order fixed, the resume-exact mode.
  bool deterministic = false;
  // --warmup-ratio: the warmup as a fraction of the run's planned steps (0 = --warmup-steps decides).
  double warmup_ratio = 0;
  LongRecordPolicy long_record = LongRecordPolicy::Error;
  int64_t max_steps = 0;        // 0 = until the data ends
  int epochs = 1;               // 0 = forever (then --max-steps must end the run)
  int log_every = 10;
  int metrics_flush_every = 10;
  double peer_timeout_s = 120;
  double grad_bucket_mb = 25;   // gradient allreduce buckets (MiB), launched during the backward; 0 = one after it
  // Gradient accumulation: micro-batches per optimizer step on each drafter (--grad-accum K), or picked from
  // --global-batch-tokens T (0 = not given) once the drafters are known (grad_accum_of, src/runtime/run_plan.h).
  int grad_accum = 1;
  int64_t global_batch_tokens = 0;
  DType export_dtype = DType::BF16;  // --export-dtype: the release format serving engines load
  TrainOptions train;           // loss, dpace, gamma, max_anchors, hs_noise, lr, warmup, seed, ...
  // A fresh drafter's recipe as typed (parse_options resolves them into train): --mask-token auto | ID |
  // TOKEN (looked up in the target's tokenizer.json), --target-layers "1,16,31,46,61",
  // --draft-layer-types "sliding,sliding,sliding,sliding,full".
  std::string mask_token = "auto", target_layers, draft_layer_types;
  std::string draft_arch = "dflash";  // --draft-arch as given (train.draft_arch once resolved)

  // Checkpoints and resume (docs/checkpoint.md).
  std::string checkpoint_every, checkpoint_dir, resume;
  int keep_checkpoints = 3;
  bool export_checkpoints = false;  // also export each checkpoint's drafter (release format) into it
  double power_budget_w = 0;
  // --rebalance auto: at a checkpoint, when the measured service times predict another split at least
  // --rebalance-min-gain (percent) faster (and within --power-budget-w), every rank takes its new role in
  // place (docs/checkpoint.md "Re-splitting live").
  std::string report_to;          // --report-to tensorboard,csv,wandb (src/runtime/report_sidecar.h)
  double report_every_min = 10;   // --report-every: minutes between exports while the job runs
  RebalanceMode rebalance = RebalanceMode::Off;
  double rebalance_min_gain_pct = 5;
  bool measure_only = false;    // --topology auto --measure-only: print the measured roles and exit
  bool dry_run = false;         // --dry-run: print options, topology and schedule, load nothing, exit 0
  // --dry-run only: the world it plans without mpirun (--ranks N, or --nodes N --gpus-per-node G, resolved
  // into all three; 0 = the MPI world it runs in) and the GPU it checks the memory against (--gpu, as
  // given; "" = none named).
  int plan_ranks = 0, plan_nodes = 0, plan_ranks_per_node = 0;
  std::string plan_gpu;

  // Test hooks.
  int inject_delay_target_ms = 0;
  int inject_delay_drafter_ms = 0;
  int inject_delay_colocated_ms = 0;  // per batch while both roles of a colocated rank run (auto's colocated phase too)
  int inject_fail_rank = -1;
  int64_t inject_fail_step = -1;
  FailMode inject_fail_mode = FailMode::Kill;
  int64_t inject_stop_step = -1;     // the drafters act as on a stop signal after this step (checkpoint, exit 75)
  std::string inject_trace_dir;      // every target's sent batches (their records) and every drafter's applied
                                     // batches, to DIR/trace.rankNNNNN (src/runtime/test_trace.h)
  int64_t inject_eval_budget_bytes = 0;  // replaces the 2 GiB of eval features per drafter (0 = keep it)

  std::string command_line;      // argv as typed, shell-quoted where needed (metrics.h5's command_line)

  // "name = value" lines of every option (the resolved configuration, printed at startup and stored
  // in metrics.h5).
  std::vector<std::pair<std::string, std::string>> resolved;
  // The type the parser holds each resolved option's value in (absent: Text): to_json() and metrics.h5's
  // /options attributes keep it (numbers as numbers, flags as true/false).
  enum class ValueKind { Text, Integer, Real, Flag };
  std::map<std::string, ValueKind> resolved_kind;
  std::string to_json() const;  // {"lr": 0.0006, "topology": "1-1", "dpace": false, ...}
};
// to_json's form of any resolved record (a segment's, with the options it resolved written in: run_plan.h).
std::string resolved_options_json(const std::vector<std::pair<std::string, std::string>>& resolved,
                                  const std::map<std::string, Options::ValueKind>& kinds);

// Parses argv (+ --config). --help, --help-all (with the test hooks) and --version return with
// help_requested = true and the text to print (the caller prints it once, exit 0).
struct ParseResult {
  Options options;
  bool help_requested = false;
  std::string help_text;
};
ParseResult parse_options(int argc, const char* const* argv);

// Checks that the files the job needs exist (target config.json, dataset, drafter dir when given):
// fatal BadInput naming the path otherwise. Cheap, done before any model loads.
void check_input_paths(const Options& o);

// The startup line of --optimizer-state bf16 (printed by the job and --dry-run): what is kept and the bytes
// per parameter against fp32 on this backend. "" with the fp32 state (the default prints nothing).
std::string optimizer_state_line(const Options& o);

// The startup line of the backend (printed by the job and --dry-run): which, and why ("[dflash] backend: cpu,
// chosen by --backend auto: this build has no CUDA backend (--backend cpu or cuda to choose)").
std::string backend_line(const Options& o);

// parse_options' last step for a fresh drafter's recipe (src/runtime/drafter_recipe.cpp): --mask-token,
// --target-layers and --draft-layer-types into o.train. `given` names the recipe options set explicitly;
// with --drafter DIR (which brings its own config) any of them is a BadOptions error.
void resolve_drafter_recipe(Options& o, const std::vector<std::string>& given);

}  // namespace dflash
