// Files the tools write at fixed names inside a directory that other users may be able to write to (a shared
// --out, a dataset's output directory). A link planted at such a name must never redirect a write outside
// it: a job run as root would overwrite whatever the link names. One place knows how to open, create and
// name such files; the lock file, the metrics reserve and every temp file of an atomic write go through it
// (docs/checkpoint.md says what is checked; metrics.h5 itself is created O_EXCL by HDF5).
#pragma once

#include <sys/types.h>

#include <string>

namespace dflash {

// open(path, flags | O_NOFOLLOW | O_CLOEXEC, mode) that also refuses, once open, anything but a regular file
// with one link (a hard link to a file elsewhere is as good as a symlink to it). -1 with errno on failure:
// ELOOP for a symbolic link, EINVAL for a non-regular file, EMLINK for a hard-linked one.
int open_own_file(const std::string& path, int flags, mode_t mode = 0666);

// A sentence for open_own_file's errno: "is a symbolic link (refused: ...)" for ELOOP, strerror otherwise.
std::string own_file_error(int err);

// The process's umask, read without changing it (/proc/self/status; umask(2) can only be read by setting
// it, which races with other threads creating files). 022 where the kernel does not say.
mode_t current_umask();

// The mode creat(2) would give a new file: 0666 & ~umask. Files made by mkstemp (0600) get it with fchmod.
mode_t new_file_mode();

// A new file next to `path`, named PATH.tmp.XXXXXX by mkstemp (unpredictable, created O_EXCL: it cannot be
// a link planted in advance), with new_file_mode(). Fatal (SystemFailure) when it cannot be created.
struct TempFile {
  int fd = -1;
  std::string path;
};
TempFile create_temp_next_to(const std::string& path);

// True when both paths exist and name one file (the same device and inode: through links too).
bool is_same_file(const std::string& a, const std::string& b);

// Fatal (BadOptions, exit 2) when `path` exists and is a symbolic link; `what` names it in the message.
void refuse_symlink(const std::string& path, const std::string& what);

}  // namespace dflash
