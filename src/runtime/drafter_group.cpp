// DrafterGroup: see drafter_group.h.
#include "drafter_group.h"

#include <array>
#include <iterator>

#include "dflash/error.h"

namespace dflash {

DrafterGroup::DrafterGroup(const JobContext& job)
    : o_(job.opt), topo_(job.topo), presence_(job.topo, job.opt.peer_timeout_s) {}

std::string DrafterGroup::stalled(const char* what) const {
  std::string who = presence_.laggards(round_);
  if (who.empty()) {
    who = "drafter ranks ";
    for (size_t i = 0; i < topo_.drafters.size(); ++i) who += (i ? "," : "") + std::to_string(topo_.drafters[i]);
  }
  return "lost peer: " + who + ": " + what;
}

void DrafterGroup::check_same_init(double weights_checksum) {
  if (size() < 2) return;
  double sum[2] = {weights_checksum, -weights_checksum};
  mpi::allreduce(sum, 2, MPI_MAX, topo_.drafter_comm);
  DF_CHECK(sum[0] == -sum[1], Internal, "drafter ranks start from different weights");
}

DrafterGroup::StepAgreement DrafterGroup::agree_on_step(bool have_batch, bool lost_target, const Progress& progress) {
  // {every drafter has a batch, the lowest world rank of a drafter that lost a target}
  int32_t agreed[2] = {have_batch ? 1 : 0, lost_target ? topo_.world_rank : INT32_MAX};
  if (size() > 1) {
    MPI_Request r = mpi::iallreduce(agreed, 2, MPI_MIN, topo_.drafter_comm);
    mpi::wait(r, o_.peer_timeout_s, [&] { return stalled("the drafters did not agree on the next step"); }, progress);
  }
  return StepAgreement{agreed[0] != 0, agreed[1]};
}

int DrafterGroup::agree_on_lost_target(bool lost_target) {
  int32_t lost_by = lost_target ? topo_.world_rank : INT32_MAX;
  if (size() > 1) {
    enter();
    MPI_Request r = mpi::iallreduce(&lost_by, 1, MPI_MIN, topo_.drafter_comm);
    mpi::wait(r, o_.peer_timeout_s, [&] { return stalled("the drafters did not agree on the end of the run"); });
  }
  return lost_by;
}

void DrafterGroup::sum_step(StepSums& sums, std::vector<double>& acc_by_pos, GradientReducer& reducer,
                            const Progress& progress) {
  enter();
  std::array<double, std::size(StepSums::kFields)> packed;
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = sums.*StepSums::kFields[i];
  MPI_Request rs = mpi::iallreduce(packed.data(), packed.size(), MPI_SUM, topo_.drafter_comm);
  MPI_Request rp = mpi::iallreduce(acc_by_pos.data(), acc_by_pos.size(), MPI_SUM, topo_.drafter_comm);
  bool grads_done = false, sums_done = false, pos_done = false;
  mpi::Polling polling;
  polling.progress = progress;
  const auto start = mpi::Clock::now();
  const bool done = mpi::poll_until([&] {
    grads_done = grads_done || reducer.done();
    sums_done = sums_done || mpi::test(rs);
    pos_done = pos_done || mpi::test(rp);
    return grads_done && sums_done && pos_done;
  }, o_.peer_timeout_s, polling);
  if (!done) {
    reducer.abort();
    fatal(ExitCode::LostPeer, stalled("the gradient allreduce stalled") + " (waited " +
                                  std::to_string(static_cast<int>(mpi::seconds_since(start))) + " s)",
          "a drafter rank died or hangs; see its own error above, or raise --peer-timeout if it is just slow");
  }
  for (size_t i = 0; i < packed.size(); ++i) sums.*StepSums::kFields[i] = packed[i];
}

void DrafterGroup::sum(std::vector<double>& values, const char* what, const Progress& progress) {
  if (size() < 2) return;
  enter();
  MPI_Request r = mpi::iallreduce(values.data(), values.size(), MPI_SUM, topo_.drafter_comm);
  mpi::wait(r, o_.peer_timeout_s, [&] { return stalled(what); }, progress);
}

}  // namespace dflash
