// dflash-train: the distributed training job. mpirun -np N dflash-train --topology T-D ... (docs/pipeline.md)
#include <mpi.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "dflash/checkpoint.h"
#include "dflash/error.h"
#include "dflash/options.h"
#include "dflash/runtime.h"

// A stop signal that reaches a rank before main has installed its handlers ends it with the default action
// (exit 138, nothing saved): measured, mpirun's SIGUSR1 0.05-0.15 s after its start, while the ranks still
// load their libraries. No handler can be earlier than that, so a launcher holds such signals until every
// rank can take them: it names a file in DFLASH_READY_FILE, and rank 0 creates it once every rank is past
// MPI_Init (jobs/mpirun/train.sh; tests/e2e/test_signal.sh).
static void announce_ready() {
  const char* path = std::getenv("DFLASH_READY_FILE");
  if (!path || !*path) return;
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
}

int main(int argc, char** argv) {
  // First of all: mpirun may forward SIGUSR1 at any moment, and its default action ends the process.
  dflash::install_stop_signal_handlers();
  // The loader thread never calls MPI. A colocated rank's target and drafter threads both do
  // (src/runtime/role_colocated.cpp, which refuses a library that gives less than MPI_THREAD_MULTIPLE).
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  dflash::process_identity().world_rank = rank;
  dflash::process_identity().world_size = size;
  // Rank 0 parses first, so a bad command line is reported once; every rank would find the same fault, so
  // it ends the job in order (every rank exits with its code through MPI_Finalize), not with MPI_Abort's
  // banner. The others wait for rank 0's verdict.
  dflash::ParseResult parsed;
  if (rank == 0) {
    dflash::Rank0CheckForAll same_on_every_rank;
    parsed = dflash::parse_options(argc, argv);
  }
  if (const int code = dflash::agree_with_rank0(); code != 0) {  // other ranks only: rank 0 left from fatal()
    MPI_Finalize();
    return code;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) announce_ready();  // every rank installed its handlers before MPI_Init
  if (rank != 0) parsed = dflash::parse_options(argc, argv);
  if (parsed.help_requested) {
    if (rank == 0) std::fputs(parsed.help_text.c_str(), stdout);
    MPI_Finalize();
    return 0;
  }
  const int rc = parsed.options.dry_run ? dflash::dry_run(parsed.options) : dflash::run_job(parsed.options);
  MPI_Finalize();
  return rc;
}
