// Writes at fixed names in a directory others may write to (include/dflash/safe_file.h): a link planted at
// the name never redirects a write, temp names are not guessable, new files get the umask's mode. The e2e
// half (a job's --out with planted links, as root) is tests/e2e/test_out_symlinks.sh.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "dflash/data.h"
#include "dflash/safe_file.h"
#include "metrics/disk_reserve.h"

namespace dflash {
namespace {

std::string temp_dir() {
  std::string t = (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + std::string("/dflash-safe.XXXXXX");
  return ::mkdtemp(t.data()) ? t : "";
}
void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
mode_t mode_of(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 0777) : 0;
}
bool is_link(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

// Sets the umask for one test and puts the old one back.
struct ScopedUmask {
  explicit ScopedUmask(mode_t m) : old(::umask(m)) {}
  ~ScopedUmask() { ::umask(old); }
  mode_t old;
};

TEST(SafeFile, OpenOwnFileRefusesSymlinksHardLinksAndNonRegularFiles) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  const std::string victim = dir + "/victim", name = dir + "/.dflash.lock";
  write_text(victim, "precious\n");
  ASSERT_EQ(::symlink(victim.c_str(), name.c_str()), 0);
  errno = 0;
  EXPECT_EQ(open_own_file(name, O_RDWR | O_CREAT), -1);
  EXPECT_EQ(errno, ELOOP);
  EXPECT_NE(own_file_error(ELOOP).find("symbolic link"), std::string::npos);
  ::unlink(name.c_str());
  ASSERT_EQ(::link(victim.c_str(), name.c_str()), 0);
  EXPECT_EQ(open_own_file(name, O_RDWR | O_CREAT), -1);
  EXPECT_EQ(errno, EMLINK);
  ::unlink(name.c_str());
  ASSERT_EQ(::mkfifo(name.c_str(), 0600), 0);
  EXPECT_EQ(open_own_file(name, O_RDWR | O_CREAT), -1);  // O_RDWR: a FIFO opens without blocking on Linux
  EXPECT_EQ(errno, EINVAL);
  ::unlink(name.c_str());
  const int fd = open_own_file(name, O_RDWR | O_CREAT);  // a new file of its own: fine
  EXPECT_GE(fd, 0);
  if (fd >= 0) ::close(fd);
  EXPECT_EQ(read_text(victim), "precious\n");
}

TEST(SafeFile, UmaskIsReadWithoutChangingIt) {
  ScopedUmask u(027);
  EXPECT_EQ(current_umask(), 027u);
  EXPECT_EQ(current_umask(), 027u);  // reading did not reset it
  EXPECT_EQ(new_file_mode(), 0640u);
  ::umask(0);
  EXPECT_EQ(new_file_mode(), 0666u);
}

TEST(SafeFile, TempNamesAreNewUnguessableFilesWithTheUmasksMode) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  ScopedUmask u(007);
  TempFile a = create_temp_next_to(dir + "/out.h5"), b = create_temp_next_to(dir + "/out.h5");
  ASSERT_GE(a.fd, 0);
  ASSERT_GE(b.fd, 0);
  ::close(a.fd);
  ::close(b.fd);
  EXPECT_NE(a.path, b.path);
  EXPECT_EQ(a.path.find(std::to_string(::getpid())), std::string::npos) << a.path;
  EXPECT_EQ(mode_of(a.path), 0660u);
}

TEST(SafeFile, SameFileThroughALink) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  write_text(dir + "/in.jsonl", "{}\n");
  ASSERT_EQ(::symlink((dir + "/in.jsonl").c_str(), (dir + "/alias").c_str()), 0);
  EXPECT_TRUE(is_same_file(dir + "/in.jsonl", dir + "/alias"));
  EXPECT_FALSE(is_same_file(dir + "/in.jsonl", dir + "/missing"));
}

TEST(SafeFile, RefuseSymlinkExitsTwo) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  write_text(dir + "/victim", "x");
  ASSERT_EQ(::symlink((dir + "/victim").c_str(), (dir + "/metrics.h5").c_str()), 0);
  refuse_symlink(dir + "/victim", "--out's entry");  // a regular file: nothing to say
  refuse_symlink(dir + "/none", "--out's entry");    // absent: nothing to say
  EXPECT_EXIT(refuse_symlink(dir + "/metrics.h5", "--out's entry"), testing::ExitedWithCode(2), "is a symbolic link");
}

TEST(SafeFile, DiskReserveReplacesAPlantedLinkInsteadOfWritingThroughIt) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  const std::string victim = dir + "/victim", path = dir + "/.metrics.h5.reserve";
  write_text(victim, "precious\n");
  ASSERT_EQ(::symlink(victim.c_str(), path.c_str()), 0);
  DiskReserve r;
  ASSERT_EQ(r.create(path, 64 << 10), 0);
  EXPECT_FALSE(is_link(path));
  EXPECT_EQ(read_text(victim), "precious\n");
  r.release();
}

TEST(SafeFile, DatasetWriterIgnoresALinkAtThePidTempName) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  const std::string victim = dir + "/victim", out = dir + "/out.h5";
  write_text(victim, "precious\n");
  // The name the writer used to take (OUT.tmp.<pid>): a link there must not be followed.
  ASSERT_EQ(::symlink(victim.c_str(), (out + ".tmp." + std::to_string(::getpid())).c_str()), 0);
  ScopedUmask u(027);
  TokenRecords r;
  r.add({1, 2, 3}, {0, 1, 1});
  write_token_dataset(out, r, 10, "t");
  EXPECT_EQ(read_text(victim), "precious\n");
  EXPECT_FALSE(is_link(out));
  EXPECT_EQ(mode_of(out), 0640u);
  TokenDataset ds(out, 10);
  EXPECT_EQ(ds.num_tokens(), 3);
}

}  // namespace
}  // namespace dflash
