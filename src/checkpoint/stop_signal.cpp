// SIGUSR1/SIGTERM -> a flag the training loop polls; the drafters agree on the step to stop at.
//
// mpirun forwards SIGUSR1 to every rank and lets them finish; on SIGTERM it signals every rank and
// SIGKILLs them about a second later (odls_base_sigkill_timeout), so job scripts turn SIGTERM into
// SIGUSR1 for mpirun (docs/checkpoint.md). A SIGTERM delivered to the ranks directly (Slurm's
// scancel of a step, a container stop) is handled like SIGUSR1.
#include <csignal>

#include "dflash/checkpoint.h"
#include "dflash/error.h"
#include "dflash/message_tags.h"
#include "dflash/mpi_typed.h"

namespace dflash {

// The stop signal's tag is still declared in dflash/checkpoint.h: it must not be any other message's.

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

void forward_stop_signal(int first_drafter) {
  static int32_t sent_sig = 0;  // the number sent (kept alive for the isend)
  static MPI_Request req = MPI_REQUEST_NULL;
  if (req != MPI_REQUEST_NULL) mpi::test(req);  // drive it; completes once the drafter takes it
  if (sent_sig != 0 || g_stop_signal == 0) return;
  sent_sig = static_cast<int32_t>(g_stop_signal);
  req = mpi::isend(&sent_sig, 1, first_drafter, kTagStopSignal, MPI_COMM_WORLD);
}

int peer_stop_signal() {
  static int32_t got = 0;
  int flag = 0;
  MPI_Status st;
  while (true) {  // take every message that came (several targets may pass one on); keep the first number
    DF_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kTagStopSignal, MPI_COMM_WORLD, &flag, &st));
    if (!flag) break;
    int32_t sig = 0;
    DF_MPI(MPI_Recv(&sig, 1, MPI_INT32_T, st.MPI_SOURCE, kTagStopSignal, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    if (got == 0) got = sig;
  }
  return static_cast<int>(got);
}

int32_t agree_step_decision(MPI_Comm comm, int32_t local) {
  int32_t decision = local;
  mpi::allreduce(&decision, 1, MPI_BOR, comm);
  return decision;
}

}  // namespace dflash
