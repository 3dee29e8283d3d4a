// A segment's RunPlan (run_plan.h), decided collectively before any role starts: where it resumes from,
// the lr schedule, the eval cadence. Only targets open the data, so the first target plans what needs it
// and tells every rank; every other value is the same on every rank by construction.
#include <cstdio>
#include <sstream>

#include "dflash/checkpoint.h"
#include "dflash/error.h"
#include "dflash/eval_stats.h"
#include "dflash/schedule.h"
#include "job.h"
#include "run_resume.h"

namespace dflash {
namespace {

// Text from `root` to every rank of the world (length first), each wait bounded by timeout_s.
std::string share_text(std::string text, int root, double timeout_s, const std::function<std::string()>& why) {
  int64_t len = static_cast<int64_t>(text.size());
  MPI_Request r = mpi::ibcast(&len, 1, root, MPI_COMM_WORLD);
  mpi::wait(r, timeout_s, why);
  text.resize(static_cast<size_t>(len));
  r = mpi::ibcast(text.data(), text.size(), root, MPI_COMM_WORLD);
  mpi::wait(r, timeout_s, why);
  return text;
}

// The inputs' content identities, computed where the data is open (the first target: it read the
// dataset's offsets already) and broadcast to every rank, which record them in checkpoints and compare them
// on resume. Text of "k=v" words, one map entry per line.
OptionMap share_input_identities(const Options& o, const Topology& topo, const JobInputs& in) {
  const int root = topo.targets.front();
  std::string text;
  if (topo.world_rank == root)
    for (const auto& [k, v] : input_identities_of(o, *in.dataset)) text += k + "\t" + v + "\n";
  text = share_text(std::move(text), root, 10 * o.peer_timeout_s,
                    [] { return std::string("the first target did not share the inputs' content identities (lost?)"); });
  OptionMap out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t tab = line.find('\t');
    if (tab != std::string::npos) out[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return out;
}

std::string saved_option(const CheckpointState& saved, const char* k) {
  const auto it = saved.options.find(k);
  return it == saved.options.end() ? std::string("?") : it->second;
}

// Whether the checkpoint was made on this segment's split: the same --topology, world size, and numbers of
// targets (data positions) and drafters (RNG states).
ResumeSplit resume_split_of(const CheckpointState& saved, const OptionMap& invariants, const Topology& topo) {
  const bool same = saved_option(saved, "topology") == invariants.at("topology") &&
                    saved_option(saved, "world-size") == invariants.at("world-size") &&
                    saved.data.size() == topo.targets.size() && saved.rng_states.size() == topo.drafters.size();
  return same ? ResumeSplit::Same : ResumeSplit::Changed;
}

// A resume with another --epochs or --max-steps (an extended run, or one ended sooner): "--max-steps 40 -> 80"
// ("" when neither changed; a checkpoint without them is not compared).
std::string run_extension_of(const CheckpointState& saved, const OptionMap& invariants) {
  std::string changes;
  for (const char* k : {"epochs", "max-steps"}) {
    const auto was = saved.options.find(k);
    const auto now = invariants.find(k);
    if (was == saved.options.end() || now == invariants.end() || was->second == now->second) continue;
    changes += (changes.empty() ? "" : ", ") + std::string("--") + k + " " + was->second + " -> " + now->second;
  }
  return changes;
}

// Whether the checkpoint resumed is the end of a run already exported (run_dir.h), decided by world rank 0
// (it reads OUT) for every rank: a finished run's command run again (jobs/mpirun/train.sh adds --resume
// auto) must not append an empty segment and a second last /eval row to metrics.h5.
RunState share_run_state(const Options& o, const Topology& topo, const CheckpointState& saved,
                         const std::string& run_extended) {
  int32_t complete = 0;
  if (topo.world_rank == 0)
    complete = run_extended.empty() && run_state_at(o.out_dir, saved.run_id, saved.step) == RunState::AlreadyComplete;
  MPI_Request r = mpi::ibcast(&complete, 1, 0, MPI_COMM_WORLD);
  mpi::wait(r, 10 * o.peer_timeout_s,
            [] { return std::string("world rank 0 did not say whether the run is complete (lost?)"); });
  return complete ? RunState::AlreadyComplete : RunState::GoesOn;
}

// Where every target starts, decided by the first target (it has the dataset open: a resplit replays the
// saved targets' packing) and sent to every rank: the targets' loaders, the drafters' checkpoints and
// --batch-order fixed all go by it.
DataResume share_data_resume(const Options& o, const SegmentStart& seg, const Topology& topo, const JobInputs& in,
                             const ModelPlan& model, const ResumeFrom& resume, const CheckpointState& saved) {
  const int root = topo.targets.front();
  std::string bytes;
  if (topo.world_rank == root) {
    const DataResume d = plan_data_resume(*in.dataset, model.loader, o.epochs, saved.data, saved.consumed,
                                          static_cast<int>(topo.targets.size()));
    bytes = serialize_data_resume(d);
    if (resume.split == ResumeSplit::Changed) {
      const std::string was = saved_option(saved, "topology") + " on " + saved_option(saved, "world-size") + " rank(s)";
      std::printf("[dflash] resuming on another split: the checkpoint's %s (%zu target(s), %zu drafter(s)) -> %s on %d "
                  "rank(s) (%zu target(s), %zu drafter(s)) at step %lld; %s\n",
                  was.c_str(), saved.data.size(), saved.rng_states.size(), seg.split.to_string().c_str(),
                  topo.world_size, topo.targets.size(), topo.drafters.size(), static_cast<long long>(saved.step),
                  d.resplit ? d.summary.c_str() : "as many targets: their data positions go on as saved");
      std::fflush(stdout);
    }
  }
  bytes = share_text(std::move(bytes), root, 10 * o.peer_timeout_s,
                     [] { return std::string("the first target did not share where the data resumes (lost?)"); });
  return deserialize_data_resume(bytes);
}

// The learning-rate schedule (include/dflash/schedule.h): cosine to the run's end, known before it starts
// from the data, --epochs, --token-budget and the numbers of targets and drafters (or --max-steps when that
// ends the run sooner). Only targets open the data: the first one plans, prints, and tells every rank.
// A run resumed on another split re-plans it for the data left (its targets' epochs, the new numbers of
// targets, drafters and micro-batches) from the checkpoint's step; a run resumed on the same split keeps the
// checkpoint's plan (the one its segment made), so a lineage with a resplit keeps one schedule.
void plan_lr_schedule(const Options& o, const Topology& topo, const JobInputs& in, RunPlan& p,
                      const nlohmann::json& saved_schedule) {
  const int planner = topo.targets.front();
  // total steps, warmup steps, long records and their dropped tokens per epoch, the tokens of an epoch
  int64_t plan[5] = {0, 0, 0, 0, 0};
  if (topo.world_rank == planner) {
    const bool resplit = p.resume.split == ResumeSplit::Changed;
    const bool replan = resplit || !p.resume.run_extended.empty();
    LoaderOptions lo = p.loader;
    lo.consumed = p.resume.consumed;
    ScheduleStart from;
    if (replan)
      from = ScheduleStart{p.resume.data.first_epoch, p.resume.step,
                           o.epochs > 0 ? data_batches_left(*in.dataset, lo, o.epochs, p.resume.data) : -1};
    PlannedSchedule s = plan_schedule(*in.dataset, lo, static_cast<int>(topo.targets.size()),
                                      static_cast<int>(topo.drafters.size()), o.epochs, o.max_steps,
                                      o.train.warmup_steps, o.warmup_ratio, p.grad_accum, from);
    if (replan) {
      // The warmup stays as planned at the start (the resumed run is past it, or in it, as before).
      if (saved_schedule.contains("warmup_steps")) s.warmup_steps = saved_schedule["warmup_steps"].get<int>();
      s.why = (resplit ? "re-planned for the new split: " : "re-planned for " + p.resume.run_extended + ": ") + s.why;
    } else if (!p.resume.fresh() && saved_schedule.contains("total_steps")) {
      s.total_steps = saved_schedule["total_steps"].get<int64_t>();
      s.warmup_steps = saved_schedule["warmup_steps"].get<int>();
      s.why = "as the checkpoint's segment planned it";
    }
    plan[0] = s.total_steps;
    plan[1] = s.warmup_steps;
    plan[2] = s.long_records;
    plan[3] = s.long_tokens_dropped;
    plan[4] = in.dataset->num_tokens();
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
  p.schedule.total_steps = plan[0];
  p.schedule.warmup_steps = static_cast<int>(plan[1]);
  p.dataset.long_records_per_epoch = plan[2];
  p.dataset.long_tokens_dropped_per_epoch = plan[3];
  p.dataset.tokens = plan[4];
  p.train.total_steps = p.schedule.total_steps;
  p.train.warmup_steps = p.schedule.warmup_steps;
}

// --eval-every resolved against the planned run (include/dflash/eval_stats.h), and the eval set said once.
void plan_eval(const Options& o, const Topology& topo, const JobInputs& in, RunPlan& p) {
  if (o.eval_data.empty()) return;
  const CheckpointEvery ck = parse_checkpoint_every(o.checkpoint_every);
  p.eval_every = resolve_eval_every(o.eval_every, ck.unit == CheckpointUnit::Steps ? ck.steps : 0, p.schedule.total_steps);
  if (topo.world_rank != 0 || !in.eval) return;  // rank 0 is a target: it packed the set
  const EvalSet& e = *in.eval;
  std::string long_records;
  if (e.records_cut) long_records = ", " + std::to_string(e.records_cut) + " cut to --token-budget";
  if (e.records_skipped) long_records = ", " + std::to_string(e.records_skipped) + " longer than --token-budget left out";
  const std::string when = p.eval_every > 0 ? "every " + std::to_string(p.eval_every) + " step(s) and after the last"
                                            : std::string("only after the last step (--eval-every 0)");
  const std::string sample = eval_sample_line(e.selection, e.path, o.eval_max_tokens == 0, p.eval_budget(o));
  if (!sample.empty()) std::printf("%s\n", sample.c_str());
  std::printf("[dflash] eval: %s: %lld records%s, %lld tokens in %zu batch(es) (%s); features computed once now; %s\n",
              e.path.c_str(), static_cast<long long>(e.records), long_records.c_str(), static_cast<long long>(e.tokens),
              e.batches.size(), eval_share_summary(e.batch_tokens(), static_cast<int>(topo.drafters.size())).c_str(),
              when.c_str());
  std::fflush(stdout);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> segment_record(const Options& o, const SegmentStart& seg, int grad_accum) {
  std::vector<std::pair<std::string, std::string>> r = o.resolved;
  set_resolved(r, "grad-accum", std::to_string(grad_accum));
  // The split this segment trains on: a live re-split's, or OUT/next-topology's at a resume
  // (remembered_split.h), where it is not the command's --topology (auto keeps its word: how the run began).
  if (seg.in_place || o.topology_choice != TopologyChoice::Auto) set_resolved(r, "topology", seg.split.to_string());
  if (seg.in_place) set_resolved(r, "resume", seg.resume);
  return r;
}

ResumeFrom find_resume(const Options& o, const SegmentStart& seg, const Topology& topo, const JobInputs& in,
                       const std::vector<std::pair<std::string, std::string>>& resolved) {
  ResumeFrom r;
  r.invariants = resume_invariants_of(resolved, topo.world_size, share_input_identities(o, topo, in));
  r.dir = resolve_resume_collective(o, seg.resume, MPI_COMM_WORLD);
  return r;
}

RunPlan plan_segment(const Options& o, const SegmentStart& seg, const Topology& topo, const JobInputs& in,
                     ModelPlan model, int grad_accum, std::vector<std::pair<std::string, std::string>> resolved,
                     ResumeFrom resume) {
  RunPlan p;
  static_cast<ModelPlan&>(p) = std::move(model);
  p.segment = seg;
  p.grad_accum = grad_accum;
  p.train = o.train;
  p.eval_every = o.eval_every;
  p.resolved = std::move(resolved);
  p.resume = std::move(resume);
  nlohmann::json saved_schedule = nlohmann::json::object();
  if (!p.resume.fresh()) {
    const CheckpointState saved = read_checkpoint_state(p.resume.dir);
    p.resume.split = resume_split_of(saved, p.resume.invariants, topo);
    p.resume.run_extended = run_extension_of(saved, p.resume.invariants);
    if (topo.world_rank == 0) {
      // "--target moved: ..., same content", an identity the checkpoint predates
      const std::vector<std::string> notes =
          check_resume_compatible(saved.options, p.resume.invariants, p.resume.dir, p.resume.split);
      for (const std::string& note : notes) std::printf("[dflash] %s\n", note.c_str());
      std::fflush(stdout);
    }
    p.resume.step = saved.step;
    if (!seg.in_place) p.resume.state = share_run_state(o, topo, saved, p.resume.run_extended);
    if (p.resume.state == RunState::AlreadyComplete) return p;  // nothing to plan: run_segment ends the job
    saved_schedule = saved.schedule;
    p.resume.data = share_data_resume(o, seg, topo, in, p, p.resume, saved);
    if (topo.world_rank == 0 && !p.resume.run_extended.empty()) {
      std::printf("[dflash] the run goes on from step %lld with %s (the lr schedule's tail is re-planned below)\n",
                  static_cast<long long>(saved.step), p.resume.run_extended.c_str());
      std::fflush(stdout);
    }
  } else {
    p.resume.data = fresh_data_resume(static_cast<int>(topo.targets.size()), o.train.seed);
  }
  p.resume.consumed = std::make_shared<const ConsumedRecords>(p.resume.data.consumed);
  plan_lr_schedule(o, topo, in, p, saved_schedule);
  plan_eval(o, topo, in, p);
  return p;
}

}  // namespace dflash
