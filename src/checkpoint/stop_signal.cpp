// SIGUSR1/SIGTERM -> a flag the training loop polls; the drafters agree on the step to stop at.
//
// mpirun forwards SIGUSR1 to every rank and lets them finish; on SIGTERM it signals every rank and
// SIGKILLs them about a second later (odls_base_sigkill_timeout), so job scripts turn SIGTERM into
// SIGUSR1 for mpirun (docs/checkpoint.md). A SIGTERM delivered to the ranks directly (Slurm's
// scancel of a step, a container stop) is handled like SIGUSR1.
#include <csignal>

#include "dflash/checkpoint.h"
#include "dflash/error.h"
#include "dflash/mpi_typed.h"

namespace dflash {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  // Only the first signal counts; the handler does nothing that is not async-signal-safe.
  if (g_stop_signal == 0) g_stop_signal = sig;
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking reads/writes resume instead of failing with EINTR
  for (int sig : {SIGUSR1, SIGTERM})
    DF_CHECK(sigaction(sig, &sa, nullptr) == 0, SystemFailure, "cannot install the handler of signal " << sig);
}

int stop_signal_received() { return static_cast<int>(g_stop_signal); }

void clear_stop_signal() { g_stop_signal = 0; }

int32_t agree_step_decision(MPI_Comm comm, int32_t local) {
  int32_t decision = local;
  mpi::allreduce(&decision, 1, MPI_BOR, comm);
  return decision;
}

}  // namespace dflash
