#include "disk_reserve.h"

#include "dflash/safe_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace dflash {

int DiskReserve::create(const std::string& path, size_t bytes) {
  release();
  path_ = path;
  bytes_ = bytes;
  // Always a new file of our own: whatever sits at the name (a stale reserve, or a link planted in a shared
  // --out) is unlinked, never written through (unlinking a link removes the link, not what it names).
  if (const int err = remove_tree_at(path); err != 0) return err;
  const int fd = open_own_file(path, O_WRONLY | O_CREAT | O_EXCL);
  if (fd < 0) return errno;
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));  // glibc writes zeros where unsupported
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  ::close(fd);
  if (err != 0) {
    remove_tree_at(path);
    return err;
  }
  held_ = true;
  return 0;
}

void DiskReserve::release() {
  if (!held_) return;
  remove_tree_at(path_);
  held_ = false;
}

double free_bytes(const std::string& dir) {
  struct statvfs st;
  if (::statvfs(dir.c_str(), &st) != 0) return -1;
  return static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
}

namespace {
herr_t find_errno(unsigned, const H5E_error2_t* e, void* out) {
  const char* at = e->desc ? std::strstr(e->desc, "errno = ") : nullptr;
  if (at && *static_cast<int*>(out) == 0) *static_cast<int*>(out) = std::atoi(at + 8);
  return 0;
}

std::string free_space(const std::string& dir) {
  const double bytes = free_bytes(dir);
  if (bytes < 0) return "unknown";
  char buf[48];
  std::snprintf(buf, sizeof(buf), bytes < 1048576.0 ? "%.0f KiB" : "%.1f MiB", bytes < 1048576.0 ? bytes / 1024 : bytes / 1048576);
  return buf;
}
}  // namespace


int hdf5_failure_errno() {
  int err = 0;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, find_errno, &err);
  return err;
}

std::string io_failure_hint(int err, const std::string& dir) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return std::string(err == ENOSPC ? "the disk is full" : "the disk quota is used up") + ": " + free_space(dir) +
             " free on the filesystem of " + dir + " now; free space there (or give --out on a filesystem with room), " +
             "then run the same command with --resume auto to continue from the last checkpoint";
    case EROFS:
      return "the filesystem of " + dir + " is read-only (mounted so, or remounted read-only after disk errors: see dmesg)";
    case EACCES:
    case EPERM:
      return "no permission to write in " + dir + ": check its owner and mode";
    case EIO:
      return "the device under " + dir + " reported an I/O error: check the disk (dmesg)";
    case 0:
      return "the cause is unknown (HDF5 recorded no errno): check free space and permissions in " + dir;
    default:
      return std::string(std::strerror(err)) + " in " + dir;
  }
}

}  // namespace dflash
