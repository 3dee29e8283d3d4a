// dflash-train --dry-run: what the job would do — the resolved options, every rank's role and the
// schedule — without loading a model or reading the dataset's tokens, so a launch line (mpirun/srun,
// --topology, the Slurm script's arguments) can be checked in seconds before a GPU is busy for days.
#include <algorithm>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "data/h5_util.h"
#include "dflash/anchors.h"     // anchor_rule_summary
#include "dflash/drafter.h"
#include "dflash/checkpoint.h"  // parse_checkpoint_every
#include "dflash/data.h"        // hdf5_mutex()
#include "dflash/data_source.h" // mix_slot_counts
#include "dflash/error.h"
#include "dflash/eval_set.h"
#include "dflash/mpi_typed.h"
#include "dflash/runtime.h"
#include "dflash/topology.h"
#include "dry_run_plan.h"
#include "job.h"  // the job's input checks
#include "layout_forecast.h"
#include "report_sidecar.h"  // check_report_to
#include "run_plan.h"

namespace dflash {

namespace {

// --eval-data from its /offsets alone (no token read): records, tokens, the sample --eval-max-tokens keeps
// of a larger file (the job's own rule: select_eval_records, the same records), the batches it packs into
// per drafter (include/dflash/eval_set.h); a given --eval-max-tokens the drafters cannot keep fails it as it
// would fail the job. The job checks the rest of the file when it starts. num_drafters 0: not known yet
// (--topology auto), so only one drafter's budget is certain.
// A token dataset's /offsets and its vocab_size attribute (-1 when absent), nothing else read; empty offsets
// when the file does not have them (the job reports what is wrong with it).
std::vector<int64_t> read_offsets(const std::string& path, double* vocab_size = nullptr) {
  std::vector<int64_t> offsets;
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::quiet_errors();
  h5::Handle fapl(h5::fapl_no_locking(), h5::Handle::Kind::PropList);
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), h5::Handle::Kind::File);
  if (vocab_size && (!file.valid() || !h5::read_attr_number(file, "vocab_size", vocab_size))) *vocab_size = -1;
  if (file.valid() && h5::link_exists(file, "offsets")) {
    h5::Handle ds(H5Dopen2(file, "offsets", H5P_DEFAULT), h5::Handle::Kind::Dataset);
    const std::vector<hsize_t> d = ds.valid() ? h5::dims(ds) : std::vector<hsize_t>{};
    if (d.size() == 1 && d[0] >= 2) {
      offsets.resize(d[0]);
      if (H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()) < 0) offsets.clear();
    }
  }
  return offsets;
}

// What the job would die of in its first seconds, checked here so a Slurm job does not queue for hours to
// fail at once (the same checks as the job's: src/runtime/job_inputs.cpp, include/dflash/data.h): --data
// tokenized for another vocabulary, records longer than --token-budget under --long-record error (or none
// left under skip), --draft-layers above the target's layers, --report-to wandb where wandb cannot be imported.
// Returns what it has to say ("" or lines ending in a newline).
std::string check_inputs_as_the_job(const Options& o, const ModelPlan& plan) {
  check_draft_layers(o, plan, false);
  const std::string report = check_report_to(o);
  for (const DataSource& d : o.data) {
    double vocab = -1;
    const std::vector<int64_t> offsets = read_offsets(d.path, &vocab);
    if (vocab > 0) check_dataset_vocabulary(d.path, static_cast<int>(vocab), plan.target.text.vocab_size);
    if (offsets.size() >= 2)
      check_record_lengths(o, d.path, [&](size_t r) { return offsets[r + 1] - offsets[r]; }, offsets.size() - 1);
  }
  return report.empty() ? report : report + "\n";
}

std::string eval_summary(const Options& o, int num_drafters, const ModelPlan& job_plan) {
  if (o.eval_data.empty()) return "";
  const std::vector<int64_t> offsets = read_offsets(o.eval_data);
  std::ostringstream os;
  if (offsets.empty()) {
    os << "[dflash] eval: " << o.eval_data << ": no /offsets to size it (the job will say why)\n";
    return os.str();
  }
  std::vector<int64_t> lengths;
  for (size_t r = 0; r + 1 < offsets.size(); ++r) lengths.push_back(offsets[r + 1] - offsets[r]);
  const LongRecord policy = job_plan.loader.long_record;
  const EvalBudget budget = job_plan.eval_budget(o);
  const int drafters = std::max(1, num_drafters);
  if (num_drafters == 0 && o.eval_max_tokens > budget.tokens_per_drafter())
    os << "[dflash] eval: --eval-max-tokens " << o.eval_max_tokens << " is more than one drafter's budget ("
       << budget.tokens_per_drafter() << " tokens): checked at startup, once --topology auto has chosen the drafters\n";
  const int64_t max_tokens = resolve_eval_max_tokens(num_drafters == 0 ? std::min(o.eval_max_tokens, budget.tokens_per_drafter())
                                                                       : o.eval_max_tokens,
                                                     budget, drafters);
  const EvalSelection chosen = select_eval_records(lengths, o.token_budget, policy, max_tokens, o.eval_data);
  const std::string sample = eval_sample_line(chosen, o.eval_data, o.eval_max_tokens == 0, budget);
  if (!sample.empty()) os << sample << "\n";
  const auto plan = plan_eval_batches(chosen.lengths, o.token_budget, policy);
  std::vector<int64_t> batch_tokens;
  int64_t tokens = 0;
  for (const auto& b : plan) {
    int64_t t = 0;
    for (const EvalPiece& p : b) t += p.take;
    batch_tokens.push_back(t);
    tokens += t;
  }
  if (num_drafters > 0) check_eval_share_fits(batch_tokens, num_drafters, budget, o.eval_data);
  os << "[dflash] eval: " << o.eval_data << ": " << chosen.records << " records, " << tokens << " tokens in "
     << plan.size() << " batch(es) of <= " << o.token_budget << " tokens (" << eval_share_summary(batch_tokens, drafters)
     << "); features computed once at startup; evaluated ";
  if (o.eval_every > 0) os << "every " << o.eval_every << " step(s) and after the last\n";
  else if (o.eval_every == 0) os << "after the last step only\n";
  else if (parse_checkpoint_every(o.checkpoint_every).unit == CheckpointUnit::Steps)
    os << "every " << parse_checkpoint_every(o.checkpoint_every).steps << " step(s) (the --checkpoint-every interval) and after the last\n";
  else os << "every tenth of the planned steps (counted when the job starts) and after the last\n";
  if (o.eval_tau_every > 0)
    os << "[dflash] eval tau: the first " << o.eval_tau_prompts << " prompts, " << o.eval_tau_max_new_tokens
       << " new tokens each, every " << o.eval_tau_every << " step(s) and after the last (with the loss); each drafter "
       << "rank loads the target too; the best drafter is kept in " << o.out_dir << "/drafter-best\n";
  else
    os << "[dflash] the best drafter by eval loss is kept in " << o.out_dir << "/drafter-best\n";
  return os.str();
}

// --data's records and tokens per epoch, and its name for the line: one file's shape; a mix's slots
// (mix_slot_counts) and its tokens estimated from each file's mean record length (the seeded subsets are
// the job's to draw). {-1, -1} when a file lacks the arrays.
struct DataShape {
  int64_t records = -1, tokens = -1;
  std::string name;
};
DataShape data_shape(const Options& o) {
  DataShape shape;
  if (o.data.size() == 1) {
    std::tie(shape.records, shape.tokens) = dataset_shape(o.data[0].path);
    shape.name = o.data[0].path;
    return shape;
  }
  std::vector<int64_t> records, tokens;
  std::vector<double> weights;
  for (const DataSource& d : o.data) {
    const auto [r, t] = dataset_shape(d.path);
    if (r <= 0 || t <= 0) return DataShape{-1, -1, d.path};
    records.push_back(r);
    tokens.push_back(t);
    weights.push_back(d.weight);
  }
  const std::vector<int64_t> slots = mix_slot_counts(records, weights);
  std::ostringstream name;
  name << "mix of " << o.data.size() << " datasets (";
  double est = 0;
  shape.records = 0;
  for (size_t i = 0; i < o.data.size(); ++i) {
    est += static_cast<double>(tokens[i]) * static_cast<double>(slots[i]) / static_cast<double>(records[i]);
    shape.records += slots[i];
    name << (i ? ", " : "") << o.data[i].path << ": " << records[i] << " records -> " << slots[i] << " slots";
  }
  name << ")";
  shape.tokens = static_cast<int64_t>(std::llround(est));
  shape.name = name.str();
  return shape;
}

std::string schedule(const Options& o, int num_drafters) {
  std::ostringstream os;
  const DataShape shape = data_shape(o);
  const int64_t records = shape.records, tokens = shape.tokens;
  int64_t steps_per_epoch = -1;
  if (tokens > 0) {
    // Packing fills a batch up to --token-budget and never splits a record, so this is a lower bound.
    const int64_t batches = (tokens + o.token_budget - 1) / o.token_budget;
    const int64_t micro = std::max<int64_t>(1, batches / std::max(1, num_drafters));
    steps_per_epoch = (micro + o.grad_accum - 1) / o.grad_accum;
    os << "[dflash] data: " << shape.name << ": " << records << (o.data.size() > 1 ? " slots, ~" : " records, ") << tokens
       << " tokens -> at least "
       << batches << " batches of <= " << o.token_budget << " tokens per epoch; one step = "
       << (o.grad_accum > 1 ? std::to_string(o.grad_accum) + " batches (micro-batches)" : std::string("one batch"))
       << " on each of " << num_drafters << " drafter(s): >= " << steps_per_epoch << " steps per epoch\n";
  } else {
    os << "[dflash] data: " << shape.name << ": no /tokens and /offsets to size the epoch (the job will say why)\n";
  }
  os << "[dflash] schedule: ";
  if (o.max_steps > 0 && o.epochs > 0)
    os << "until step " << o.max_steps << " or the end of epoch " << o.epochs << ", whichever comes first";
  else if (o.max_steps > 0)
    os << o.max_steps << " steps (the data repeats: --epochs 0)";
  else
    os << o.epochs << " epoch(s)" << (steps_per_epoch > 0 ? " = >= " + std::to_string(steps_per_epoch * o.epochs) + " steps" : "");
  os << "\n[dflash] lr: ";
  char lr[32];
  std::snprintf(lr, sizeof(lr), "%g", o.train.lr);
  if (o.warmup_ratio > 0) os << "linear warmup over " << o.warmup_ratio << " of the steps to " << lr << ", then ";
  else if (o.train.warmup_steps > 0) os << "linear warmup over " << o.train.warmup_steps << " steps to " << lr << ", then ";
  else os << lr << ", ";
  if (o.epochs > 0)  // the job counts the packed batches when it starts (include/dflash/schedule.h)
    os << "cosine decay to " << o.train.min_lr_ratio << " x lr at the run's last step (the data's last batch"
       << (o.max_steps > 0 ? ", or --max-steps if sooner" : "") << "; counted exactly when the job starts)";
  else if (o.max_steps > 0)
    os << "cosine decay to " << o.train.min_lr_ratio << " x lr at step " << o.max_steps;
  else
    os << "constant (--epochs 0 without --max-steps: the run has no end to decay to)";
  os << "\n[dflash] output: " << o.out_dir << "/metrics.h5, a status line every " << o.log_every << " steps; checkpoints "
     << (parse_checkpoint_every(o.checkpoint_every).unit == CheckpointUnit::Off
             ? std::string("only on SIGUSR1/SIGTERM")
             : "every " + parse_checkpoint_every(o.checkpoint_every).to_string())
     << " into " << (o.checkpoint_dir.empty() ? o.out_dir + "/checkpoints" : o.checkpoint_dir) << " (keep "
     << o.keep_checkpoints << ")" << (o.resume.empty() ? "" : "; --resume " + o.resume) << "; the drafter exported to "
     << o.out_dir << "/drafter\n";
  return os.str();
}

// Every layout this world allows, predicted by the cost model (src/runtime/layout_forecast.h) for the GPU
// planned for, with the recommendation and how far --topology is from it; a line saying why not where no GPU
// kind is known (the CPU backend, or no --gpu and no GPU here).
std::string layout_plan_text(const std::optional<LayoutForecast>& f, const Options& o) {
  if (!f)
    return o.backend == Device::CUDA
               ? "[dflash] layout plan: no GPU kind to predict for: give --gpu h100|h200|b200|rtx-pro-6000\n"
               : "[dflash] layout plan: GPU layouts only (--backend cuda --gpu NAME)\n";
  return forecast_text(*f);
}

}  // namespace

int dry_run(const Options& o) {
  int rank = 0;
  DF_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  if (rank == 0) check_input_paths(o);  // cheap (stat); a bad path is worth knowing before the real launch
  // The world: the one --ranks / --nodes name, planned in this process, else this MPI world (collective).
  // No device is opened either way: a dry run plans the GPU job on a login node as well.
  const PlannedWorld world = o.plan_ranks > 0 ? planned_world(o.plan_nodes, o.plan_ranks_per_node, o.backend)
                                              : mpi_world(MPI_COMM_WORLD, o.backend);
  if (rank != 0) {  // rank 0 plans and prints; a fatal error there ends these too
    DF_MPI(MPI_Barrier(MPI_COMM_WORLD));
    return 0;
  }
  const int size = static_cast<int>(world.seats.size());
  const ModelPlan plan = plan_job(o);  // the config.json files only
  const std::string input_notes = check_inputs_as_the_job(o, plan);
  const RoleMemory memory = plan_role_memory(o, plan);
  const PlannedGpu gpu = gpu_to_check(o);
  std::ostringstream os;
  os << "[dflash] dflash-train " << DFLASH_VERSION << " --dry-run: nothing is loaded, nothing is written\n[dflash] options:";
  for (const auto& [k, v] : o.resolved) os << " --" << k << "=" << v;
  os << "\n" << backend_line(o) << "\n[dflash] anchors: " << anchor_rule_summary(o.train.max_anchors, o.train.anchors_per_record) << "\n";
  if (const std::string line = optimizer_state_line(o); !line.empty()) os << line << "\n";
  const std::string planned = world.source == WorldSource::Planned
                                  ? " (planned here by --ranks/--nodes: one process, no mpirun, no GPU)"
                                  : std::string();
  const std::optional<LayoutForecast> forecast =
      forecast_layouts(o, plan, memory, gpu.bytes, world.num_nodes, world.ranks_per_node);
  TopologySpec split = o.topology;
  if (o.topology_choice == TopologyChoice::Plan) {
    DF_CHECK_HINT(forecast, BadOptions, "--topology plan: no GPU kind to plan for",
                  "give --gpu h100|h200|b200|rtx-pro-6000 (or its memory in GiB), or --topology T-D");
    split = recommended_split(*forecast);
    os << "[dflash] topology: plan over " << size << " rank(s): " << split.to_string()
       << ", the layout plan's recommendation (below)\n";
  }
  int num_drafters = 1;
  std::vector<int> target_ranks, drafter_ranks;  // empty under --topology auto: the roles are not known yet
  if (o.topology_choice == TopologyChoice::Auto) {
    // The split comes from timing both roles on the real model and data: exactly what a dry run skips.
    os << "[dflash] topology: auto over " << size << " rank(s)" << planned
       << ": chosen at startup by timing both roles (not in a dry run)\n";
  } else {
    // What assign_roles makes of the world: the same code as the real job's.
    std::optional<FatalHintNote> note;
    if (world.source == WorldSource::Mpi)
      note.emplace("a dry run plans another world in one process, without mpirun: --ranks N, or --nodes N "
                   "--gpus-per-node G");
    const Topology t = assign_roles(0, world.slots(), split);
    note.reset();
    num_drafters = static_cast<int>(t.drafters.size());
    target_ranks = t.targets;
    drafter_ranks = t.drafters;
    const int idle = static_cast<int>(std::count(t.roles.begin(), t.roles.end(), Role::Idle));
    os << "[dflash] topology " << split.to_string() << " on " << t.num_nodes << " node(s) x " << t.ranks_per_node
       << " rank(s), backend " << device_name(o.backend) << ": " << t.targets.size() << " target(s), "
       << t.drafters.size() << " drafter(s)" << (split.colocated() ? " (every rank both)" : "") << ", " << idle
       << " idle" << planned << "\n";
    if (!world.device_note.empty()) os << "[dflash] devices: " << world.device_note << "\n";
    os << "[dflash]   rank  node  local  role     host                 device  fixed memory\n";
    for (int r = 0; r < size; ++r) {
      const PlannedSeat& st = world.seats[static_cast<size_t>(r)];
      const Role role = t.roles[static_cast<size_t>(r)];
      const double need = role == Role::Target      ? memory.target
                          : role == Role::Drafter   ? memory.drafter
                          : role == Role::Colocated ? memory.colocated()
                                                    : 0;
      std::string mem = role == Role::Idle ? "-" : gib_text(need);
      if (gpu.bytes > 0 && need > gpu.bytes) mem += "  does not fit";
      const std::string dev = st.gpu >= 0 ? "gpu" + std::to_string(st.gpu) : "cpu";
      char line[240];
      std::snprintf(line, sizeof(line), "[dflash]   %4d  %4d  %5d  %-7s  %-20s %-7s %s\n", r, st.node, st.local_rank,
                    role_name(role), st.host.empty() ? "-" : st.host.c_str(), dev.c_str(), mem.c_str());
      os << line;
    }
    os << (split.colocated() ? "[dflash] each rank's target feeds its own drafter in the process (no transfer); "
                                  : "[dflash] targets feed the drafters of their own node; ")
       << (t.drafters.size() > 1 ? "the " + std::to_string(t.drafters.size()) + " drafters allreduce their gradients"
                                 : std::string("one drafter: no gradient allreduce"))
       << "; rank " << t.metrics_rank() << " (the first drafter) writes metrics.h5\n";
  }
  if (o.topology_choice == TopologyChoice::Auto && o.global_batch_tokens > 0)
    os << "[dflash] batch: --global-batch-tokens " << o.global_batch_tokens
       << ": the micro-batches per optimizer step are picked at startup, once --topology auto has chosen the drafters\n";
  else
    os << grad_accum_line(o, grad_accum_of(o, num_drafters), num_drafters) << "\n";
  os << schedule(o, num_drafters);
  os << eval_summary(o, o.topology_choice == TopologyChoice::Auto ? 0 : num_drafters, plan);
  os << memory.line << "\n";
  if (o.topology_choice != TopologyChoice::Auto && split.colocated())
    os << "[dflash] a colocated rank holds both: " << gib_text(memory.colocated())
       << " fixed (target + drafter), both roles' activations on top\n";
  const MemoryVerdict verdict = check_memory(o, gpu, memory, target_ranks, drafter_ranks,
                                             o.topology_choice == TopologyChoice::Auto ? Layout::Split : split.layout);
  os << verdict.line << "\n";
  os << input_notes;
  os << layout_plan_text(forecast, o);
  if (forecast)
    os << other_density_line(o, plan, gpu.bytes, world.num_nodes, world.ranks_per_node, *forecast);
  std::fputs(os.str().c_str(), stdout);
  std::fflush(stdout);
  if (!verdict.fits) DF_FAIL(BadOptions, verdict.what, verdict.hint);
  DF_MPI(MPI_Barrier(MPI_COMM_WORLD));
  return 0;
}

}  // namespace dflash
