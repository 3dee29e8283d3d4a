// A dataset changed under a running job (truncated, rewritten in place, replaced) is caught at the next
// record read (exit 3), instead of training on the zeros HDF5 returns past the end of a truncated file.
// Also: the counts of loss tokens and anchor positions the job's "nothing to train on" check uses.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dflash/data.h"
#include "test_support.h"

using namespace dflash;
namespace fs = std::filesystem;

namespace {

// Three records of 40 tokens; record 1's mask 0, record 2's alternating (loss tokens, no anchor).
std::string write_dataset(const std::string& dir) {
  TokenRecords recs;
  for (int r = 0; r < 3; ++r) {
    std::vector<int32_t> ids(40);
    std::vector<uint8_t> mask(40, r == 1 ? 0 : 1);
    for (int i = 0; i < 40; ++i) {
      ids[i] = (r * 40 + i) % 97;
      if (r == 2) mask[i] = i % 2;
    }
    recs.add(ids, mask);
  }
  const std::string path = dir + "/data.h5";
  write_token_dataset(path, recs, 100, "test");
  return path;
}

void read_first(const TokenDataset& ds) {
  std::vector<int32_t> t;
  std::vector<uint8_t> m;
  ds.read_record(0, t, m);
}

}  // namespace

TEST(DatasetCounts, LossTokensAndAnchorPositionsStayInsideRecords) {
  const TokenDataset ds(write_dataset(test::make_temp_dir("dflash-data-changed-")), 100);
  EXPECT_EQ(ds.loss_tokens(), 40 + 0 + 20);
  // Record 0: 39 pairs; record 1: none; record 2: none (alternating); and no pair across records 0|1.
  EXPECT_EQ(ds.anchor_positions(), 39);
}

TEST(DatasetChangedDeathTest, TruncatedUnderTheReaderIsBadInput) {
  const std::string path = write_dataset(test::make_temp_dir("dflash-data-changed-"));
  const TokenDataset ds(path, 100);
  read_first(ds);  // unchanged: reads
  fs::resize_file(path, fs::file_size(path) - 200);
  EXPECT_EXIT(read_first(ds), testing::ExitedWithCode(3), "changed size from [0-9]+ to [0-9]+ bytes while this job reads it");
}

TEST(DatasetChangedDeathTest, RewrittenInPlaceIsBadInput) {
  const std::string path = write_dataset(test::make_temp_dir("dflash-data-changed-"));
  const TokenDataset ds(path, 100);
  // Same size, new bytes: only the modification time tells.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.write("0123456789", 10);
  }
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const struct timespec later[2] = {st.st_atim, {st.st_mtim.tv_sec + 1, st.st_mtim.tv_nsec}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), later, 0), 0);  // coarse-mtime filesystems: make it differ
  EXPECT_EXIT(read_first(ds), testing::ExitedWithCode(3), "was rewritten \\(its modification time changed\\)");
}

TEST(DatasetChangedDeathTest, ReplacedOrRemovedIsBadInput) {
  const std::string dir = test::make_temp_dir("dflash-data-changed-");
  const std::string path = write_dataset(dir);
  const TokenDataset ds(path, 100);
  // write_token_dataset renames a new file over the old one: another inode under the same name.
  fs::copy_file(path, dir + "/copy.h5");
  fs::rename(dir + "/copy.h5", path);
  EXPECT_EXIT(read_first(ds), testing::ExitedWithCode(3), "was replaced by another file");
  fs::remove(path);
  EXPECT_EXIT(read_first(ds), testing::ExitedWithCode(3), "was removed");
}
