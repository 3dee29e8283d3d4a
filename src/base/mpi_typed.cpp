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

const char* const kLostPeerHint =
    "a peer rank died or hangs; see its own error above, or raise --peer-timeout if it is just slow";

bool poll_until(const std::function<bool()>& done, double timeout_s, const Polling& polling) {
  Deadline deadline(timeout_s);
  Backoff backoff(polling.max_sleep_us);
  for (;;) {
    if (polling.progress) polling.progress();
    if (done()) return true;
    if (timeout_s > 0 && deadline.expired()) return false;
    if (polling.busy && polling.busy()) backoff.reset();  // poll without sleeping while data moves
    backoff.idle();
  }
}

void wait_until(const std::function<bool()>& done, double timeout_s, const std::function<std::string()>& why,
                const Polling& polling, const std::string& hint) {
  const auto start = Clock::now();
  if (poll_until(done, timeout_s, polling)) return;
  fatal(ExitCode::LostPeer, why() + " (waited " + std::to_string(static_cast<int>(seconds_since(start))) + " s)", hint);
}

void wait(MPI_Request& r, double timeout_s, const std::function<std::string()>& on_timeout,
          const std::function<void()>& progress, MPI_Status* st) {
  Polling polling;
  polling.progress = progress;
  wait_until([&] { return test(r, st); }, timeout_s, on_timeout, polling);
}

}  // namespace dflash::mpi
