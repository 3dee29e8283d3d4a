// One fatal path for every failure (docs/architecture.md "Errors").
//
// Every check in the code base ends in dflash::fatal(), which prints who failed (rank, role, host, GPU),
// what failed and, where the fix is known, a HINT line to stderr, then ends the whole job with
// MPI_Abort and the exit code of the failure class. Outside MPI (a tool, a unit test) it _Exit()s with
// the same code, so tests can check the code with EXPECT_EXIT.
#pragma once
#include <sstream>
#include <string>

namespace dflash {

// Exit codes, one per failure class. Documented in README.md ("Exit codes"); keep them in sync.
enum class ExitCode : int {
  Ok = 0,
  BadOptions = 2,        // unknown flag, bad value, inconsistent options
  BadInput = 3,          // bad config.json, safetensors, dataset, checkpoint
  TopologyMismatch = 4,  // world size / node layout does not fit --topology
  DeviceFailure = 5,     // CUDA, cuBLAS, cuDNN or NCCL error
  NonFiniteLoss = 6,     // loss or gradient norm became NaN/Inf
  LostPeer = 7,          // a peer vanished or a wait passed its deadline
  SystemFailure = 8,     // MPI, HDF5, filesystem failure
  Internal = 9,          // a broken invariant: a bug in dflash-train
  Requeue = 75,          // checkpointed after SIGUSR1/SIGTERM: the scheduler should requeue (EX_TEMPFAIL)
};

const char* exit_code_name(ExitCode code);

// Who this process is, printed by every fatal error. The runtime fills it in as it learns it.
struct ProcessIdentity {
  int world_rank = -1;
  int world_size = -1;
  std::string role = "-";  // "target", "drafter", "idle", "tool"
  std::string host;
  int gpu = -1;            // CUDA device ordinal, -1 on the CPU backend
};
ProcessIdentity& process_identity();

// Prints the failure and ends the job. Never returns.
[[noreturn]] void fatal(ExitCode code, const std::string& what, const std::string& hint = "");

// While one lives, every fatal error raised on this thread prints `note` as one more HINT line: what the
// failure costs and how to recover, known to the caller but not to the code that fails (e.g. where the
// trained weights are safe when the export that follows fails).
class FatalHintNote {
 public:
  explicit FatalHintNote(std::string note);
  ~FatalHintNote();
  FatalHintNote(const FatalHintNote&) = delete;
  FatalHintNote& operator=(const FatalHintNote&) = delete;
};

// Rank 0's check of what every rank would find the same way: the command line, which every rank parses
// from the same argv. While one lives, a fatal error does not MPI_Abort (whose banner buries the message
// and reads as a crash): rank 0 prints it, sends the exit code to the other ranks, which wait for it in
// agree_with_rank0(), and every rank leaves through MPI_Finalize with that code. Rank 0 only, after
// MPI_Init; without MPI it is the plain fatal path.
class Rank0CheckForAll {
 public:
  Rank0CheckForAll();
  ~Rank0CheckForAll();
  Rank0CheckForAll(const Rank0CheckForAll&) = delete;
  Rank0CheckForAll& operator=(const Rank0CheckForAll&) = delete;
};
// Every rank, once rank 0's check is over: 0 when it passed, else the exit code of its failure (printed by
// rank 0). On a failure, rank 0 never returns from here (it left from fatal()); the others return the code
// and should MPI_Finalize and exit with it.
int agree_with_rank0();

}  // namespace dflash

// ---- check macros ------------------------------------------------------------------------------
// DF_CHECK(cond, code, msg-stream-expression [, hint]) — msg may use << : DF_CHECK(n > 0, BadInput, "n=" << n)
#define DF_STR_(x) #x
#define DF_STR(x) DF_STR_(x)
#define DF_FAIL(code, msg_expr, hint)                                                        \
  do {                                                                                       \
    std::ostringstream df_os_;                                                               \
    df_os_ << msg_expr;                                                                      \
    ::dflash::fatal(::dflash::ExitCode::code, df_os_.str(), hint);                           \
  } while (0)
#define DF_CHECK_HINT(cond, code, msg_expr, hint) \
  do {                                            \
    if (!(cond)) DF_FAIL(code, msg_expr, hint);   \
  } while (0)
#define DF_CHECK(cond, code, msg_expr) DF_CHECK_HINT(cond, code, msg_expr, "")
// An internal invariant: a failure here is a bug, reported with file and line.
#define DF_ASSERT(cond)                                                                       \
  DF_CHECK(cond, Internal, "internal check failed: " #cond " at " __FILE__ ":" DF_STR(__LINE__))

// MPI calls: DF_MPI(MPI_Send(...));
#define DF_MPI(call)                                                                          \
  do {                                                                                        \
    int df_rc_ = (call);                                                                      \
    if (df_rc_ != 0) ::dflash::detail::mpi_failed(df_rc_, #call, __FILE__, __LINE__);        \
  } while (0)
// HDF5 calls returning herr_t or hid_t (negative = failure): DF_H5(H5Dwrite(...), "what")
#define DF_H5(call, what)                                                                     \
  ([&]() { auto df_r_ = (call); if (df_r_ < 0) ::dflash::detail::hdf5_failed(#call, what, __FILE__, __LINE__); return df_r_; }())

namespace dflash::detail {
[[noreturn]] void mpi_failed(int rc, const char* call, const char* file, int line);
[[noreturn]] void hdf5_failed(const char* call, const std::string& what, const char* file, int line);
}  // namespace dflash::detail
