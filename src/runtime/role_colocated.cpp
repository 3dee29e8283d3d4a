// A colocated rank: its target and its drafter in one process, a thread each (colocated.h). The target
// thread runs the target loop (role_target.cpp) and the main thread the drafter loop (role_drafter.cpp)
// exactly as on a split, over the local data plane (src/comm/data_plane_local.cpp): the credit protocol,
// its deadlines, q_hs and the per-role time split are the split's, only no byte travels. On CUDA the
// target computes on a second stream of the GPU, so the next batch's forward overlaps the drafter's step;
// the plane's events order the two where they share a batch.
#include <thread>

#include "dflash/backend.h"
#include "dflash/device_async.h"
#include "dflash/error.h"
#include "colocated.h"
#include "job.h"

namespace dflash {

namespace {

const char* point_name(ColocatedMeet::Point p) {
  return p == ColocatedMeet::Point::Loaded ? "loading its model" : "sending its eval batches";
}

}  // namespace

void ColocatedMeet::target_arrives(Point p, double timeout_s, const std::function<void()>& poll) {
  const int i = static_cast<int>(p);
  arrived_[i] = true;
  mpi::Polling polling;
  polling.progress = poll;
  mpi::wait_until([&] { return passed_[i].load(); }, timeout_s, [&] {
    return std::string("this colocated rank's drafter did not pass the job's barrier after ") + point_name(p);
  }, polling);
}

void ColocatedMeet::drafter_passes(Point p, double timeout_s, const std::function<void()>& poll,
                                   const std::function<void()>& barrier) {
  const int i = static_cast<int>(p);
  mpi::Polling polling;
  polling.progress = poll;
  mpi::wait_until([&] { return arrived_[i].load(); }, timeout_s, [&] {
    return std::string("this colocated rank's target thread did not finish ") + point_name(p);
  }, polling);
  barrier();
  passed_[i] = true;
}

void run_colocated(JobContext& job) {
  int level = 0;
  DF_MPI(MPI_Query_thread(&level));
  DF_CHECK_HINT(level == MPI_THREAD_MULTIPLE, SystemFailure,
                "--topology colocated runs a target and a drafter thread that both use MPI, but this MPI library "
                "gave thread level " << level << ", not MPI_THREAD_MULTIPLE",
                "use an MPI built with thread support (Open MPI and MPICH are by default), or a split such as 1-1");
  // The target's own context: the CPU, or a second stream of this rank's GPU (its forward overlaps the
  // drafter's step; the local plane's events order them where they share a batch).
  JobContext target_job = job;
  target_job.thread_role = Role::Target;
  job.thread_role = Role::Drafter;
  std::thread target([&target_job] {
    // Made on this thread: on CUDA it also makes the rank's GPU this thread's current device.
    target_job.ctx = colocated_target_ctx(target_job.opt.backend, target_job.topo.gpu);
    run_target(target_job);
  });
  run_drafter(job);
  target.join();
}

}  // namespace dflash
