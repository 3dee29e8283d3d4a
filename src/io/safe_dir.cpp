// See include/dflash/safe_dir.h.
#include "dflash/safe_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "dflash/error.h"

namespace dflash {
namespace fs = std::filesystem;
namespace {

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

struct HeldDir {
  std::string path;  // absolute, lexically normal, no trailing '/'
  int fd;
};

std::mutex& held_mutex() {
  static std::mutex m;
  return m;
}
std::vector<HeldDir>& held() {
  static std::vector<HeldDir> dirs;  // never closed: held for the process's life
  return dirs;
}

std::string normal_absolute(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(path), ec);
  if (ec) p = fs::path(path);
  std::string s = p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// The held directory `path` lies in (the longest one), a dup of its descriptor, and the components below
// it; -1 when it lies in none.
int held_anchor(const std::string& path, std::vector<std::string>* below) {
  const std::string abs = normal_absolute(path);
  std::lock_guard<std::mutex> lock(held_mutex());
  const HeldDir* best = nullptr;
  for (const HeldDir& h : held()) {
    const bool inside = abs == h.path || (abs.size() > h.path.size() && abs.compare(0, h.path.size(), h.path) == 0 &&
                                          (abs[h.path.size()] == '/' || h.path == "/"));
    if (inside && (best == nullptr || h.path.size() > best->path.size())) best = &h;
  }
  if (best == nullptr) return -1;
  below->clear();
  for (const auto& c : fs::path(abs.substr(best->path.size())))
    if (c != "/" && !c.empty() && c != ".") below->push_back(c.string());
  return ::fcntl(best->fd, F_DUPFD_CLOEXEC, 0);
}

// One step of a walk: the directory `name` in `dir`, never through a link; made first when missing and
// `missing` says so.
int step_into(int dir, const std::string& name, MissingDirs missing) {
  if (name == "..") {
    errno = EACCES;  // lexically normal paths have none below the anchor; refuse any that would climb out
    return -1;
  }
  int fd = ::openat(dir, name.c_str(), kDirFlags);
  if (fd < 0 && errno == ENOENT && missing == MissingDirs::Create) {
    if (::mkdirat(dir, name.c_str(), 0777) != 0 && errno != EEXIST) return -1;
    fd = ::openat(dir, name.c_str(), kDirFlags);
  }
  struct stat st;  // O_DIRECTORY|O_NOFOLLOW at a link says ENOTDIR: a link is named as one (ELOOP)
  if (fd < 0 && errno == ENOTDIR && ::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
    errno = ELOOP;
  return fd;
}

// Walks `parts` from `start` (owned: closed here); the last directory's descriptor, or -1 with errno.
int walk(int start, const std::vector<std::string>& parts, size_t count, MissingDirs missing) {
  int cur = start;
  for (size_t i = 0; i < count && cur >= 0; ++i) {
    const int next = step_into(cur, parts[i], missing);
    const int err = errno;
    ::close(cur);
    cur = next;
    errno = err;
  }
  return cur;
}

// A directory outside every held one: opened by the path as given (made first when asked).
int open_plain_dir(const std::string& path, MissingDirs missing) {
  if (missing == MissingDirs::Create) {
    std::error_code ec;
    fs::create_directories(path, ec);
  }
  return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

int remove_entry(int dir, const std::string& name) {
  if (::unlinkat(dir, name.c_str(), 0) == 0 || errno == ENOENT) return 0;
  if (errno != EISDIR && errno != EPERM) return errno;
  const int fd = ::openat(dir, name.c_str(), kDirFlags);
  if (fd < 0) return errno;
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    return err;
  }
  int first = 0;
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
  for (const std::string& n : names) {
    const int err = remove_entry(::dirfd(d), n);
    if (first == 0) first = err;
  }
  ::closedir(d);
  if (::unlinkat(dir, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT && first == 0) first = errno;
  return first;
}

}  // namespace

DirFd& DirFd::operator=(DirFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

DirFd::~DirFd() {
  if (fd_ >= 0) ::close(fd_);
}

void hold_run_dir(const std::string& path, const std::string& what, MissingDirs missing) {
  const std::string abs = normal_absolute(path);
  {
    std::lock_guard<std::mutex> lock(held_mutex());
    for (const HeldDir& h : held())
      if (h.path == abs) return;
  }
  // The directories above it are the user's choice (a link among them is theirs); its own name is not
  // followed: a link planted there by someone else would move the whole run.
  std::error_code ec;
  struct stat lst;
  if (missing == MissingDirs::Refuse && ::lstat(path.c_str(), &lst) != 0 && errno == ENOENT) return;
  if (missing == MissingDirs::Create) fs::create_directories(path, ec);
  const int fd = ::open(path.c_str(), kDirFlags);
  if (fd < 0 && (errno == ELOOP || errno == ENOTDIR)) {
    struct stat st;  // (O_DIRECTORY|O_NOFOLLOW at a link says ENOTDIR: lstat tells which)
    const bool link = errno == ELOOP || (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode));
    DF_FAIL(BadOptions,
            what << " " << path << (link ? " is a symbolic link: refused (the run directory is held by its own name)"
                                          : " is not a directory"),
            link ? "give the directory it points to (" + what + " $(readlink -f " + path + "))"
                 : "give a directory (or a path where one can be made)");
  }
  DF_CHECK_HINT(fd >= 0, SystemFailure,
                "cannot create " << what << " " << path << ": " << (ec ? ec.message() : std::strerror(errno)),
                "give a writable directory");
  std::lock_guard<std::mutex> lock(held_mutex());
  held().push_back({abs, fd});
}

ParentDir open_parent(const std::string& path, MissingDirs missing) {
  ParentDir p;
  std::vector<std::string> parts;
  const int anchor = held_anchor(path, &parts);
  if (anchor >= 0 && !parts.empty()) {
    p.name = parts.back();
    p.dir = DirFd(walk(anchor, parts, parts.size() - 1, missing));
    return p;
  }
  if (anchor >= 0) ::close(anchor);  // the held directory itself: its parent is outside, opened by path
  const fs::path fp(path);
  p.name = fp.filename().string();
  const std::string parent = fp.has_parent_path() ? fp.parent_path().string() : ".";
  p.dir = DirFd(open_plain_dir(parent.empty() ? "/" : parent, missing));
  return p;
}

DirFd open_dir(const std::string& path, MissingDirs missing) {
  std::vector<std::string> parts;
  const int anchor = held_anchor(path, &parts);
  if (anchor >= 0) return DirFd(walk(anchor, parts, parts.size(), missing));
  return DirFd(open_plain_dir(path, missing));
}

void create_dirs(const std::string& path, const std::string& hint) {
  const DirFd d = open_dir(path, MissingDirs::Create);
  if (d.valid()) return;
  const int err = errno;
  if (err == ELOOP)
    DF_FAIL(BadOptions,
            "cannot write into " << path << ": it, or a directory on its way in the run directory, is a symbolic link "
                                 << "(refused: the job's files must not go elsewhere)",
            "remove the link; if the data belongs elsewhere, give --out (or --checkpoint-dir) there instead");
  if (err == ENOTDIR)  // a file, FIFO or socket planted where the job makes a directory (or on its way)
    DF_FAIL(BadOptions,
            "cannot write into " << path << ": it, or a directory on its way, is not a directory (a file or FIFO "
                                 << "is in its place: refused)",
            "move it away; the job makes its own directory there");
  DF_FAIL(SystemFailure, "cannot create directory " << path << ": " << std::strerror(err), hint);
}

int rename_path(const std::string& from, const std::string& to, RenameOver over) {
  const ParentDir a = open_parent(from, MissingDirs::Refuse);
  if (!a.dir.valid()) return errno;
  const ParentDir b = open_parent(to, MissingDirs::Refuse);
  if (!b.dir.valid()) return errno;
  if (over == RenameOver::Never) {
    if (::renameat2(a.dir.get(), a.name.c_str(), b.dir.get(), b.name.c_str(), RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL) return errno;
    struct stat st;  // no RENAME_NOREPLACE here: look, then rename (the narrow race of a plain rename)
    if (::fstatat(b.dir.get(), b.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return EEXIST;
  }
  return ::renameat(a.dir.get(), a.name.c_str(), b.dir.get(), b.name.c_str()) == 0 ? 0 : errno;
}

int exchange_paths(const std::string& x, const std::string& y) {
  const ParentDir a = open_parent(x, MissingDirs::Refuse);
  if (!a.dir.valid()) return errno;
  const ParentDir b = open_parent(y, MissingDirs::Refuse);
  if (!b.dir.valid()) return errno;
  return ::renameat2(a.dir.get(), a.name.c_str(), b.dir.get(), b.name.c_str(), RENAME_EXCHANGE) == 0 ? 0 : errno;
}

int remove_tree_at(const std::string& path) {
  const ParentDir p = open_parent(path, MissingDirs::Refuse);
  if (!p.dir.valid()) return errno == ENOENT ? 0 : errno;
  return remove_entry(p.dir.get(), p.name);
}

std::string random_suffix() {
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char bytes[6];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    DF_CHECK(n > 0 || errno == EINTR, SystemFailure, "getrandom failed: " << std::strerror(errno));
    if (n > 0) got += static_cast<size_t>(n);
  }
  std::string s;
  for (unsigned char b : bytes) s += kChars[b % (sizeof kChars - 1)];
  return s;
}

std::string make_temp_dir(const std::string& parent, const std::string& prefix) {
  const DirFd d = open_dir(parent, MissingDirs::Refuse);
  int err = errno;
  for (int attempt = 0; d.valid() && attempt < 100; ++attempt) {
    const std::string name = prefix + random_suffix();
    if (::mkdirat(d.get(), name.c_str(), 0700) == 0) return parent + "/" + name;
    err = errno;
    if (err != EEXIST) break;
  }
  DF_FAIL(SystemFailure, "cannot create a staging directory " << parent << "/" << prefix << "XXXXXX: " << std::strerror(err),
          "check that " + parent + " is a writable directory (not a link)");
}

}  // namespace dflash
