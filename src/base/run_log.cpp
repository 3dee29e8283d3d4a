// See include/dflash/run_log.h.
#include "dflash/run_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>


namespace dflash {
namespace {

constexpr size_t kMaxKept = 4u << 20;  // before the log opens: a start that prints more keeps its first 4 MiB

struct RunLog {
  std::mutex mu;
  int fd = -1;            // OUT/train.log (O_APPEND), -1 before open_run_log
  std::string kept;       // written before the log opened
  bool truncated = false;
};
RunLog& run_log() {
  static RunLog* log = new RunLog;  // never destroyed: stdio may flush into it at exit
  return *log;
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // a full disk or a closed terminal must not stop the job here
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void to_log(const char* p, size_t n) {
  RunLog& log = run_log();
  std::lock_guard<std::mutex> lock(log.mu);
  if (log.fd >= 0) {
    write_all(log.fd, p, n);
  } else if (log.kept.size() + n <= kMaxKept) {
    log.kept.append(p, n);
  } else {
    log.truncated = true;
  }
}

// The cookie of a tee stream: the original descriptor (a dup of 1 or 2).
ssize_t tee_write(void* cookie, const char* buf, size_t size) {
  const int terminal = static_cast<int>(reinterpret_cast<intptr_t>(cookie));
  write_all(terminal, buf, size);
  to_log(buf, size);
  return static_cast<ssize_t>(size);
}

FILE* tee_stream(int fd, int buffering) {
  const int dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (dup_fd < 0) return nullptr;
  cookie_io_functions_t io{};
  io.write = tee_write;
  FILE* f = fopencookie(reinterpret_cast<void*>(static_cast<intptr_t>(dup_fd)), "w", io);
  if (!f) {
    ::close(dup_fd);
    return nullptr;
  }
  std::setvbuf(f, nullptr, buffering, buffering == _IONBF ? 0 : 1 << 14);
  return f;
}

}  // namespace

void capture_run_log() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::fflush(stdout);
    std::fflush(stderr);
    // stdout line-buffered, as on a terminal (each status line reaches both at once); stderr unbuffered.
    if (FILE* out = tee_stream(STDOUT_FILENO, _IOLBF)) stdout = out;
    if (FILE* err = tee_stream(STDERR_FILENO, _IONBF)) stderr = err;
  });
}

void attach_run_log(int fd) {
  RunLog& log = run_log();
  std::fflush(stdout);
  std::lock_guard<std::mutex> lock(log.mu);
  if (log.fd >= 0) {
    ::close(fd);
    return;
  }
  write_all(fd, log.kept.data(), log.kept.size());
  if (log.truncated) {
    const char note[] = "[dflash] (train.log: the start-up's output past 4 MiB was not kept)\n";
    write_all(fd, note, sizeof(note) - 1);
  }
  log.kept.clear();
  log.kept.shrink_to_fit();
  log.fd = fd;
}

bool run_log_attached() {
  RunLog& log = run_log();
  std::lock_guard<std::mutex> lock(log.mu);
  return log.fd >= 0;
}

void run_log_echo(const char* text, size_t len) { to_log(text, len); }

}  // namespace dflash
