#include "dflash/safe_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "dflash/error.h"

namespace dflash {

int open_own_file(const std::string& path, int flags, mode_t mode) {
  const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return -1;
  struct stat st;
  int err = 0;
  if (::fstat(fd, &st) != 0) err = errno;
  else if (!S_ISREG(st.st_mode)) err = EINVAL;
  else if (st.st_nlink > 1) err = EMLINK;
  if (err != 0) {
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

std::string own_file_error(int err) {
  switch (err) {
    case ELOOP: return "it is a symbolic link (refused: a file the job writes must not point elsewhere)";
    case EINVAL: return "it is not a regular file";
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
  t.path = path + ".tmp.XXXXXX";
  t.fd = ::mkstemp(t.path.data());
  DF_CHECK_HINT(t.fd >= 0, SystemFailure, "cannot create a temp file next to " << path << ": " << std::strerror(errno),
                "check that the directory of " + path + " exists and is writable");
  if (::fchmod(t.fd, new_file_mode()) != 0) {
    const int err = errno;
    ::close(t.fd);
    ::unlink(t.path.c_str());
    DF_FAIL(SystemFailure, "cannot set the mode of " << t.path << ": " << std::strerror(err),
            "check the filesystem of " + path);
  }
  return t;
}

bool is_same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void refuse_symlink(const std::string& path, const std::string& what) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return;
  DF_FAIL(BadOptions, what << " " << path << " is a symbolic link: refused (the job would write through it, outside "
                           << "its directory)",
          "remove the link (rm " + path + "); if the data belongs elsewhere, point the whole directory there instead");
}

}  // namespace dflash
