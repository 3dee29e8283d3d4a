// dflash-train --dry-run: what the job would do — the resolved options, every rank's role and the
// schedule — without loading a model or reading the dataset's tokens, so a launch line (mpirun/srun,
// --topology, the Slurm script's arguments) can be checked in seconds before a GPU is busy for days.
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <filesystem>

#include "data/h5_util.h"
#include "dflash/anchors.h"     // anchor_rule_summary
#include "dflash/drafter.h"
#include "dflash/checkpoint.h"  // parse_checkpoint_every
#include "dflash/data.h"        // hdf5_mutex()
#include "dflash/error.h"
#include "dflash/eval_set.h"
#include "dflash/mpi_typed.h"
#include "dflash/runtime.h"
#include "dflash/topology.h"
#include "job_plan.h"
#include "drafter/loss_chunk.h"

namespace dflash {

namespace {

// Records and tokens of --data from the shapes of /offsets and /tokens (no data read); {-1, -1} when the
// file does not have them (the job itself reports what is wrong with it).
std::pair<int64_t, int64_t> dataset_shape(const std::string& path) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::quiet_errors();
  h5::Handle fapl(h5::fapl_no_locking(), h5::Handle::Kind::PropList);
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), h5::Handle::Kind::File);
  if (!file.valid() || !h5::link_exists(file, "tokens") || !h5::link_exists(file, "offsets")) return {-1, -1};
  h5::Handle tokens(H5Dopen2(file, "tokens", H5P_DEFAULT), h5::Handle::Kind::Dataset);
  h5::Handle offsets(H5Dopen2(file, "offsets", H5P_DEFAULT), h5::Handle::Kind::Dataset);
  if (!tokens.valid() || !offsets.valid()) return {-1, -1};
  const std::vector<hsize_t> t = h5::dims(tokens), o = h5::dims(offsets);
  if (t.size() != 1 || o.size() != 1 || o[0] < 1) return {-1, -1};
  return {static_cast<int64_t>(o[0]) - 1, static_cast<int64_t>(t[0])};
}

// --eval-data from its /offsets alone (no token read): records, tokens, the sample --eval-max-tokens keeps
// of a larger file (the job's own rule: select_eval_records, the same records), the batches it packs into
// per drafter (include/dflash/eval_set.h); a given --eval-max-tokens the drafters cannot keep fails it as it
// would fail the job. The job checks the rest of the file when it starts. num_drafters 0: not known yet
// (--topology auto), so only one drafter's budget is certain.
std::string eval_summary(const Options& o, int num_drafters, const JobPlan& job_plan) {
  if (o.eval_data.empty()) return "";
  std::vector<int64_t> offsets;
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    h5::quiet_errors();
    h5::Handle fapl(h5::fapl_no_locking(), h5::Handle::Kind::PropList);
    h5::Handle file(H5Fopen(o.eval_data.c_str(), H5F_ACC_RDONLY, fapl), h5::Handle::Kind::File);
    if (file.valid() && h5::link_exists(file, "offsets")) {
      h5::Handle ds(H5Dopen2(file, "offsets", H5P_DEFAULT), h5::Handle::Kind::Dataset);
      const std::vector<hsize_t> d = ds.valid() ? h5::dims(ds) : std::vector<hsize_t>{};
      if (d.size() == 1 && d[0] >= 2) {
        offsets.resize(d[0]);
        if (H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()) < 0) offsets.clear();
      }
    }
  }
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

std::string schedule(const Options& o, int num_drafters) {
  std::ostringstream os;
  const auto [records, tokens] = dataset_shape(o.data_path);
  int64_t steps_per_epoch = -1;
  if (tokens > 0) {
    // Packing fills a batch up to --token-budget and never splits a record, so this is a lower bound.
    const int64_t batches = (tokens + o.token_budget - 1) / o.token_budget;
    const int64_t micro = std::max<int64_t>(1, batches / std::max(1, num_drafters));
    steps_per_epoch = (micro + o.grad_accum - 1) / o.grad_accum;
    os << "[dflash] data: " << o.data_path << ": " << records << " records, " << tokens << " tokens -> at least "
       << batches << " batches of <= " << o.token_budget << " tokens per epoch; one step = "
       << (o.grad_accum > 1 ? std::to_string(o.grad_accum) + " batches (micro-batches)" : std::string("one batch"))
       << " on each of " << num_drafters << " drafter(s): >= " << steps_per_epoch << " steps per epoch\n";
  } else {
    os << "[dflash] data: " << o.data_path << ": no /tokens and /offsets to size the epoch (the job will say why)\n";
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

std::string gib(double bytes) {  // GiB, or MiB below one GiB
  char b[32];
  if (bytes >= double(1ull << 30)) std::snprintf(b, sizeof b, "%.1f GiB", bytes / double(1ull << 30));
  else std::snprintf(b, sizeof b, "%.1f MiB", bytes / double(1ull << 20));
  return b;
}

// Bytes of the drafter step's block activations per anchor (its B rows through every layer, with the
// backward's scratch and the loss rows): the per-row buffers DrafterStepCuda allocates
// (src/drafter/cuda/drafter_step.cu), bf16 on CUDA; the CPU net keeps about the same tensors in float32. They grow
// with --max-anchors: the term that decides whether a cap fits the GPU.
double drafter_bytes_per_anchor(const DrafterConfig& d, bool cuda) {
  const Qwen3Config& L = d.layers;
  const double H = L.hidden_size, I = L.intermediate_size, QD = double(L.num_attention_heads) * L.head_dim,
               KV = double(L.num_key_value_heads) * L.head_dim, e = cuda ? 2 : 4, B = d.block_size;
  const double per_layer = (4 * H + 3 * QD + 3 * KV + 3 * I) * e +
                           (2 + 2 * L.num_attention_heads + L.num_key_value_heads) * 4.0;  // norms' rstd, lse
  const double shared = (6 * H + 3 * I + 3 * QD + 3 * KV) * e + 4.0 * 2;  // block input/output, backward scratch
  double loss_row = 3 * H * e + 8 * 4.0;                                   // rows of a block's B - 1 labels
  double d2_layer = 0, d2_shared = 0;
  if (d.arch == DraftArch::DFlash2) {  // the convs' dynamic kernels and inputs/outputs; the selector's rows
    const double D2 = 2.0 * d.d2.conv_kernel_size * (H / d.d2.conv_group_size), K = d.d2.selector_top_k,
                 r = d.d2.selector_rank;
    d2_layer = (4 * H + 2 * D2) * e;
    d2_shared = (H + D2) * e;
    loss_row += 6 * K * 4 + 2 * r * 4 + r * e + H * e + 7 * 4.0;
  }
  return B * (L.num_hidden_layers * (per_layer + d2_layer) + shared + d2_shared) + (B - 1) * loss_row;
}

// The fixed memory of each role: what is allocated once at startup, sized by the model, --token-budget,
// --max-anchors and the queue depths, the drafter's block activations included (drafter_bytes_per_anchor);
// the target's layer activations, the drafter's context-side (per token) tensors and library workspaces
// come on top. From config.json and the sizes of the
// checkpoint's files only: nothing is loaded.
std::string memory_per_rank(const Options& o) {
  std::ostringstream os;
  const JobPlan plan = plan_job(o);  // reads the config.json files only
  const Qwen3Config& t = plan.target.text;
  const bool cuda = o.backend == Device::CUDA;
  const double act = static_cast<double>(dtype_size(plan.slot_shape.dtype));  // per activation / weight element
  double files = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(o.target_dir, ec))
    if (e.path().extension() == ".safetensors") files += static_cast<double>(e.file_size(ec));
  // A bf16 checkpoint's bytes are its weights' bytes on CUDA, and half of them in float32 on the CPU.
  const double weights = cuda ? files : 2 * files;
  const double batch = plan.wire_bytes_per_token() * static_cast<double>(o.token_budget);  // features (+ final norm)
  const double target = weights + 2 * batch;  // two send buffers: the next forward fills one while one moves
  const DrafterConfig& d = plan.drafter;
  const double P = static_cast<double>(drafter_param_count(d));
  // fp32 master weights, AdamW m and v, gradients (+ a bf16 copy for the CUDA step), frozen embedding + lm_head
  const double state = P * (16 + (cuda ? 2 : 0)), frozen = 2.0 * t.vocab_size * t.hidden_size * act;
  const double slots = o.hs_queue_depth * batch;
  // The lm_head loss's float32 logits workspace: a chunk of rows, twice (the KL teacher's half is kept either
  // way), sized by the same rule as the trainer (drafter/loss_chunk.h).
  const int64_t loss_rows = train::loss_chunk_rows(o.backend, t.vocab_size,
                                                   static_cast<int64_t>(o.train.max_anchors) * (d.block_size - 1));
  const double loss_ws = 2.0 * static_cast<double>(loss_rows) * t.vocab_size * 4;
  const double blocks = static_cast<double>(o.train.max_anchors) * drafter_bytes_per_anchor(d, cuda);
  // --eval-tau-every: each drafter rank also holds a copy of the target's weights (src/runtime/drafter_tau.h)
  const double tau_target = o.eval_tau_every > 0 && !o.eval_data.empty() ? weights : 0.0;
  // --grad-accum K > 1: the accumulator, P fp32 (--global-batch-tokens under --topology auto: K is not known
  // before the job measures its split, so it is counted)
  const double accum = o.grad_accum > 1 || o.global_batch_tokens > 0 ? P * 4 : 0;
  const double drafter = state + frozen + slots + loss_ws + blocks + accum + tau_target;
  os << "[dflash] memory per rank, fixed part (" << (cuda ? "bf16 on the GPU" : "float32 in host memory")
     << "; the target's activations come on top): target " << gib(target) << " (weights " << gib(weights) << " from "
     << gib(files) << " of safetensors, 2 send buffers of " << gib(batch) << "); drafter " << gib(drafter) << " ("
     << static_cast<long long>(P) << " parameters x " << (cuda ? 18 : 16) << " B of state " << gib(state)
     << ", frozen embedding + lm_head " << gib(frozen) << ", " << o.hs_queue_depth << " slots " << gib(slots)
     << ", loss logits for " << loss_rows << " rows " << gib(loss_ws) << ", block activations for --max-anchors "
     << o.train.max_anchors << " x " << d.block_size << " rows " << gib(blocks) << " = "
     << gib(drafter_bytes_per_anchor(d, cuda)) << " per anchor"
     << (accum > 0 ? ", gradient accumulator " + gib(accum) : std::string())
     << (tau_target > 0 ? ", the target's weights for --eval-tau-every " + gib(tau_target) : std::string()) << ")\n";
  return os.str();
}

}  // namespace

int dry_run(const Options& given) {
  Options o = given;  // --global-batch-tokens resolved once the drafters are known
  int rank = 0, size = 1;
  DF_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  DF_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  if (rank == 0) check_input_paths(o);  // cheap (stat); a bad path is worth knowing before the real launch
  std::ostringstream os;
  os << "[dflash] dflash-train " << DFLASH_VERSION << " --dry-run: nothing is loaded, nothing is written\n[dflash] options:";
  for (const auto& [k, v] : o.resolved) os << " --" << k << "=" << v;
  os << "\n[dflash] anchors: " << anchor_rule_summary(o.train.max_anchors, o.train.anchors_per_record) << "\n";
  int num_drafters = 1;
  if (o.topology_auto) {
    // The split comes from timing both roles on the real model and data: exactly what a dry run skips.
    os << "[dflash] topology: auto over " << size << " rank(s): chosen at startup by timing both roles (not in a dry run)\n";
  } else {
    // Where each rank sits, and what assign_roles makes of it: the same code as the real job.
    // With --backend cuda this checks the build and counts the visible devices (no context, no model).
    Topology t = create_topology(MPI_COMM_WORLD, o.topology, o.backend);
    struct Seat {
      int32_t node = 0, local_rank = 0, gpu = -1;
      char host[64] = {0};
    } seat;
    seat.node = t.node;
    seat.local_rank = t.local_rank;
    seat.gpu = t.gpu;
    std::snprintf(seat.host, sizeof(seat.host), "%s", t.host.c_str());
    std::vector<Seat> seats(static_cast<size_t>(size));
    mpi::allgather(&seat, 1, seats.data(), MPI_COMM_WORLD);
    num_drafters = static_cast<int>(t.drafters.size());
    os << "[dflash] topology " << o.topology.to_string() << " on " << t.num_nodes << " node(s) x " << t.ranks_per_node
       << " rank(s), backend " << device_name(o.backend) << ": " << t.targets.size() << " target(s), "
       << t.drafters.size() << " drafter(s), " << (size - static_cast<int>(t.targets.size() + t.drafters.size()))
       << " idle\n[dflash]   rank  node  local  role     host                 device\n";
    for (int r = 0; r < size; ++r) {
      const Seat& st = seats[static_cast<size_t>(r)];
      const std::string dev = st.gpu >= 0 ? "gpu" + std::to_string(st.gpu) : "cpu";
      char line[200];
      std::snprintf(line, sizeof(line), "[dflash]   %4d  %4d  %5d  %-7s  %-20s %s\n", r, st.node, st.local_rank,
                    role_name(t.roles[static_cast<size_t>(r)]), st.host, dev.c_str());
      os << line;
    }
    os << "[dflash] targets feed the drafters of their own node; "
       << (t.drafters.size() > 1 ? "the " + std::to_string(t.drafters.size()) + " drafters allreduce their gradients"
                                 : std::string("one drafter: no gradient allreduce"))
       << "; rank " << t.metrics_rank() << " (the first drafter) writes metrics.h5\n";
    free_topology(t);
  }
  if (o.topology_auto && o.global_batch_tokens > 0)
    os << "[dflash] batch: --global-batch-tokens " << o.global_batch_tokens
       << ": the micro-batches per optimizer step are picked at startup, once --topology auto has chosen the drafters\n";
  else
    os << resolve_grad_accum(o, num_drafters) << "\n";
  os << schedule(o, num_drafters);
  if (rank == 0) os << eval_summary(o, o.topology_auto ? 0 : num_drafters, plan_job(o));
  if (rank == 0) os << memory_per_rank(o);
  if (rank == 0) {
    std::fputs(os.str().c_str(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace dflash
