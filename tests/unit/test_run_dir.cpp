// What a run leaves in --out besides metrics and checkpoints (src/runtime/run_dir.h): the record of a run
// that ended with its export (issue 48 item 6), and an earlier export set aside by a fresh run (item 7).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "runtime/run_dir.h"
#include "test_support.h"

using namespace dflash;
namespace fs = std::filesystem;

namespace {
void export_into(const std::string& dir, const std::string& text) {
  fs::create_directories(dir);
  std::ofstream(dir + "/model.safetensors") << text;
}
std::string read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST(RunDir, CompleteOnlyForTheRecordedRunStepAndAnExport) {
  const std::string out = test::make_temp_dir("dflash_run_dir_");
  EXPECT_EQ(run_state_at(out, "run-a", 4), RunState::GoesOn);  // no record
  record_run_complete(out, "run-a", 4);
  EXPECT_EQ(run_state_at(out, "run-a", 4), RunState::GoesOn);  // no export
  export_into(out + "/drafter", "weights");
  EXPECT_EQ(run_state_at(out, "run-a", 4), RunState::AlreadyComplete);
  EXPECT_EQ(run_state_at(out, "run-a", 2), RunState::GoesOn);  // an older checkpoint of the run: trains on
  EXPECT_EQ(run_state_at(out, "run-b", 4), RunState::GoesOn);  // another run (a fresh one in the same --out)
  EXPECT_EQ(run_state_at(out, "", 4), RunState::GoesOn);       // a checkpoint without a run id
}

TEST(RunDir, ARecordThatIsNoRegularFileIsNotReadAndDoesNotBlock) {
  const std::string out = test::make_temp_dir("dflash_run_dir_");
  export_into(out + "/drafter", "weights");
  ASSERT_EQ(::mkfifo((out + "/.dflash-complete").c_str(), 0600), 0);
  EXPECT_EQ(run_state_at(out, "run-a", 4), RunState::GoesOn);  // returns at once: a FIFO is not opened for reading
  fs::remove(out + "/.dflash-complete");
  const std::string elsewhere = test::make_temp_dir("dflash_run_dir_");
  record_run_complete(elsewhere, "run-a", 4);
  fs::create_symlink(elsewhere + "/.dflash-complete", out + "/.dflash-complete");
  EXPECT_EQ(run_state_at(out, "run-a", 4), RunState::GoesOn);  // a link is not followed
}

TEST(RunDir, AFreshRunSetsTheEarlierExportAside) {
  const std::string out = test::make_temp_dir("dflash_run_dir_");
  set_aside_previous_drafter(out);  // nothing there: nothing to do
  EXPECT_FALSE(fs::exists(out + "/drafter.1"));
  fs::create_directories(out + "/drafter");
  set_aside_previous_drafter(out);  // empty (a mount point, a failed start): left
  EXPECT_TRUE(fs::is_directory(out + "/drafter"));
  EXPECT_FALSE(fs::exists(out + "/drafter.1"));
  export_into(out + "/drafter", "first");
  set_aside_previous_drafter(out);
  EXPECT_EQ(read(out + "/drafter.1/model.safetensors"), "first");
  EXPECT_FALSE(fs::exists(out + "/drafter"));
  export_into(out + "/drafter", "second");
  set_aside_previous_drafter(out);
  EXPECT_EQ(read(out + "/drafter.2/model.safetensors"), "second");
  EXPECT_EQ(read(out + "/drafter.1/model.safetensors"), "first");
  std::ofstream(out + "/drafter") << "a file in the way";  // not an export: left for the export to name
  set_aside_previous_drafter(out);
  EXPECT_TRUE(fs::is_regular_file(out + "/drafter"));
  EXPECT_FALSE(fs::exists(out + "/drafter.3"));
}
