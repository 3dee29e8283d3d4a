#include "dflash/safe_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "dflash/error.h"
#include "dflash/safe_dir.h"

namespace dflash {

int open_own_file(const std::string& path, int flags, mode_t mode, HardLinks links) {
  // The directory through the held run directory's descriptor (include/dflash/safe_dir.h), the name itself
  // without following it and without blocking: a FIFO planted at the name would block open(2) until a
  // writer came (O_NONBLOCK returns at once, or ENXIO for a write-only FIFO without a reader).
  const ParentDir parent = open_parent(path, MissingDirs::Refuse);
  if (!parent.dir.valid()) return -1;
  const int fd = ::openat(parent.dir.get(), parent.name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode);
  if (fd < 0) {
    if (errno == ENXIO) errno = EINVAL;
    return -1;
  }
  struct stat st;
  int err = 0;
  if (::fstat(fd, &st) != 0) err = errno;
  else if (!S_ISREG(st.st_mode)) err = EINVAL;
  else if (st.st_nlink > 1 && links == HardLinks::Refuse) err = EMLINK;
  else if ((flags & O_NONBLOCK) == 0 && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) err = errno;
  if (err != 0) {
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

int stat_own_entry(const std::string& path, struct stat* st) {
  const ParentDir parent = open_parent(path, MissingDirs::Refuse);
  if (!parent.dir.valid()) return errno;
  return ::fstatat(parent.dir.get(), parent.name.c_str(), st, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : errno;
}

int list_own_dir(const std::string& path, std::vector<DirEntry>* entries) {
  entries->clear();
  DirFd d = open_dir(path, MissingDirs::Refuse);
  if (!d.valid()) return errno;
  // fdopendir takes the descriptor over, and reads from its offset: a new open of "." (not a dup, which
  // would share the held directory's offset with every other listing of it), `d` kept for fstatat.
  const int fd = ::openat(d.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* dir = fd >= 0 ? ::fdopendir(fd) : nullptr;
  if (dir == nullptr) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return err;
  }
  while (const dirent* e = ::readdir(dir)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    struct stat st;  // the entry itself: a link is reported as one, never followed
    if (::fstatat(d.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
    entries->push_back({e->d_name, static_cast<mode_t>(st.st_mode & S_IFMT)});
  }
  ::closedir(dir);
  return 0;
}

int read_own_text(const std::string& path, size_t most, HardLinks links, std::string* text) {
  text->clear();
  const int fd = open_own_file(path, O_RDONLY, 0, links);
  if (fd < 0) return errno;
  struct stat st;
  int err = ::fstat(fd, &st) != 0 ? errno : static_cast<uint64_t>(st.st_size) > most ? EFBIG : 0;
  if (err == 0) {
    text->resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < text->size()) {
      const ssize_t n = ::read(fd, text->data() + got, text->size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : 0;
        break;
      }
      got += static_cast<size_t>(n);
    }
    text->resize(got);
  }
  ::close(fd);
  return err;
}

void check_regular_input(const std::string& path, const std::string& what) {
  // Opened without blocking (a FIFO given as a dataset would block open(2), and HDF5's own open, forever).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;  // missing or unreadable: the caller's own check names that
  struct stat st;
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  ::close(fd);
  DF_CHECK_HINT(regular, BadInput, what << " " << path << " is not a regular file (a FIFO, device or socket): refused",
                "give the dataset file itself (an HDF5 file made by dflash-prep or dflash-tokenize)");
}

namespace {
// "/proc/self/fd/N" when the kernel shows it (it reopens the descriptor's own file), "" otherwise.
std::string proc_fd_path(int fd) {
  static const bool has_proc = ::access("/proc/self/fd", X_OK) == 0;
  return has_proc ? "/proc/self/fd/" + std::to_string(fd) : std::string();
}
}  // namespace

PinnedPath pin_existing_file(const std::string& path) {
  PinnedPath p;
  p.fd = DirFd(open_own_file(path, O_RDONLY));
  const std::string proc = p.fd.valid() ? proc_fd_path(p.fd.get()) : std::string();
  p.path = proc.empty() ? path : proc;
  return p;
}

PinnedPath pin_new_file(const std::string& path) {
  ParentDir parent = open_parent(path, MissingDirs::Refuse);
  PinnedPath p;
  const std::string proc = parent.dir.valid() ? proc_fd_path(parent.dir.get()) : std::string();
  p.path = proc.empty() ? path : proc + "/" + parent.name;
  p.fd = std::move(parent.dir);
  return p;
}

std::string own_file_error(int err) {
  switch (err) {
    case ELOOP:
      return "it is a symbolic link, or a directory on its way in the run directory is (refused: a file the job "
             "writes must not point elsewhere)";
    case EINVAL: return "it is not a regular file (a FIFO, device, socket or directory: refused)";
    case ENOTDIR: return "a component of its path is not a directory (refused)";
    case EISDIR: return "it is a directory, not the file the job writes there (refused)";
    case EFBIG: return "it is larger than any file the job writes there";
    case EMLINK: return "it has more than one hard link (refused: writing it would change a file elsewhere)";
    default: return std::strerror(err);
  }
}

mode_t current_umask() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, 6, "Umask:") == 0) return static_cast<mode_t>(std::strtoul(line.c_str() + 6, nullptr, 8));
  return 022;
}

mode_t new_file_mode() { return 0666 & ~current_umask(); }

TempFile create_temp_next_to(const std::string& path) {
  TempFile t;
  ParentDir parent = open_parent(path, MissingDirs::Refuse);
  int err = errno;
  if (!parent.dir.valid() && err == ELOOP)
    DF_FAIL(BadOptions, "cannot write " << path << ": " << own_file_error(err),
            "remove the link; if the data belongs elsewhere, give --out (or --checkpoint-dir) there instead");
  // mkstemp's way relative to the directory's descriptor: a random name, created O_EXCL|O_NOFOLLOW (no
  // entry planted in advance, link or file, can be it); open(2)'s 0666 & ~umask is new_file_mode().
  for (int attempt = 0; parent.dir.valid() && attempt < 100; ++attempt) {
    t.name = parent.name + ".tmp." + random_suffix();
    t.fd = ::openat(parent.dir.get(), t.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    err = errno;
    if (t.fd >= 0 || err != EEXIST) break;
  }
  DF_CHECK_HINT(t.fd >= 0, SystemFailure, "cannot create a temp file next to " << path << ": " << std::strerror(err),
                "check that the directory of " + path + " exists and is writable");
  const size_t slash = path.find_last_of('/');
  t.path = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + t.name;
  t.final_name = parent.name;
  t.dir = std::move(parent.dir);
  return t;
}

int commit_temp(TempFile& t) {
  if (::renameat(t.dir.get(), t.name.c_str(), t.dir.get(), t.final_name.c_str()) != 0) return errno;
  // The rename is durable only once the directory entry is on disk; some filesystems (certain network
  // mounts) refuse fsync on directories, which is not a write failure.
  if (::fsync(t.dir.get()) != 0 && errno != EINVAL && errno != EROFS) return errno;
  return 0;
}

void discard_temp(TempFile& t) {
  if (t.fd >= 0) ::close(t.fd);
  t.fd = -1;
  if (t.dir.valid()) ::unlinkat(t.dir.get(), t.name.c_str(), 0);
}

bool is_same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void refuse_planted(const std::string& path, EntryKind kind, const std::string& what) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  const char* wrong = nullptr;
  if (S_ISLNK(st.st_mode))
    wrong = "is a symbolic link: refused (the job would write through it, outside its directory)";
  else if (kind == EntryKind::File && !S_ISREG(st.st_mode))
    wrong = S_ISDIR(st.st_mode) ? "is a directory, not the file the job writes there"
                                : "is not a regular file (a FIFO, device or socket: opening it could block the job)";
  else if (kind == EntryKind::Directory && !S_ISDIR(st.st_mode))
    wrong = "is not a directory";
  else if (kind == EntryKind::File && st.st_nlink > 1)
    wrong = "has more than one hard link: refused (writing it would change a file elsewhere)";
  if (wrong == nullptr) return;
  DF_FAIL(BadOptions, what << " " << path << " " << wrong,
          "remove it (rm " + path + "); if the data belongs elsewhere, point the whole directory there instead");
}

}  // namespace dflash
