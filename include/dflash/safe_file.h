// Files the tools write at fixed names inside a directory that other users may be able to write to (a shared
// --out, a dataset's output directory). A link planted at such a name must never redirect a write outside
// it: a job run as root would overwrite whatever the link names. One place knows how to open, create and
// name such files; the lock file, the metrics reserve and every temp file of an atomic write go through it
// (docs/checkpoint.md says what is checked; metrics.h5 itself is created O_EXCL by HDF5).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "dflash/safe_dir.h"

namespace dflash {

// Whether a file with more than one hard link is accepted. Refuse for every file the job writes or whose
// text it prints (a hard link to a file elsewhere is as good as a symlink to it); Accept only for the files
// a resume reads back without showing them (a checkpoint's manifest and state: `cp -al` snapshots of a
// checkpoint directory are hard links, and what is read is only parsed and hash-checked).
enum class HardLinks { Refuse, Accept };

// open(path, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode), its directory reached from the held run
// directory (include/dflash/safe_dir.h), that also refuses, once open, anything but a regular file (with one
// link unless `links` accepts more); O_NONBLOCK is cleared again unless asked for. -1 with errno on
// failure: ELOOP for a symbolic link (at the name or on the way), EINVAL for a non-regular file (a FIFO
// there never blocks the open), EMLINK for a hard-linked one.
int open_own_file(const std::string& path, int flags, mode_t mode = 0666, HardLinks links = HardLinks::Refuse);

// How a reader reaches a file: Follow for a path the user gave (a link in it is the user's choice, a HF
// cache is made of links); Refuse for a fixed name under the run directory (open_own_file: no link, no
// FIFO, through the held descriptor), where anyone who can write --out could have planted one.
enum class LinkPolicy { Follow, Refuse };

// The entry at `path` itself, never followed (fstatat AT_SYMLINK_NOFOLLOW in its directory, reached as
// open_own_file reaches it): 0, or errno (ENOENT: nothing there; ELOOP: a link on the way).
int stat_own_entry(const std::string& path, struct stat* st);

// The entries of the directory at `path` (reached as open_dir does: never through a link under a held run
// directory), each with its own type, never followed (S_IFLNK for a link). 0, or errno.
struct DirEntry {
  std::string name;
  mode_t type = 0;  // st_mode & S_IFMT of the entry itself
};
int list_own_dir(const std::string& path, std::vector<DirEntry>* entries);

// The whole text of a small file under the run directory, opened with open_own_file(O_RDONLY, `links`):
// 0, EFBIG when it is larger than `most` bytes, or open_own_file's errno.
int read_own_text(const std::string& path, size_t most, HardLinks links, std::string* text);

// Fatal BadInput, naming `what` and the file, when `path` exists and is not a regular file (a FIFO, device or
// socket given as --data or --eval-data would block the first open, HDF5's too, for ever). Opened
// O_NONBLOCK to tell; a missing or unreadable path is left to the caller's own check.
void check_regular_input(const std::string& path, const std::string& what);

// A sentence for open_own_file's errno: "is a symbolic link (refused: ...)" for ELOOP, strerror otherwise.
std::string own_file_error(int err);

// A file at a fixed name for a library that opens by path (HDF5 has no open-by-descriptor): checked here
// through a descriptor first, and handed to the library as /proc/self/fd/N[/NAME], which names the very file
// (or directory) checked: a link or FIFO swapped in after the check is not what the library opens. Where
// /proc is not mounted, `path` is the plain path (checked, then opened by name: a narrow race remains).
struct PinnedPath {
  DirFd fd;          // the checked file (pin_existing_file) or its directory (pin_new_file); kept open
  std::string path;  // what to hand the library while `fd` is open
};
// An existing file, opened with open_own_file(O_RDONLY): invalid `fd` with errno on failure (ENOENT when
// there is nothing at the name; ELOOP, EINVAL, EMLINK as open_own_file says).
PinnedPath pin_existing_file(const std::string& path);
// A name to create in its directory (reached as include/dflash/safe_dir.h says): create it with O_EXCL
// (HDF5's H5F_ACC_EXCL), which never follows a link planted at the name. Invalid `fd` with errno on failure.
PinnedPath pin_new_file(const std::string& path);

// The process's umask, read without changing it (/proc/self/status; umask(2) can only be read by setting
// it, which races with other threads creating files). 022 where the kernel does not say.
mode_t current_umask();

// The mode creat(2) would give a new file: 0666 & ~umask. Files made by mkstemp (0600) get it with fchmod.
mode_t new_file_mode();

// A new file next to `path`, named PATH.tmp.XXXXXX in mkstemp's way (unpredictable, created
// O_EXCL|O_NOFOLLOW relative to its directory's descriptor: it cannot be an entry planted in advance), with
// new_file_mode(). Fatal when it cannot be created (BadOptions for a link on the way, else SystemFailure).
struct TempFile {
  int fd = -1;
  std::string path;        // the temp file's full path (messages, and writers that need a path: HDF5)
  DirFd dir;               // the directory both names are in, as opened when the temp file was made
  std::string name;        // the temp file's name in `dir`
  std::string final_name;  // `path`'s last component
};
TempFile create_temp_next_to(const std::string& path);

// Renames the temp file over its final name in the same directory descriptor (renameat: a link planted at
// the final name is replaced, never followed), then fsyncs the directory. 0 or errno.
int commit_temp(TempFile& t);

// Closes (if open) and unlinks the temp file.
void discard_temp(TempFile& t);

// True when both paths exist and name one file (the same device and inode: through links too).
bool is_same_file(const std::string& a, const std::string& b);

// Fatal (BadOptions, exit 2) when something other than what the job writes sits at `path`: a symbolic link,
// a file of another type (a FIFO where a file goes, a file where a directory goes), a file with more than one
// hard link. Nothing at the name passes. `what` names it in the message. (A startup check: the writes
// themselves check again when they happen.)
enum class EntryKind { File, Directory };
void refuse_planted(const std::string& path, EntryKind kind, const std::string& what);

}  // namespace dflash
