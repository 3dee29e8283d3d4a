// A full disk must not leave metrics.h5 half-written (internal header; docs/metrics.md "A full disk").
//
// HDF5 writes a flush's pieces one after the other: when the disk fills in the middle, the file can be
// left with a superblock that does not cover its own objects ("addr overflow"), unreadable -- and HDF5
// 1.10 cannot flush that file again ("slist already enabled?"). So a flush must not run out of space: the
// writer keeps a reserve file of allocated space next to metrics.h5, sized for one flush. When the disk
// is low, it deletes the reserve, flushes into the room it leaves, and allocates the reserve again; when
// that fails, the disk is full, the file on disk is whole, and the job stops saying so.
#pragma once
#include <cstddef>
#include <string>

namespace dflash {

class DiskReserve {
 public:
  DiskReserve() = default;
  ~DiskReserve() { release(); }
  DiskReserve(const DiskReserve&) = delete;
  DiskReserve& operator=(const DiskReserve&) = delete;
  // Creates `path` with `bytes` allocated on its filesystem. Returns 0, or the errno of the failure (the
  // partial file is removed).
  int create(const std::string& path, size_t bytes);
  // Deletes the file: its space is free again. Idempotent.
  void release();
  // Creates it again, same path and size (after release). Returns 0 or the errno.
  int restore() { return create(path_, bytes_); }
  const std::string& path() const { return path_; }
  size_t bytes() const { return bytes_; }

 private:
  std::string path_;
  size_t bytes_ = 0;
  bool held_ = false;
};

// Bytes free to an unprivileged user on the filesystem of `dir`; -1 when statvfs fails.
double free_bytes(const std::string& dir);

// The errno an I/O failure left on HDF5's error stack (the file drivers record "errno = N"), 0 when there
// is none. Read it right after the failing call, before any other HDF5 call clears the stack.
int hdf5_failure_errno();

// A HINT naming the cause of an I/O error on a file in `dir`: a full disk (and how much is free there), a
// read-only filesystem, missing permission, an I/O error of the device, or the error's own text.
std::string io_failure_hint(int err, const std::string& dir);

}  // namespace dflash
