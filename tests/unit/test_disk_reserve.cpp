// metrics.h5's reserve and the cause named for an I/O failure (src/metrics/disk_reserve.h). The full-disk
// path itself runs end to end in tests/e2e/test_metrics_disk_full.sh (it needs a small tmpfs: root).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "data/h5_util.h"
#include "metrics/disk_reserve.h"

namespace dflash {
namespace {

std::string temp_dir() {
  std::string t = (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + std::string("/dflash-reserve.XXXXXX");
  return ::mkdtemp(t.data()) ? t : "";
}
off_t allocated_bytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_blocks * 512 : -1;
}

TEST(DiskReserve, HoldsAllocatedSpaceUntilReleasedAndComesBack) {
  const std::string dir = temp_dir(), path = dir + "/.metrics.h5.reserve";
  ASSERT_FALSE(dir.empty());
  DiskReserve r;
  ASSERT_EQ(r.create(path, 256 << 10), 0);
  EXPECT_GE(allocated_bytes(path), 256 << 10);  // allocated, not a sparse file
  r.release();
  EXPECT_EQ(allocated_bytes(path), -1);
  r.release();  // idempotent
  ASSERT_EQ(r.restore(), 0);
  EXPECT_GE(allocated_bytes(path), 256 << 10);
  { DiskReserve gone; ASSERT_EQ(gone.create(dir + "/other", 4096), 0); }
  EXPECT_EQ(allocated_bytes(dir + "/other"), -1);  // the destructor releases
  r.release();
  ::rmdir(dir.c_str());
}

TEST(DiskReserve, FailureIsAnErrnoAndLeavesNothing) {
  DiskReserve r;
  EXPECT_EQ(r.create("/nonexistent-dir-of-dflash/x.reserve", 4096), ENOENT);
}

TEST(IoFailureHint, NamesTheCause) {
  EXPECT_NE(io_failure_hint(ENOSPC, "/tmp").find("the disk is full: "), std::string::npos);
  EXPECT_NE(io_failure_hint(ENOSPC, "/tmp").find(" free on the filesystem of /tmp now; free space there"), std::string::npos);
  EXPECT_NE(io_failure_hint(EDQUOT, "/tmp").find("quota"), std::string::npos);
  EXPECT_NE(io_failure_hint(EROFS, "/tmp").find("read-only"), std::string::npos);
  EXPECT_NE(io_failure_hint(EACCES, "/tmp").find("no permission to write in /tmp"), std::string::npos);
  EXPECT_NE(io_failure_hint(EIO, "/tmp").find("I/O error"), std::string::npos);
  EXPECT_NE(io_failure_hint(0, "/tmp").find("unknown"), std::string::npos);
}

TEST(Hdf5FailureErrno, ReadsTheDriversErrno) {
  h5::quiet_errors();
  const hid_t f = H5Fcreate("/nonexistent-dir-of-dflash/m.h5", H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_LT(f, 0);
  EXPECT_EQ(hdf5_failure_errno(), ENOENT);
}

}  // namespace
}  // namespace dflash
