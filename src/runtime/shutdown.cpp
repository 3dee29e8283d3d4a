// The end of the job: every working rank (target, drafter) reports to world rank 0 that it is done, rank 0
// then asks each idle rank to leave and tells everyone the job's exit code.
//
// A barrier over the whole world would let one hung idle rank turn a finished run (drafter exported, final
// checkpoint written) into exit 7, without even naming it. Here rank 0 knows who answered: a working rank
// missing past the deadline is fatal (exit 7, named: its work may be lost); an idle rank that does not
// answer within --peer-timeout is named in a warning and the job ends with the run's own code through
// MPI_Abort: MPI_Finalize would wait for the hung rank forever (Open MPI's finalize is a fence over every
// process) and mpirun waits for every process, while MPI_Abort(code) kills them all and mpirun returns
// `code` -- 0 included (checked with Open MPI 4.1.4, a SIGSTOPped rank among them).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "dflash/checkpoint.h"
#include "dflash/error.h"
#include "dflash/message_tags.h"
#include "dflash/metrics.h"  // format_duration
#include "job.h"

namespace dflash {
namespace {

std::string who(const JobContext& job, int rank) {
  const RankCard& c = job.cards.at(static_cast<size_t>(rank));
  return std::string(role_name(static_cast<Role>(c.role))) + " rank " + std::to_string(rank) + " (host " + c.host +
         ", pid " + std::to_string(c.pid) + ")";
}

// Polls every request with sleeps until all are done or the deadline passes (timeout_s <= 0: no deadline);
// returns the indices still pending. poll() runs at every wake-up.
std::vector<size_t> wait_all(std::vector<MPI_Request>& reqs, double timeout_s, const std::function<void()>& poll = {}) {
  std::vector<size_t> pending;
  auto all_done = [&] {
    pending.clear();
    for (size_t i = 0; i < reqs.size(); ++i)
      if (!mpi::test(reqs[i])) pending.push_back(i);
    return pending.empty();
  };
  mpi::Polling polling;
  polling.progress = poll;
  polling.max_sleep_us = 20000;  // an idle rank waits out the whole run here: it costs no CPU
  mpi::poll_until(all_done, timeout_s, polling);
  return pending;
}

// World rank 0 (always a target): collects the working ranks, then the idle ranks' answers.
int32_t coordinate(const JobContext& job) {
  const Topology& topo = job.topo;
  const double pt = job.opt.peer_timeout_s;
  std::vector<int> working, idle;
  for (int r = 1; r < topo.world_size; ++r)
    (static_cast<Role>(job.cards[static_cast<size_t>(r)].role) == Role::Idle ? idle : working).push_back(r);

  // 1. Every working rank is done: the drafters have exported (and written the final checkpoint).
  std::vector<int32_t> codes(working.size(), 0);
  std::vector<MPI_Request> reqs;
  for (size_t i = 0; i < working.size(); ++i) reqs.push_back(mpi::irecv(&codes[i], 1, working[i], kTagShutdown, MPI_COMM_WORLD));
  const std::vector<size_t> late = wait_all(reqs, 10 * pt);
  if (!late.empty()) {
    std::string names;
    for (size_t i : late) names += (names.empty() ? "" : ", ") + who(job, working[i]);
    fatal(ExitCode::LostPeer,
          "shutdown: " + names + " did not finish within " + std::to_string(static_cast<int>(10 * pt)) + " s",
          "a peer rank died or hangs; see its own error above (the final export or checkpoint may be incomplete)");
  }
  int32_t code = job.own_end_code();
  for (int32_t c : codes) code = std::max(code, c);

  // 2. The idle ranks: they only wait, so they answer at once -- or they hang.
  std::vector<int32_t> answers(idle.size(), -1);
  std::vector<MPI_Request> sends, answered;
  for (size_t i = 0; i < idle.size(); ++i) {
    sends.push_back(mpi::isend(&code, 1, idle[i], kTagShutdown, MPI_COMM_WORLD));
    answered.push_back(mpi::irecv(&answers[i], 1, idle[i], kTagShutdown, MPI_COMM_WORLD));
  }
  const std::vector<size_t> silent = wait_all(answered, pt);
  if (!silent.empty()) {
    // The run is complete: say who hangs, and end the job with the run's code, not 7 (a new split needs
    // every rank: the job ends for a requeue instead, from the checkpoint the split was to start from).
    const bool resplit = code == kResplitCode;
    if (resplit) code = static_cast<int32_t>(ExitCode::Requeue);
    std::string text;
    for (size_t i : silent)
      text += "[dflash] warning: " + who(job, idle[i]) + " did not answer the end of the run within " +
              std::to_string(static_cast<int>(pt)) + " s (--peer-timeout); it was waiting for the run to end " +
              "(it hangs, or is stopped); the job ends without it\n";
    text += "[dflash] done in " + format_duration(job.elapsed()) + ": the run is complete (" +
            (resplit ? "checkpointed for a new split, which needs every rank: resume it with --resume auto"
             : code == static_cast<int32_t>(ExitCode::Requeue) ? "checkpointed after a stop signal"
                                                               : "drafter exported") +
            "); exit " + std::to_string(code) + " through MPI_Abort, which also ends the hung rank (mpirun's " +
            "MPI_ABORT note with errorcode " + std::to_string(code) + " follows)\n";
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  answered.clear();
  const std::vector<size_t> unsent = wait_all(sends, pt);  // the answers came, so these completed
  DF_ASSERT(unsent.empty());

  // 3. Everyone present: the verdict, then MPI_Finalize on every rank.
  sends.clear();
  for (int r : working) sends.push_back(mpi::isend(&code, 1, r, kTagShutdown, MPI_COMM_WORLD));
  const std::vector<size_t> stuck = wait_all(sends, pt);
  if (!stuck.empty())
    fatal(ExitCode::LostPeer, "shutdown: " + who(job, working[stuck.front()]) + " did not take the job's exit code",
          "a peer rank died or hangs; see its own error above");
  return code;
}

// A working rank other than rank 0: says it is done, waits for the job's code.
int32_t report_done(const JobContext& job) {
  const double pt = job.opt.peer_timeout_s;
  int32_t mine = job.own_end_code(), code = -1;
  MPI_Request sent = mpi::isend(&mine, 1, 0, kTagShutdown, MPI_COMM_WORLD);
  MPI_Request got = mpi::irecv(&code, 1, 0, kTagShutdown, MPI_COMM_WORLD);
  // Rank 0 waits up to 10 x --peer-timeout for the others and --peer-timeout for the idle ranks.
  mpi::wait(got, 12 * pt, [&] { return "shutdown: " + who(job, 0) + " never sent the job's exit code"; });
  mpi::wait(sent, pt, [] { return std::string("shutdown: rank 0 did not take this rank's report"); });
  return code;
}

// An idle rank: waits for the whole run (no deadline: its length is unbounded; any other rank's failure
// aborts the job), passing on a stop signal sent to it alone, then answers rank 0.
int32_t wait_for_end(const JobContext& job) {
  maybe_inject_failure(job, job.opt.inject_fail_step);  // test hook: an idle rank fails as soon as it waits
  const int first_drafter = job.topo.drafters.front();
  int32_t code = -1;
  std::vector<MPI_Request> got{mpi::irecv(&code, 1, 0, kTagShutdown, MPI_COMM_WORLD)};
  wait_all(got, 0, [&] { forward_stop_signal(first_drafter); });
  MPI_Request answer = mpi::isend(&code, 1, 0, kTagShutdown, MPI_COMM_WORLD);
  mpi::wait(answer, job.opt.peer_timeout_s, [] { return std::string("shutdown: rank 0 did not take the idle rank's answer"); });
  return code;
}

}  // namespace


int end_of_run(const JobContext& job) {
  const Topology& topo = job.topo;
  DF_ASSERT(topo.world_rank != 0 || topo.role != Role::Idle);  // rank 0 is the first target
  if (topo.world_rank == 0) return coordinate(job);
  return topo.role == Role::Idle ? wait_for_end(job) : report_done(job);
}

}  // namespace dflash
