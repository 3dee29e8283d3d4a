#include "dflash/error.h"

#include "dflash/run_log.h"

#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace dflash {

const char* exit_code_name(ExitCode code) {
  switch (code) {
    case ExitCode::Ok: return "ok";
    case ExitCode::BadOptions: return "bad options";
    case ExitCode::BadInput: return "bad input";
    case ExitCode::TopologyMismatch: return "topology mismatch";
    case ExitCode::DeviceFailure: return "CUDA/NCCL failure";
    case ExitCode::NonFiniteLoss: return "non-finite loss";
    case ExitCode::LostPeer: return "lost peer or deadline";
    case ExitCode::SystemFailure: return "system failure";
    case ExitCode::Internal: return "internal error";
    case ExitCode::Requeue: return "checkpointed for requeue";
  }
  return "unknown";
}

ProcessIdentity& process_identity() {
  static ProcessIdentity id = [] {
    ProcessIdentity p;
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) == 0) p.host = host;
    return p;
  }();
  return id;
}

namespace {
thread_local std::vector<std::string> t_hint_notes;  // FatalHintNote's, innermost last
}  // namespace

FatalHintNote::FatalHintNote(std::string note) { t_hint_notes.push_back(std::move(note)); }
FatalHintNote::~FatalHintNote() { t_hint_notes.pop_back(); }

namespace {
bool g_rank0_check_for_all = false;  // a Rank0CheckForAll lives (rank 0, main thread)

// Rank 0 -> every rank: the outcome of rank 0's check (0 = passed, else the exit code).
int broadcast_rank0_verdict(int code) {
  MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return code;
}
}  // namespace

Rank0CheckForAll::Rank0CheckForAll() { g_rank0_check_for_all = true; }
Rank0CheckForAll::~Rank0CheckForAll() { g_rank0_check_for_all = false; }

int agree_with_rank0() { return broadcast_rank0_verdict(0); }  // rank 0 sends 0; the others receive

void fatal(ExitCode code, const std::string& what, const std::string& hint) {
  const ProcessIdentity& id = process_identity();
  std::string who = "[dflash FATAL] ";
  if (id.world_rank >= 0)
    who += "rank " + std::to_string(id.world_rank) + "/" + std::to_string(id.world_size) + " ";
  who += "role=" + id.role + " host=" + id.host + " gpu=" + (id.gpu >= 0 ? std::to_string(id.gpu) : "cpu");
  std::string text = who + ": " + what + "\n";
  if (!hint.empty()) text += "  HINT: " + hint + "\n";
  for (auto it = t_hint_notes.rbegin(); it != t_hint_notes.rend(); ++it) text += "  HINT: " + *it + "\n";
  text += "  (exit code " + std::to_string(static_cast<int>(code)) + ": " + exit_code_name(code) + ")\n";
  // One write so lines of several ranks do not interleave; the run's log gets it too (run_log.h).
  std::fflush(stdout);
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
  run_log_echo(text.data(), text.size());
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized && g_rank0_check_for_all) {
    // Every rank would fail the same way: an orderly end on all of them, no abort.
    broadcast_rank0_verdict(static_cast<int>(code));
    MPI_Finalize();
    std::_Exit(static_cast<int>(code));
  }
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, static_cast<int>(code));
  std::_Exit(static_cast<int>(code));
}

namespace detail {
void mpi_failed(int rc, const char* call, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fatal(ExitCode::SystemFailure,
        std::string("MPI call failed: ") + call + " -> " + msg + " (" + file + ":" + std::to_string(line) + ")");
}
void hdf5_failed(const char* call, const std::string& what, const char* file, int line) {
  fatal(ExitCode::SystemFailure, "HDF5 call failed while " + what + ": " + call + " (" + file + ":" +
                                     std::to_string(line) + ")",
        "check that the path is writable/readable and the file is not held open by another writer");
}
}  // namespace detail
}  // namespace dflash
