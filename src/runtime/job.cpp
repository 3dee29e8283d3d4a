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
#include "layout_forecast.h"
#include "colocated.h"
#include "job.h"
#include "remembered_split.h"
#include "run_plan.h"

namespace dflash {

void maybe_inject_failure(const JobContext& job, int64_t step) {
  if (job.opt.inject_fail_rank != job.topo.world_rank || job.opt.inject_fail_step != step) return;
  // A colocated rank counts its drafter's steps (its target runs up to the queue's depth ahead).
  if (job.topo.role == Role::Colocated && job.thread_role == Role::Target) return;
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

void print_startup(const Options& o, const TopologySpec& split,
                   const std::vector<std::pair<std::string, std::string>>& resolved, const Topology& t,
                   const std::vector<RankCard>& cards) {
  std::ostringstream os;
  os << "[dflash] dflash-train " << DFLASH_VERSION << ": topology " << split.to_string() << " on " << t.num_nodes
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
  for (const auto& [k, v] : resolved) os << " --" << k << "=" << v;
  os << "\n" << backend_line(o) << "\n";
  os << "[dflash] anchors: " << anchor_rule_summary(o.train.max_anchors, o.train.anchors_per_record) << "\n";
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
  if (topo.runs_drafter())
    job.grad_reduce = choose_grad_reducer(topo, job.ctx);
}

// How hidden states travel (--data-plane), agreed by every rank, idle ones too (they vote); the first
// drafter says what was chosen and why.
void choose_data_plane(JobContext& job) {
  const Topology& topo = job.topo;
  DataPlaneSetup planes = setup_data_plane(job.opt.data_plane, job.opt.backend, topo, job.ctx, job.opt.peer_timeout_s);
  job.data_plane = planes.kind;
  job.nccl_pairs = std::move(planes.nccl);
  if (job.data_plane == DataPlaneKind::Local) {  // colocated: its target and drafter share these batches
    job.local_slots = make_local_slots(job.plan.slot_shape, job.opt.hs_queue_depth, kTargetSendBuffers, job.ctx);
    job.colocated_meet = std::make_shared<ColocatedMeet>();
  }
  if (!topo.is_metrics_writer()) return;
  const std::string grads = topo.drafters.size() > 1 ? std::string(grad_reduce_name(job.grad_reduce)) + " allreduce over " +
                                                              std::to_string(topo.drafters.size()) + " drafters"
                                                        : std::string("one drafter, no allreduce");
  const SlotShape& sh = job.plan.slot_shape;
  // The wire's form and one full batch's bytes (--hs-dtype fp8: e4m3 codes + a float32 scale per token row).
  const std::string wire = sh.wire == HsDType::Fp8 ? std::string("FP8 (e4m3, a float32 scale per token row)")
                                                   : std::string(dtype_name(sh.dtype));
  std::printf("[dflash] hidden states: %s plane (%s), %s on the wire, %.3f MiB per full batch; gradients: %s\n",
              data_plane_name(job.data_plane), planes.why.c_str(), wire.c_str(),
              static_cast<double>(sh.slot_bytes()) / 1048576.0, grads.c_str());
  std::fflush(stdout);
}

}  // namespace

namespace {

// A world barrier every rank passes once; on a colocated rank its drafter thread passes it for the process
// once its target thread arrived there (colocated.h).
void meet(const JobContext& job, ColocatedMeet::Point point, const std::function<void()>& world_barrier,
          const std::function<void()>& poll) {
  if (!job.colocated_meet) return world_barrier();
  const double timeout_s = 10 * job.opt.peer_timeout_s;
  if (job.thread_role == Role::Target) return job.colocated_meet->target_arrives(point, timeout_s, poll);
  job.colocated_meet->drafter_passes(point, timeout_s, poll, world_barrier);
}

}  // namespace

void wait_all_loaded(const JobContext& job) {
  meet(job, ColocatedMeet::Point::Loaded,
       [&] { barrier(MPI_COMM_WORLD, 10 * job.opt.peer_timeout_s, "waiting for every rank to load its model"); }, {});
}

void wait_eval_features(const JobContext& job, const std::function<void()>& poll) {
  if (job.opt.eval_data.empty()) return;
  meet(job, ColocatedMeet::Point::EvalFeatures,
       [&] { barrier(MPI_COMM_WORLD, 10 * job.opt.peer_timeout_s, "computing the eval set's features (--eval-data)", poll); },
       poll);
}

namespace {

// The drafters' choice of a new split, from the first drafter to every rank (all have ended their roles):
// the split as two counts and a colocated flag (its counts are the node's size, set by assign_roles) and the
// checkpoint it starts from.
SegmentEnd share_resplit(const JobContext& job) {
  const int root = job.topo.drafters.front();
  const bool mine = job.topo.world_rank == root;
  int32_t split[3] = {0, 0, 0};
  if (mine && job.outcome.next_split) {
    split[0] = job.outcome.next_split->targets_per_node;
    split[1] = job.outcome.next_split->drafters_per_node;
    split[2] = job.outcome.next_split->colocated() ? 1 : 0;
  }
  std::string checkpoint = mine ? job.outcome.checkpoint : std::string();
  int64_t len = static_cast<int64_t>(checkpoint.size());
  auto why = [] { return std::string("the first drafter did not say which split comes next (lost?)"); };
  MPI_Request r = mpi::ibcast(split, 3, root, MPI_COMM_WORLD);
  mpi::wait(r, job.opt.peer_timeout_s, why);
  r = mpi::ibcast(&len, 1, root, MPI_COMM_WORLD);
  mpi::wait(r, job.opt.peer_timeout_s, why);
  checkpoint.resize(static_cast<size_t>(len));
  r = mpi::ibcast(checkpoint.data(), checkpoint.size(), root, MPI_COMM_WORLD);
  mpi::wait(r, job.opt.peer_timeout_s, why);
  DF_CHECK((split[2] == 1 || (split[0] >= 1 && split[1] >= 1)) && !checkpoint.empty(), Internal,
           "the next split " << split[0] << "-" << split[1] << (split[2] ? " (colocated)" : "") << " from '" << checkpoint
                             << "' is malformed");
  return SegmentEnd{kResplitCode, split[2] ? colocated_spec() : TopologySpec{split[0], split[1]}, checkpoint};
}

// One job on one split, from the communicator split to the end of the run (or of this split: segments
// after the first continue a run in the same processes, from a checkpoint, on the split the drafters
// chose). planned: --topology auto's model plan (the first segment only).
SegmentEnd run_segment(const Options& o, const SegmentStart& seg, PowerSampler* gpu_sampler,
                       const GpuReading& startup_gpu, std::optional<ModelPlan> planned) {
  const auto start = mpi::Clock::now();
  Topology topo = create_topology(MPI_COMM_WORLD, seg.split, o.backend);
  const int num_drafters = static_cast<int>(topo.drafters.size());
  const int grad_accum = grad_accum_of(o, num_drafters);  // K from the drafters
  std::vector<std::pair<std::string, std::string>> resolved = segment_record(o, seg, grad_accum);
  std::vector<RankCard> cards = gather_cards(topo, *gpu_sampler, startup_gpu);
  if (topo.world_rank == 0) {
    print_startup(o, seg.split, resolved, topo, cards);
    std::printf("%s\n", grad_accum_line(o, grad_accum, num_drafters).c_str());
    std::fflush(stdout);
  }

  DF_CHECK_HINT(o.inject_fail_rank < topo.world_size, BadOptions,
                "--inject-fail-rank " << o.inject_fail_rank << " is not a rank of this " << topo.world_size << "-rank job",
                "give a rank in [0, " + std::to_string(topo.world_size - 1) + "]");
  // Inputs first, on every rank, and nobody goes on until all have passed: a bad input ends the job
  // before --out is created, locked or written (an earlier run's metrics and checkpoints stay as they are).
  CheckedInputs inputs = validate_inputs(o, topo, cards, std::move(planned));
  barrier(MPI_COMM_WORLD, 10 * o.peer_timeout_s, "checking the inputs");
  // Then --out is this job's alone (rank 0 holds the lock, for the process's life: a segment in place has
  // it; the others wait for it in the resume's bcast).
  if (topo.world_rank == 0 && !seg.in_place) {
    lock_run_dirs(o);
    check_disk_space(o, disk_need(drafter_param_count(inputs.model.drafter), o));
  }
  // --resume: one answer for the whole job; a checkpoint of another model/objective/data is refused while
  // planning, before any model loads; one of another split continues on this one (docs/checkpoint.md).
  ResumeFrom resume = find_resume(o, seg, topo, inputs.handles, resolved);
  // --out is locked and checked: every rank holds it by descriptor (writes under it never follow a link
  // planted there, include/dflash/safe_dir.h), and its output since its start goes into OUT/train.log.
  hold_run_dirs(o);
  open_run_log(o.out_dir + "/train.log");
  const RunPlan plan = plan_segment(o, seg, topo, inputs.handles, std::move(inputs.model), grad_accum,
                                    std::move(resolved), std::move(resume));
  if (plan.resume.state == RunState::AlreadyComplete) {  // a finished run resumed: nothing is written
    if (topo.world_rank == 0) {
      std::printf("[dflash] already complete at step %lld: %s/drafter holds its export, nothing to do (a larger "
                  "--max-steps or --epochs trains on; move %s/drafter away to export again)\n",
                  static_cast<long long>(plan.resume.step), o.out_dir.c_str(), o.out_dir.c_str());
      std::fflush(stdout);
    }
    free_topology(topo);
    return SegmentEnd{};
  }
  // A fresh run exports into OUT/drafter: an earlier run's export there is set aside first, as its
  // metrics.h5 is (docs/checkpoint.md "Reruns in one --out").
  if (topo.world_rank == 0 && plan.resume.fresh() && !seg.in_place) set_aside_previous_drafter(o.out_dir);
  JobContext job(o, plan, topo, start, std::move(cards), std::move(inputs.handles));
  job.gpu_sampler = gpu_sampler;

  job.thread_role = topo.role;
  if (topo.role != Role::Idle) choose_backend_parts(job);
  choose_data_plane(job);

  switch (topo.role) {
    case Role::Target: run_target(job); break;
    case Role::Drafter: run_drafter(job); break;
    case Role::Colocated: run_colocated(job); break;
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

int run_job(const Options& o) {
  capture_run_log();  // stdout and stderr also go to OUT/train.log once --out is this job's (run_log.h)
  // This rank's GPU through NVML, read once now: its idle draw, before any model (or --topology auto's
  // measurement) occupies it. On the CPU backend it reads nothing and says why; the device index is the one
  // create_topology binds (on the CPU backend it only matters to the NVML test hook, which maps local rank i
  // to device i).
  const int local_rank = node_seat(MPI_COMM_WORLD).local_rank;
  const std::unique_ptr<PowerSampler> gpu_sampler =
      PowerSampler::for_rank(o.backend, o.backend == Device::CUDA ? bind_gpu(local_rank) : local_rank);
  const GpuReading startup_gpu = gpu_sampler->sample();
  SegmentStart seg;
  seg.split = o.topology_choice != TopologyChoice::Given ? o.topology : split_at_start(o);  // at a resume, OUT/next-topology may win
  seg.resume = o.resume;
  std::optional<ModelPlan> planned;  // --topology auto plans the job first: its measurement runs both models
  if (o.topology_choice == TopologyChoice::Auto)
    seg.split = choose_topology_auto(o, MPI_COMM_WORLD, gpu_sampler.get(), &seg.auto_record, &planned);
  if (o.topology_choice == TopologyChoice::Plan) {  // the cost model's recommendation, nothing measured
    check_input_paths(o);
    seg.split = choose_topology_plan(o, planned.emplace(plan_job(o)), MPI_COMM_WORLD);
  }
  if (o.measure_only) return 0;  // --measure-only: the table above is the answer
  // One segment per split: --rebalance auto may end one at a checkpoint with another split chosen; every
  // rank then takes its role on it in place, resuming that checkpoint (docs/checkpoint.md "Re-splitting live").
  for (;;) {
    const SegmentEnd end = run_segment(o, seg, gpu_sampler.get(), startup_gpu, std::move(planned));
    planned.reset();
    if (end.code != kResplitCode) return end.code;
    seg.split = *end.next_split;  // (the auto record stays: metrics.h5 keeps how the run began)
    seg.resume = end.checkpoint;
    seg.in_place = true;
    int world_rank = 0;
    DF_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    if (world_rank == 0) {
      // Remembered where a restart looks (a kill or requeue would otherwise resume on the launch's split).
      remember_split(o.out_dir, seg.split);
      std::printf("[rebalance] every rank takes its role on %s in place, from %s\n", seg.split.to_string().c_str(),
                  end.checkpoint.c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace dflash
