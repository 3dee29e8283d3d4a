// Reads of fixed names under a run directory (include/dflash/safe_file.h: read_own_text, list_own_dir,
// stat_own_entry, LinkPolicy::Refuse) and the checkpoint discovery built on them (src/checkpoint/
// checkpoint_io.cpp): a link, FIFO or directory planted there is refused or skipped, never followed, and no
// open blocks. The e2e half, as root with real jobs: tests/e2e/test_out_planted_resume.sh.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "dflash/checkpoint.h"
#include "dflash/error.h"
#include "dflash/safe_dir.h"
#include "dflash/safe_file.h"
#include "dflash/safetensors.h"
#include "io/json_file.h"

namespace dflash {
namespace {

std::string temp_dir() {
  std::string t = (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + std::string("/dflash-read.XXXXXX");
  return ::mkdtemp(t.data()) ? t : "";
}
void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(SafeRead, ReadOwnTextRefusesLinksFifosAndHardLinksUnlessAccepted) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  const std::string victim = dir + "/victim", name = dir + "/next-topology";
  write_text(victim, "precious\n");
  std::string text;
  ASSERT_EQ(::symlink(victim.c_str(), name.c_str()), 0);
  EXPECT_EQ(read_own_text(name, 256, HardLinks::Accept, &text), ELOOP);
  EXPECT_TRUE(text.empty());
  ::unlink(name.c_str());
  ASSERT_EQ(::link(victim.c_str(), name.c_str()), 0);
  EXPECT_EQ(read_own_text(name, 256, HardLinks::Refuse, &text), EMLINK);
  EXPECT_EQ(read_own_text(name, 256, HardLinks::Accept, &text), 0);
  EXPECT_EQ(text, "precious\n");
  EXPECT_EQ(read_own_text(name, 4, HardLinks::Accept, &text), EFBIG);
  ::unlink(name.c_str());
  ASSERT_EQ(::mkfifo(name.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(read_own_text(name, 256, HardLinks::Accept, &text), EINVAL);  // never blocks on the FIFO
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ::unlink(name.c_str());
  ASSERT_EQ(::mkdir(name.c_str(), 0700), 0);
  EXPECT_EQ(read_own_text(name, 256, HardLinks::Accept, &text), EINVAL);
}

TEST(SafeRead, ListOwnDirGivesEachEntrysOwnType) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  ASSERT_EQ(::mkdir((dir + "/real").c_str(), 0700), 0);
  write_text(dir + "/file", "x");
  ASSERT_EQ(::symlink((dir + "/real").c_str(), (dir + "/link").c_str()), 0);
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  std::vector<DirEntry> entries;
  ASSERT_EQ(list_own_dir(dir, &entries), 0);
  std::map<std::string, mode_t> types;
  for (const DirEntry& e : entries) types[e.name] = e.type;
  EXPECT_EQ(types.size(), 4u);
  EXPECT_EQ(types["real"], static_cast<mode_t>(S_IFDIR));
  EXPECT_EQ(types["file"], static_cast<mode_t>(S_IFREG));
  EXPECT_EQ(types["link"], static_cast<mode_t>(S_IFLNK));  // a link to a directory is a link, not followed
  EXPECT_EQ(types["fifo"], static_cast<mode_t>(S_IFIFO));
}

TEST(SafeRead, UnderAHeldDirectoryALinkOnTheWayIsNeverFollowed) {
  const std::string dir = temp_dir(), outside = temp_dir();
  ASSERT_FALSE(dir.empty());
  ASSERT_FALSE(outside.empty());
  write_text(outside + "/manifest.json", "{\"step\": 1}");
  hold_run_dir(dir, "--out");
  ASSERT_EQ(::symlink(outside.c_str(), (dir + "/checkpoints").c_str()), 0);
  struct stat st;
  EXPECT_EQ(stat_own_entry(dir + "/checkpoints/manifest.json", &st), ELOOP);
  std::vector<DirEntry> entries;
  EXPECT_EQ(list_own_dir(dir + "/checkpoints", &entries), ELOOP);
  const JsonFile refused = try_read_json_file(dir + "/checkpoints/manifest.json", JsonExpect::Object, LinkPolicy::Refuse);
  EXPECT_EQ(refused.status, JsonFileStatus::Unreadable);
  EXPECT_NE(refused.error.find("symbolic link"), std::string::npos) << refused.error;
  // The held directory itself, listed twice: each listing reads it from its start (the held descriptor's
  // offset is not shared with the listings).
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(list_own_dir(dir, &entries), 0);
    ASSERT_EQ(entries.size(), 1u) << "listing " << i;
    EXPECT_EQ(entries[0].name, "checkpoints");
  }
  // The user's own path (LinkPolicy::Follow, the default) is read through its links, as before.
  EXPECT_TRUE(try_read_json_file(dir + "/checkpoints/manifest.json").ok());
}

TEST(SafeReadDeath, AFifoGivenAsASafetensorsFileIsRefusedNotWaitedOn) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  ASSERT_EQ(::mkfifo((dir + "/model.safetensors").c_str(), 0600), 0);
  EXPECT_EXIT(SafetensorsFile f(dir + "/model.safetensors"), testing::ExitedWithCode(static_cast<int>(ExitCode::BadInput)),
              "not a regular file");
}

TEST(SafeReadDeath, AFifoWhereTheJobMakesADirectoryIsRefusedNamingIt) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  hold_run_dir(dir, "--out");
  ASSERT_EQ(::mkfifo((dir + "/drafter").c_str(), 0600), 0);  // swapped in before the export
  EXPECT_EXIT(create_dirs(dir + "/drafter", "-"), testing::ExitedWithCode(static_cast<int>(ExitCode::BadOptions)),
              "drafter: it, or a directory on its way, is not a directory");
}

TEST(SafeRead, ASetAsideRenameNeverReplacesAnEntry) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  write_text(dir + "/metrics.h5", "ours");
  ASSERT_EQ(::symlink("/nonexistent", (dir + "/metrics.1.h5").c_str()), 0);  // planted at the set-aside name
  EXPECT_EQ(rename_path(dir + "/metrics.h5", dir + "/metrics.1.h5", RenameOver::Never), EEXIST);
  struct stat st;
  EXPECT_EQ(::lstat((dir + "/metrics.1.h5").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));  // left as it was
  EXPECT_EQ(rename_path(dir + "/metrics.h5", dir + "/metrics.2.h5", RenameOver::Never), 0);
}

TEST(SafeReadDeath, ADirectoryWhereTheJobWritesAFileIsNamedAsOne) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  ASSERT_EQ(::mkdir((dir + "/.dflash-complete").c_str(), 0700), 0);  // swapped in before the run's end
  ASSERT_EQ(::mkdir((dir + "/.dflash-complete/x").c_str(), 0700), 0);
  EXPECT_EXIT(write_file_atomic(dir + "/.dflash-complete", "{}\n"),
              testing::ExitedWithCode(static_cast<int>(ExitCode::BadOptions)), ".dflash-complete: it is a directory");
}

// A checkpoint to plant around: one real step directory saved by save_checkpoint.
std::string saved_checkpoint(const std::string& ckpt_dir, int64_t step) {
  static std::vector<float> master(8, 0.5f), m(8, 0.0f), v(8, 0.0f);
  CheckpointState st;
  st.step = step;
  st.schedule = nlohmann::json::object();
  st.rng_states = {"rng"};
  st.options = {{"loss", "ce"}};
  const CheckpointTensors t{cpu_view(master.data(), {8}), cpu_view(m.data(), {8}), cpu_view(v.data(), {8})};
  CheckpointSaveOptions opt;
  opt.keep_last = 3;
  return save_checkpoint(ckpt_dir, st, t, opt);
}

TEST(SafeRead, DiscoverySkipsAStepDirectoryThatIsALink) {
  const std::string outside = temp_dir(), dir = temp_dir();
  ASSERT_FALSE(outside.empty());
  ASSERT_FALSE(dir.empty());
  const std::string newer = saved_checkpoint(outside, 9);  // a "newer checkpoint" elsewhere
  const std::string own = saved_checkpoint(dir, 2);
  ASSERT_EQ(::symlink(newer.c_str(), (dir + "/step-00000009").c_str()), 0);
  EXPECT_EQ(find_latest_checkpoint(dir), own);
}

TEST(SafeReadDeath, AManifestThatIsALinkIsDamageNamingIt) {
  const std::string outside = temp_dir(), dir = temp_dir();
  ASSERT_FALSE(outside.empty());
  ASSERT_FALSE(dir.empty());
  const std::string there = saved_checkpoint(outside, 4), here = saved_checkpoint(dir, 4);
  ASSERT_EQ(::unlink((here + "/manifest.json").c_str()), 0);
  ASSERT_EQ(::symlink((there + "/manifest.json").c_str(), (here + "/manifest.json").c_str()), 0);
  EXPECT_FALSE(checkpoint_is_complete(here));
  EXPECT_EXIT(find_latest_checkpoint(dir), testing::ExitedWithCode(static_cast<int>(ExitCode::BadInput)),
              "manifest.json: it is a symbolic link");
}

TEST(SafeReadDeath, AStateFileThatIsAFifoIsDamageAndNeverBlocks) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  const std::string here = saved_checkpoint(dir, 4);
  ASSERT_EQ(::unlink((here + "/state.safetensors").c_str()), 0);
  ASSERT_EQ(::mkfifo((here + "/state.safetensors").c_str(), 0600), 0);
  EXPECT_EXIT(find_latest_checkpoint(dir), testing::ExitedWithCode(static_cast<int>(ExitCode::BadInput)),
              "state.safetensors: it is not a regular file");
}

}  // namespace
}  // namespace dflash
