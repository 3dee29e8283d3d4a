// The run directory (--out, and --checkpoint-dir) held open by a descriptor, and every path under it
// resolved from that descriptor (issue 48 item 1). --out may be shared: anyone who can write it can rename
// its entries and plant links at any name in it, at any time, not only before the job starts. A name checked
// once and then used by path is a race; so the job opens the directory once (O_DIRECTORY|O_NOFOLLOW) and each
// later write walks from that descriptor one component at a time with O_NOFOLLOW (openat, mkdirat, renameat,
// unlinkat): a link anywhere below the held directory, planted before start or mid-run, is refused (ELOOP)
// at the moment of the write instead of written through. The file helpers of include/dflash/safe_file.h
// (open_own_file, create_temp_next_to, write_file_atomic) resolve their paths here, so every writer of a
// fixed name under --out gets this without knowing it; a path outside every held directory (a unit test's,
// dflash-prep's output) is opened as given, as before. docs/checkpoint.md "The run directory" lists the names.
#pragma once

#include <sys/types.h>

#include <string>

namespace dflash {

// An owned directory descriptor (closed on destruction), -1 when none.
class DirFd {
 public:
  DirFd() = default;
  explicit DirFd(int fd) : fd_(fd) {}
  DirFd(DirFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  DirFd& operator=(DirFd&& o) noexcept;
  DirFd(const DirFd&) = delete;
  DirFd& operator=(const DirFd&) = delete;
  ~DirFd();
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Creates `path` (mkdir -p: the components above it are the user's to choose) and holds it open for the
// process's life: O_DIRECTORY|O_NOFOLLOW, so a link at its own name is refused. Idempotent per path. `what`
// names it in errors ("--out"). Fatal BadOptions for a link or a non-directory, SystemFailure when it cannot
// be created. Every rank that writes under it calls this once (src/runtime/job_inputs.cpp). With
// MissingDirs::Refuse nothing is created: a missing `path` is left unheld (a reader before the job has made
// --out: there is nothing in it to read yet).
enum class MissingDirs { Refuse, Create };  // how a walk treats a missing directory on the way
void hold_run_dir(const std::string& path, const std::string& what, MissingDirs missing = MissingDirs::Create);

// The directory that holds `path`'s last component (opened, owned) and that component. Under a held run
// directory it is walked from the held descriptor with O_NOFOLLOW and ".." refused; elsewhere opened by path.
// An invalid `dir` on failure, with errno: ELOOP for a link on the way, ENOTDIR for a file on the way,
// ENOENT for a missing one (MissingDirs::Refuse).
struct ParentDir {
  DirFd dir;
  std::string name;
};
ParentDir open_parent(const std::string& path, MissingDirs missing);

// The directory at `path` itself, opened the same way (O_NOFOLLOW at each component under a held directory).
DirFd open_dir(const std::string& path, MissingDirs missing);

// Fatal unless `path` is (or is made into) a directory reached without following a link under a held run
// directory: BadOptions naming the link, or a file or FIFO in a directory's place; SystemFailure otherwise.
// `hint` says what to check.
void create_dirs(const std::string& path, const std::string& hint);

// rename(from, to), both resolved as above (renameat: neither name is followed). 0 or errno. With
// RenameOver::Never (a set-aside name: metrics.N.h5, drafter.N, step-X.incomplete, ...) an entry that
// appeared at `to` since the caller looked is never replaced (renameat2 RENAME_NOREPLACE: EEXIST; plain
// renameat after a look where the filesystem cannot, EINVAL).
enum class RenameOver { Replace, Never };
int rename_path(const std::string& from, const std::string& to, RenameOver over = RenameOver::Replace);

// renameat2(RENAME_EXCHANGE) of two existing names: 0 or errno (EINVAL where the filesystem cannot).
int exchange_paths(const std::string& a, const std::string& b);

// Removes `path` and, if it is a real directory, everything in it, through descriptors only: a link at any
// level is unlinked, never followed (what it names is never touched). 0 or the first errno.
int remove_tree_at(const std::string& path);

// A new empty directory next to `path`'s last component, named PREFIX + six random characters, created by
// mkdirat with 0700 (a name nobody could have planted: mkdirat fails on any existing entry, links included);
// its full path. Fatal SystemFailure when it cannot be made.
std::string make_temp_dir(const std::string& parent, const std::string& prefix);

// Six characters of [A-Za-z0-9] from the kernel's random source: the unpredictable part of temp names.
std::string random_suffix();

}  // namespace dflash
