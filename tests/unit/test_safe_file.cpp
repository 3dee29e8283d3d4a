// Writes at fixed names in a directory others may write to (include/dflash/safe_file.h): a link planted at
// the name never redirects a write, temp names are not guessable, new files get the umask's mode. The e2e
// half (a job's --out with planted links, as root) is tests/e2e/test_out_symlinks.sh.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <hdf5.h>
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

TEST(SafeFile, RefusePlantedExitsTwo) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  write_text(dir + "/victim", "x");
  ASSERT_EQ(::symlink((dir + "/victim").c_str(), (dir + "/metrics.h5").c_str()), 0);
  refuse_planted(dir + "/none", EntryKind::File, "--out's entry");  // absent: nothing to say
  refuse_planted(dir, EntryKind::Directory, "--out's entry");       // what belongs there
  EXPECT_EXIT(refuse_planted(dir + "/metrics.h5", EntryKind::File, "--out's entry"), testing::ExitedWithCode(2),
              "is a symbolic link");
  ASSERT_EQ(::link((dir + "/victim").c_str(), (dir + "/train.log").c_str()), 0);
  EXPECT_EXIT(refuse_planted(dir + "/train.log", EntryKind::File, "--out's entry"), testing::ExitedWithCode(2),
              "more than one hard link");
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  EXPECT_EXIT(refuse_planted(dir + "/fifo", EntryKind::File, "--out's entry"), testing::ExitedWithCode(2),
              "not a regular file");
  EXPECT_EXIT(refuse_planted(dir + "/fifo", EntryKind::Directory, "--out's entry"), testing::ExitedWithCode(2),
              "is not a directory");
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

// A dataset whose /tokens is replaced by `plant` (a link or an array stored outside the file).
std::string dataset_with(const std::string& dir, const std::string& name, void (*plant)(hid_t, const std::string&)) {
  TokenRecords r;
  r.add({1, 2, 3}, {0, 1, 1});
  const std::string path = dir + "/" + name;
  write_token_dataset(path, r, 10, "t");
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  EXPECT_GE(f, 0);
  EXPECT_GE(H5Ldelete(f, "tokens", H5P_DEFAULT), 0);
  plant(f, dir);
  H5Fclose(f);
  return path;
}

TEST(SafeFileDeath, DatasetsReadOnlyTheirOwnBytes) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  TokenRecords r;
  r.add({1, 2, 3}, {0, 1, 1});
  write_token_dataset(dir + "/other.h5", r, 10, "t");
  const std::string ext = dataset_with(dir, "ext.h5", [](hid_t f, const std::string& d) {
    H5Lcreate_external((d + "/other.h5").c_str(), "/tokens", f, "tokens", H5P_DEFAULT, H5P_DEFAULT);
  });
  EXPECT_EXIT(TokenDataset(ext, 10), testing::ExitedWithCode(3), "is a soft or external link");
  const std::string soft = dataset_with(dir, "soft.h5", [](hid_t f, const std::string&) {
    H5Lcreate_soft("/offsets", f, "tokens", H5P_DEFAULT, H5P_DEFAULT);
  });
  EXPECT_EXIT(TokenDataset(soft, 10), testing::ExitedWithCode(3), "is a soft or external link");
  const std::string stored = dataset_with(dir, "stored.h5", [](hid_t f, const std::string& d) {
    hsize_t n = 3;
    hid_t space = H5Screate_simple(1, &n, nullptr), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, (d + "/outside.bin").c_str(), 0, 3 * sizeof(int32_t));
    hid_t ds = H5Dcreate2(f, "tokens", H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    const int32_t v[3] = {1, 2, 3};
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
  });
  EXPECT_EXIT(TokenDataset(stored, 10), testing::ExitedWithCode(3), "keeps its data outside the file");
  TokenDataset fine(dir + "/other.h5", 10);  // the plain one still opens
  EXPECT_EQ(fine.num_tokens(), 3);
}

}  // namespace
}  // namespace dflash
