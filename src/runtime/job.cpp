// The job's frame: topology, startup table, role dispatch, orderly shutdown.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>

#include "dflash/anchors.h"  // anchor_rule_summary
#include "dflash/backend.h"
#include "dflash/schedule.h"
#include "dflash/checkpoint.h"
#include "dflash/drafter.h"
#include "dflash/drafter_model.h"
#include "dflash/error.h"
#include "dflash/eval_stats.h"
#include "dflash/hf_config.h"
#include "dflash/metrics.h"
#include "dflash/run_log.h"
#include "dflash/runtime.h"
#include "auto_measure.h"
#include "job.h"

namespace dflash {

void maybe_inject_failure(const JobContext& job, int64_t step) {
  if (job.opt.inject_fail_rank != job.topo.world_rank || job.opt.inject_fail_step != step) return;
  const bool hang = job.opt.inject_fail_mode == FailMode::Hang;
  std::fprintf(stderr, "[dflash] rank %d (%s): test hook --inject-fail-step %lld: %s\n", job.topo.world_rank,
               role_name(job.topo.role), static_cast<long long>(step),
               hang ? "stopping myself (SIGSTOP, silent)" : "killing myself (SIGKILL)");
  std::fflush(stderr);
  ::raise(hang ? SIGSTOP : SIGKILL);
  // Continued (mpirun sends SIGCONT before its SIGTERM and SIGKILL when it ends the job): a hung process
  // stays hung -- it does not wake up and talk to peers that are being torn down.
  for (;;) ::pause();
}

namespace {

// Ibarrier polled with sleeps: an idle rank waiting for the end of the run costs no CPU. poll (optional)
// runs at every wake-up.
void barrier(MPI_Comm comm, double timeout_s, const std::string& what, const std::function<void()>& poll = {}) {
  MPI_Request r;
  DF_MPI(MPI_Ibarrier(comm, &r));
  mpi::Polling polling;
  polling.progress = poll;
  polling.max_sleep_us = 20000;
  if (!mpi::poll_until([&] { return mpi::test(r); }, timeout_s, polling))
    fatal(ExitCode::LostPeer, what + ": not every rank arrived within " + std::to_string(static_cast<int>(timeout_s)) + " s",
          "a peer rank died or hangs; see its own error above");
}

// Node-local rank before the topology exists: the CUDA device create_topology will bind (same split).
int node_local_rank(MPI_Comm world) {
  int rank = 0, local_rank = 0;
  DF_MPI(MPI_Comm_rank(world, &rank));
  MPI_Comm node_comm;
  DF_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm));
  DF_MPI(MPI_Comm_rank(node_comm, &local_rank));
  DF_MPI(MPI_Comm_free(&node_comm));
  return local_rank;
}

std::vector<RankCard> gather_cards(const Topology& t, const PowerSampler& gpu, const GpuReading& startup_gpu) {
  RankCard mine;
  mine.rank = t.world_rank;
  mine.role = static_cast<int32_t>(t.role);
  mine.gpu = t.gpu;
  mine.pid = static_cast<int32_t>(::getpid());
  std::strncpy(mine.host, t.host.c_str(), sizeof(mine.host) - 1);
  mine.startup_gpu = startup_gpu;
  const std::string note = startup_gpu.valid ? "" : gpu.available() ? gpu.last_error() : gpu.reason();
  std::strncpy(mine.gpu_note, note.c_str(), sizeof(mine.gpu_note) - 1);
  std::vector<RankCard> cards(t.world_size);
  mpi::allgather(&mine, 1, cards.data(), MPI_COMM_WORLD);
  return cards;
}

void print_startup(const Options& o, const Topology& t, const std::vector<RankCard>& cards) {
  std::ostringstream os;
  os << "[dflash] dflash-train " << DFLASH_VERSION << ": topology " << o.topology.to_string() << " on " << t.num_nodes
     << " node(s) x " << t.ranks_per_node << " rank(s), backend " << device_name(o.backend)
     << (o.backend == Device::CUDA ? (o.deterministic ? " (deterministic kernels)" : " (fastest kernels, not bit-reproducible)")
                                    : "")
     << "\n";
  os << "[dflash]   rank  role     host                 device  pid       power\n";
  for (const RankCard& c : cards) {
    char line[200];
    // power: the GPU's draw now, before any model loads (NVML; "-" without it)
    const std::string watts = c.startup_gpu.valid ? std::to_string(static_cast<int>(c.startup_gpu.power_w + 0.5f)) + " W" : "-";
    std::snprintf(line, sizeof(line), "[dflash]   %4d  %-7s  %-20s %-6s  %-8d  %s\n", c.rank, role_name(static_cast<Role>(c.role)),
                  c.host, c.gpu >= 0 ? ("gpu" + std::to_string(c.gpu)).c_str() : "cpu", c.pid, watts.c_str());
    os << line;
  }
  if (!cards.empty() && !cards[0].startup_gpu.valid) os << "[dflash] GPU power: not measured (" << cards[0].gpu_note << ")\n";
  os << "[dflash] options:";
  for (const auto& [k, v] : o.resolved) os << " --" << k << "=" << v;
  os << "\n[dflash] anchors: " << anchor_rule_summary(o.train.max_anchors, o.train.anchors_per_record) << "\n";
  if (const std::string line = optimizer_state_line(o); !line.empty()) os << line << "\n";
  std::fputs(os.str().c_str(), stdout);
  std::fflush(stdout);
}

// The backend, chosen once here and carried down in job.ctx: the rank's GPU (its stream and handles) on
// CUDA, the float32 reference otherwise (the plan's batch shape names the same device). With it, how
// gradients travel. Idle ranks hold no model and touch no device.
void choose_backend_parts(JobContext& job) {
  const Options& o = job.opt;
  const Topology& topo = job.topo;
  set_deterministic_kernels(o.deterministic);  // before the first CUDA context: it sizes the mode's scratch
  job.ctx = o.backend == Device::CUDA ? make_ctx(Device::CUDA, topo.gpu) : cpu_ctx();
  if (topo.role == Role::Drafter)
    job.grad_reduce = choose_grad_reducer(topo, job.ctx);
}

// How hidden states travel (--data-plane), agreed by every rank, idle ones too (they vote); the first
// drafter says what was chosen and why.
void choose_data_plane(JobContext& job) {
  const Topology& topo = job.topo;
  DataPlaneSetup planes = setup_data_plane(job.opt.data_plane, job.opt.backend, topo, job.ctx, job.opt.peer_timeout_s);
  job.data_plane = planes.kind;
  job.nccl_pairs = std::move(planes.nccl);
  if (!topo.is_metrics_writer()) return;
  const std::string grads = topo.drafters.size() > 1 ? std::string(grad_reduce_name(job.grad_reduce)) + " allreduce over " +
                                                              std::to_string(topo.drafters.size()) + " drafters"
                                                        : std::string("one drafter, no allreduce");
  std::printf("[dflash] hidden states: %s plane (%s), %s on the wire; gradients: %s\n", data_plane_name(job.data_plane),
              planes.why.c_str(), dtype_name(job.plan.slot_shape.dtype), grads.c_str());
  std::fflush(stdout);
}

// The inputs' content identities, computed where the data is open (the first target: it read the
// dataset's offsets already) and broadcast to every rank, which record them in checkpoints and compare them
// on resume. Text of "k=v" words, one map entry per line.
OptionMap share_input_identities(const JobContext& job) {
  const Topology& topo = job.topo;
  const int root = topo.targets.front();
  std::string text;
  if (topo.world_rank == root)
    for (const auto& [k, v] : input_identities_of(job.opt, *job.dataset)) text += k + "\t" + v + "\n";
  int64_t len = static_cast<int64_t>(text.size());
  const double timeout_s = 10 * job.opt.peer_timeout_s;
  auto why = [] { return std::string("the first target did not share the inputs' content identities (lost?)"); };
  MPI_Request r = mpi::ibcast(&len, 1, root, MPI_COMM_WORLD);
  mpi::wait(r, timeout_s, why);
  text.resize(static_cast<size_t>(len));
  r = mpi::ibcast(text.data(), text.size(), root, MPI_COMM_WORLD);
  mpi::wait(r, timeout_s, why);
  OptionMap out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    if (tab != std::string::npos) out[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return out;
}

// Whether the checkpoint was made on this job's split: the same --topology, world size, and numbers of
// targets (data positions) and drafters (RNG states).
ResumeSplit resume_split_of(const CheckpointState& saved, JobContext& job) {
  auto saved_option = [&](const char* k) {
    const auto it = saved.options.find(k);
    return it == saved.options.end() ? std::string("?") : it->second;
  };
  job.saved_topology = saved_option("topology") + " on " + saved_option("world-size") + " rank(s)";
  const bool same = saved_option("topology") == job.resume_invariants.at("topology") &&
                    saved_option("world-size") == job.resume_invariants.at("world-size") &&
                    saved.data.size() == job.topo.targets.size() && saved.rng_states.size() == job.topo.drafters.size();
  return same ? ResumeSplit::Same : ResumeSplit::Changed;
}

// A resume with another --epochs or --max-steps (an extended run, or one ended sooner): "--max-steps 40 -> 80"
// ("" when neither changed; a checkpoint without them is not compared).
std::string run_extension_of(const CheckpointState& saved, const JobContext& job) {
  std::string changes;
  for (const char* k : {"epochs", "max-steps"}) {
    const auto was = saved.options.find(k);
    const auto now = job.resume_invariants.find(k);
    if (was == saved.options.end() || now == job.resume_invariants.end() || was->second == now->second) continue;
    changes += (changes.empty() ? "" : ", ") + std::string("--") + k + " " + was->second + " -> " + now->second;
  }
  return changes;
}

// Where every target starts, decided by the first target (it has the dataset open: a resplit replays the
// saved targets' packing) and sent to every rank: the targets' loaders, the drafters' checkpoints and
// --batch-order fixed all go by it.
DataResume share_data_resume(const JobContext& job, const CheckpointState& saved) {
  const Topology& topo = job.topo;
  const int root = topo.targets.front();
  std::string bytes;
  if (topo.world_rank == root) {
    const DataResume d = plan_data_resume(*job.dataset, job.plan.loader, job.opt.epochs, saved.data, saved.consumed,
                                          static_cast<int>(topo.targets.size()));
    bytes = serialize_data_resume(d);
    if (job.resume_split == ResumeSplit::Changed) {
      std::printf("[dflash] resuming on another split: the checkpoint's %s (%zu target(s), %zu drafter(s)) -> %s on %d "
                  "rank(s) (%zu target(s), %zu drafter(s)) at step %lld; %s\n",
                  job.saved_topology.c_str(), saved.data.size(), saved.rng_states.size(),
                  job.opt.topology.to_string().c_str(), topo.world_size, topo.targets.size(), topo.drafters.size(),
                  static_cast<long long>(saved.step),
                  d.resplit ? d.summary.c_str() : "as many targets: their data positions go on as saved");
      std::fflush(stdout);
    }
  }
  int64_t len = static_cast<int64_t>(bytes.size());
  const double timeout_s = 10 * job.opt.peer_timeout_s;
  auto why = [] { return std::string("the first target did not share where the data resumes (lost?)"); };
  MPI_Request r = mpi::ibcast(&len, 1, root, MPI_COMM_WORLD);
  mpi::wait(r, timeout_s, why);
  bytes.resize(static_cast<size_t>(len));
  r = mpi::ibcast(bytes.data(), bytes.size(), root, MPI_COMM_WORLD);
  mpi::wait(r, timeout_s, why);
  return deserialize_data_resume(bytes);
}

}  // namespace

// The learning-rate schedule (include/dflash/schedule.h): cosine to the run's end, known before it starts
// from the data, --epochs, --token-budget and the numbers of targets and drafters (or --max-steps when that
// ends the run sooner). Only targets open the data: the first one plans, prints, and tells every rank.
// A run resumed on another split re-plans it for the data left (its targets' epochs, the new numbers of
// targets, drafters and micro-batches) from the checkpoint's step; a run resumed on the same split keeps the
// checkpoint's plan (the one its segment made), so a lineage with a resplit keeps one schedule.
void plan_lr_schedule(Options& o, const JobContext& job, const nlohmann::json& saved_schedule) {
  const int planner = job.topo.targets.front();
  // total steps, warmup steps, long records and their dropped tokens per epoch, the tokens of an epoch
  int64_t plan[5] = {0, 0, 0, 0, 0};
  if (job.topo.world_rank == planner) {
    const bool resplit = job.resume_split == ResumeSplit::Changed;
    const bool replan = resplit || !job.run_extended.empty();
    LoaderOptions lo = job.plan.loader;
    lo.consumed = job.consumed;
    ScheduleStart from;
    if (replan)
      from = ScheduleStart{job.data_resume.first_epoch, job.resume_step,
                           o.epochs > 0 ? data_batches_left(*job.dataset, lo, o.epochs, job.data_resume) : -1};
    PlannedSchedule s = plan_schedule(*job.dataset, lo, static_cast<int>(job.topo.targets.size()),
                                      static_cast<int>(job.topo.drafters.size()), o.epochs, o.max_steps,
                                      o.train.warmup_steps, o.warmup_ratio, o.grad_accum, from);
    if (replan) {
      // The warmup stays as planned at the start (the resumed run is past it, or in it, as before).
      if (saved_schedule.contains("warmup_steps")) s.warmup_steps = saved_schedule["warmup_steps"].get<int>();
      s.why = (resplit ? "re-planned for the new split: " : "re-planned for " + job.run_extended + ": ") + s.why;
    } else if (!job.resume_dir.empty() && saved_schedule.contains("total_steps")) {
      s.total_steps = saved_schedule["total_steps"].get<int64_t>();
      s.warmup_steps = saved_schedule["warmup_steps"].get<int>();
      s.why = "as the checkpoint's segment planned it";
    }
    plan[0] = s.total_steps;
    plan[1] = s.warmup_steps;
    plan[2] = s.long_records;
    plan[3] = s.long_tokens_dropped;
    plan[4] = job.dataset->num_tokens();
    if (s.long_records > 0)
      std::printf("[dflash] data: %lld record(s) longer than --token-budget %lld, every epoch: %s (%lld tokens dropped "
                  "per epoch)\n",
                  static_cast<long long>(s.long_records), static_cast<long long>(o.token_budget),
                  o.long_record == LongRecordPolicy::Skip ? "left out (--long-record skip)"
                                                          : "cut to their first --token-budget tokens (--long-record cut)",
                  static_cast<long long>(s.long_tokens_dropped));
    if (o.max_steps > 0 && o.epochs > 0 && s.total_steps < o.max_steps)
      std::printf("[dflash] note: the data (--epochs %d) ends at step %lld, before --max-steps %lld: the run stops there "
                  "(without --epochs, the data repeats until --max-steps)\n",
                  o.epochs, static_cast<long long>(s.total_steps), static_cast<long long>(o.max_steps));
    std::printf("[dflash] lr schedule: peak %g, warmup %d step(s), ", o.train.lr, s.warmup_steps);
    if (s.total_steps > s.warmup_steps)
      std::printf("cosine to %g at step %lld (%s)\n", o.train.lr * o.train.min_lr_ratio,
                  static_cast<long long>(s.total_steps), s.why.c_str());
    else
      std::printf("then constant (%s)\n", s.why.c_str());
    std::fflush(stdout);
  }
  MPI_Request r = mpi::ibcast(plan, 5, planner, MPI_COMM_WORLD);
  mpi::wait(r, o.peer_timeout_s, [&] { return "lost peer: target rank " + std::to_string(planner) + " never sent the lr schedule"; });
  o.train.total_steps = plan[0];
  o.train.warmup_steps = static_cast<int>(plan[1]);
  o.long_records_per_epoch = plan[2];
  o.long_tokens_dropped_per_epoch = plan[3];
  o.dataset_tokens = plan[4];
}

void wait_all_loaded(const JobContext& job) {
  barrier(MPI_COMM_WORLD, 10 * job.opt.peer_timeout_s, "waiting for every rank to load its model");
}

void wait_eval_features(const JobContext& job, const std::function<void()>& poll) {
  if (job.opt.eval_data.empty()) return;
  barrier(MPI_COMM_WORLD, 10 * job.opt.peer_timeout_s, "computing the eval set's features (--eval-data)", poll);
}

namespace {

// --eval-every resolved against the planned run (include/dflash/eval_stats.h), and the eval set said once.
void plan_eval(Options& o, const JobContext& job) {
  if (o.eval_data.empty()) return;
  const CheckpointEvery ck = parse_checkpoint_every(o.checkpoint_every);
  o.eval_every = resolve_eval_every(o.eval_every, ck.unit == CheckpointUnit::Steps ? ck.steps : 0, o.train.total_steps);
  if (job.topo.world_rank != 0 || !job.eval) return;  // rank 0 is a target: it packed the set
  const EvalSet& e = *job.eval;
  std::string long_records;
  if (e.records_cut) long_records = ", " + std::to_string(e.records_cut) + " cut to --token-budget";
  if (e.records_skipped) long_records = ", " + std::to_string(e.records_skipped) + " longer than --token-budget left out";
  const std::string when = o.eval_every > 0 ? "every " + std::to_string(o.eval_every) + " step(s) and after the last"
                                            : std::string("only after the last step (--eval-every 0)");
  const std::string sample = eval_sample_line(e.selection, e.path, o.eval_max_tokens == 0, job.plan.eval_budget(o));
  if (!sample.empty()) std::printf("%s\n", sample.c_str());
  std::printf("[dflash] eval: %s: %lld records%s, %lld tokens in %zu batch(es) (%s); features computed once now; %s\n",
              e.path.c_str(), static_cast<long long>(e.records), long_records.c_str(), static_cast<long long>(e.tokens),
              e.batches.size(), eval_share_summary(e.batch_tokens(), static_cast<int>(job.topo.drafters.size())).c_str(),
              when.c_str());
  std::fflush(stdout);
}

}  // namespace

namespace {

// How one job on one split ended: its code, and with kResplitCode the split every rank takes next and the
// checkpoint it starts from (the drafters' choice, --rebalance auto).
struct SegmentEnd {
  int code = 0;
  std::string split, checkpoint;
};

// The resolved option `name` (what the startup line, metrics.h5 and checkpoints record) set to `value`.
void set_resolved(Options& o, const std::string& name, const std::string& value) {
  for (auto& [k, v] : o.resolved)
    if (k == name) v = value;
}

// The drafters' choice of a new split, from the first drafter to every rank (all have ended their roles).
SegmentEnd share_resplit(const JobContext& job) {
  const int root = job.topo.drafters.front();
  std::string text = job.topo.world_rank == root ? job.resplit_to + "\n" + job.resplit_checkpoint : std::string();
  int64_t len = static_cast<int64_t>(text.size());
  auto why = [] { return std::string("the first drafter did not say which split comes next (lost?)"); };
  MPI_Request r = mpi::ibcast(&len, 1, root, MPI_COMM_WORLD);
  mpi::wait(r, job.opt.peer_timeout_s, why);
  text.resize(static_cast<size_t>(len));
  r = mpi::ibcast(text.data(), text.size(), root, MPI_COMM_WORLD);
  mpi::wait(r, job.opt.peer_timeout_s, why);
  const size_t nl = text.find('\n');
  DF_CHECK(nl != std::string::npos, Internal, "the next split's message '" << text << "' is malformed");
  return SegmentEnd{kResplitCode, text.substr(0, nl), text.substr(nl + 1)};
}

// One job on one split, from the communicator split to the end of the run (or of this split: in_place
// jobs after the first continue a run in the same processes, from a checkpoint, on the split the drafters
// chose). planned: --topology auto's plan (the first job only).
SegmentEnd run_segment(Options& o, PowerSampler* gpu_sampler, const GpuReading& startup_gpu,
                       std::optional<JobPlan> planned, bool in_place) {
  const auto start = mpi::Clock::now();
  Topology topo = create_topology(MPI_COMM_WORLD, o.topology, o.backend);
  const std::string batch_line = resolve_grad_accum(o, static_cast<int>(topo.drafters.size()));  // K from the drafters
  JobContext job(o, topo, start, gather_cards(topo, *gpu_sampler, startup_gpu));
  job.gpu_sampler = gpu_sampler;
  job.in_place = in_place;
  if (topo.world_rank == 0) {
    print_startup(o, topo, job.cards);
    std::printf("%s\n", batch_line.c_str());
    std::fflush(stdout);
  }

  DF_CHECK_HINT(o.inject_fail_rank < topo.world_size, BadOptions,
                "--inject-fail-rank " << o.inject_fail_rank << " is not a rank of this " << topo.world_size << "-rank job",
                "give a rank in [0, " + std::to_string(topo.world_size - 1) + "]");
  // Inputs first, on every rank, and nobody goes on until all have passed: a bad input ends the job
  // before --out is created, locked or written (an earlier run's metrics and checkpoints stay as they are).
  validate_inputs(job, std::move(planned));
  barrier(MPI_COMM_WORLD, 10 * o.peer_timeout_s, "checking the inputs");
  // Then --out is this job's alone (rank 0 holds the lock, for the process's life: a job in place has it;
  // the others wait for it in the resume's bcast).
  if (topo.world_rank == 0 && !in_place) {
    lock_run_dirs(o);
    check_disk_space(o, disk_need(drafter_param_count(job.plan.drafter), o));
  }
  // --resume: one answer for the whole job; a checkpoint of another model/objective/data is refused here,
  // before any model loads; one of another split continues on this one (docs/checkpoint.md).
  job.resume_invariants = resume_invariants_of(o, topo.world_size, share_input_identities(job));
  job.resume_dir = resolve_resume_collective(o, MPI_COMM_WORLD);
  // --out is locked and checked: every rank's output since its start goes into OUT/train.log (run_log.h).
  open_run_log(o.out_dir + "/train.log");
  nlohmann::json saved_schedule = nlohmann::json::object();
  if (!job.resume_dir.empty()) {
    const CheckpointState saved = read_checkpoint_state(job.resume_dir);
    job.resume_split = resume_split_of(saved, job);
    job.run_extended = run_extension_of(saved, job);
    if (topo.world_rank == 0) check_resume_compatible(saved.options, job.resume_invariants, job.resume_dir, job.resume_split);
    job.resume_step = saved.step;
    saved_schedule = saved.schedule;
    job.data_resume = share_data_resume(job, saved);
    if (topo.world_rank == 0 && !job.run_extended.empty()) {
      std::printf("[dflash] the run goes on from step %lld with %s (the lr schedule's tail is re-planned below)\n",
                  static_cast<long long>(saved.step), job.run_extended.c_str());
      std::fflush(stdout);
    }
  } else {
    job.data_resume = fresh_data_resume(static_cast<int>(topo.targets.size()), o.train.seed);
  }
  job.consumed = std::make_shared<const ConsumedRecords>(job.data_resume.consumed);
  plan_lr_schedule(o, job, saved_schedule);
  plan_eval(o, job);

  if (topo.role != Role::Idle) choose_backend_parts(job);
  choose_data_plane(job);

  switch (topo.role) {
    case Role::Target: run_target(job); break;
    case Role::Drafter: run_drafter(job); break;
    case Role::Idle:
      wait_all_loaded(job);
      wait_eval_features(job);
      break;
  }
  // Every rank reports to rank 0, which names whoever does not (src/runtime/shutdown.cpp): an idle rank waits
  // out the whole run there (a stop signal sent to it alone goes on to the drafters); a hung idle rank does
  // not turn a finished run into exit 7.
  SegmentEnd end;
  end.code = end_of_run(job);
  if (end.code == kResplitCode) {
    end = share_resplit(job);
  } else if (topo.world_rank == 0) {
    const bool requeue = end.code == static_cast<int>(ExitCode::Requeue);
    std::printf("[dflash] done in %s%s\n", format_duration(job.elapsed()).c_str(),
                requeue ? " (checkpointed after a stop signal: exit 75 for a requeue)" : "");
    std::fflush(stdout);
  }
  free_topology(topo);
  return end;
}

}  // namespace

int run_job(const Options& given) {
  capture_run_log();  // stdout and stderr also go to OUT/train.log once --out is this job's (run_log.h)
  // This rank's GPU through NVML, read once now: its idle draw, before any model (or --topology auto's
  // measurement) occupies it. On the CPU backend it reads nothing and says why.
  // The device index matches the one create_topology binds (local rank % visible devices).
  // (On the CPU backend the index only matters to the NVML test hook, which maps local rank i to device i.)
  const int local_rank = node_local_rank(MPI_COMM_WORLD);
  const std::unique_ptr<PowerSampler> gpu_sampler = PowerSampler::for_rank(
      given.backend, given.backend == Device::CUDA ? local_rank % std::max(1, cuda_device_count()) : local_rank);
  const GpuReading startup_gpu = gpu_sampler->sample();
  Options o = given;  // --topology auto: measured and chosen here, before any role exists
  std::optional<JobPlan> planned;  // --topology auto plans the job first: its measurement runs both models
  if (o.topology_auto)
    o.topology = choose_topology_auto(given, MPI_COMM_WORLD, gpu_sampler.get(), &o.auto_topology_record, &planned);
  if (o.measure_only) return 0;  // --measure-only: the table above is the answer
  // One job per split: --rebalance auto may end one at a checkpoint with another split chosen; every rank
  // then takes its role on it in place, resuming that checkpoint (docs/checkpoint.md "Re-splitting live").
  for (bool in_place = false;; in_place = true) {
    const SegmentEnd end = run_segment(o, gpu_sampler.get(), startup_gpu, std::move(planned), in_place);
    planned.reset();
    if (end.code != kResplitCode) return end.code;
    o.topology = parse_topology_spec(end.split);
    o.topology_auto = false;
    set_resolved(o, "topology", end.split);
    o.resume = end.checkpoint;
    set_resolved(o, "resume", end.checkpoint);
    int world_rank = 0;
    DF_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    if (world_rank == 0) {
      std::printf("[rebalance] every rank takes its role on %s in place, from %s\n", end.split.c_str(), end.checkpoint.c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace dflash
