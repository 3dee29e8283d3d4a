#include "dflash/mpi_typed.h"

#include <sched.h>
#include <unistd.h>

namespace dflash::mpi {

bool test(MPI_Request& r, MPI_Status* st) {
  if (r == MPI_REQUEST_NULL) return true;
  int done = 0;
  DF_MPI(MPI_Test(&r, &done, st ? st : MPI_STATUS_IGNORE));
  return done != 0;
}

void cancel(MPI_Request& r) {
  if (r == MPI_REQUEST_NULL) return;
  DF_MPI(MPI_Cancel(&r));
  DF_MPI(MPI_Wait(&r, MPI_STATUS_IGNORE));
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void Backoff::idle() {
  ++n_;
  if (n_ <= 4) {
    sched_yield();
    return;
  }
  // 20 us doubling up to the cap: a peer that answers soon is noticed soon, a long wait costs little CPU.
  int shift = n_ - 5 < 10 ? n_ - 5 : 10;
  int us = 20 << shift;
  ::usleep(us < max_sleep_us_ ? us : max_sleep_us_);
}

void wait(MPI_Request& r, double timeout_s, const std::function<std::string()>& on_timeout,
          const std::function<void()>& progress, MPI_Status* st) {
  Deadline deadline(timeout_s);
  Backoff backoff;
  while (!test(r, st)) {
    if (progress) progress();
    if (deadline.expired())
      fatal(ExitCode::LostPeer, on_timeout() + " (waited " + std::to_string(static_cast<int>(deadline.elapsed())) + " s)",
            "a peer rank died or hangs; see its own error above, or raise --peer-timeout if it is just slow");
    backoff.idle();
  }
}

}  // namespace dflash::mpi
