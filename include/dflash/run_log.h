// OUT/train.log: what every rank of a job prints -- the startup table, the resolved options, the status
// lines, warnings, the fatal message -- also goes into the run's own log, so a run directory holds its
// story without a launcher's `tee` (docs/metrics.md "train.log").
//
// capture_run_log() at rank start turns stdout and stderr into tees (glibc fopencookie): each write goes to
// the terminal (the original descriptor) at once, and to the log. Until open_run_log() names the log
// (after --out is locked: a job that fails its input checks writes nothing there) the text is kept in
// memory (up to 4 MiB). Every rank appends (O_APPEND, one write per chunk: whole lines do not interleave).
// The fatal path echoes its message with run_log_echo() before MPI_Abort.
#pragma once
#include <cstddef>
#include <string>

namespace dflash {

// Idempotent. Output written to the file descriptors 1 and 2 directly (write(2)) is not captured.
void capture_run_log();
// Opens (creates) OUT/train.log for appending, refusing a link (safe_file.h), and writes what was kept
// (src/io/run_log_open.cpp). Fatal SystemFailure when it cannot be opened. Idempotent.
void open_run_log(const std::string& path);
// The log's descriptor (O_APPEND) from here on; what was kept is written first. A second one is closed.
void attach_run_log(int fd);
bool run_log_attached();
// Appends text to the log (or to what is kept for it) in one write; async-signal-unsafe, for the fatal path.
void run_log_echo(const char* text, size_t len);

}  // namespace dflash
