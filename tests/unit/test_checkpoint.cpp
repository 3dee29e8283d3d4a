// Checkpoint module: --checkpoint-every, resume invariants, save/load round trip, discovery of the
// newest complete checkpoint (incomplete, truncated and corrupt ones), keep-last-K, stop signals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>

#include "dflash/checkpoint.h"
#include "dflash/error.h"

namespace fs = std::filesystem;
using namespace dflash;
using testing::ExitedWithCode;

namespace {

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::path(testing::TempDir()) / ("dflash_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

DataPosition position_at(int target, int targets, int64_t batches) {
  DataPosition p;
  p.epoch = batches / 10;
  p.cursor = batches % 10 * 3;
  p.batches = batches;
  p.seed = 1234;
  p.shard_index = target;
  p.num_shards = targets;
  return p;
}

// A drafter state of n parameters, filled from `seed`.
struct FakeState {
  std::vector<float> master, m, v;
  CheckpointState st;
  FakeState(size_t n, uint32_t seed, int64_t step) : master(n), m(n), v(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g;
    for (size_t i = 0; i < n; ++i) {
      master[i] = g(rng);
      m[i] = g(rng) * 1e-3f;
      v[i] = std::abs(g(rng)) * 1e-6f;
    }
    st.step = step;
    st.schedule = {{"epoch_progress", 0.25 * static_cast<double>(step)}, {"tokens", step * 1000}};
    for (int t = 0; t < 2; ++t) {
      DataResumePoint p;
      p.position = position_at(t, 2, step + t);
      p.done_after = {{step + t + 2, position_at(t, 2, step + t + 3)}};
      st.data.push_back(p);
    }
    std::ostringstream engine;
    engine << rng;
    // Binary bytes (a NUL inside), an mt19937 text state and an empty state.
    st.rng_states = {std::string("\x01\x00\xff", 3) + std::to_string(seed), engine.str(), ""};
    st.options = {{"loss", "ce"}, {"topology", "1-1"}, {"seed", std::to_string(seed)}};
  }
  CheckpointTensors views() {
    const int64_t n = static_cast<int64_t>(master.size());
    return {cpu_view(master.data(), {n}), cpu_view(m.data(), {n}), cpu_view(v.data(), {n})};
  }
};

std::string save(const std::string& dir, FakeState& s, int keep = 3) {
  CheckpointSaveOptions opt;
  opt.keep_last = keep;
  return save_checkpoint(dir, s.st, s.views(), opt);
}

void flip_byte(const std::string& path, long offset_from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-offset_from_end, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-offset_from_end, std::ios::end);
  f.put(static_cast<char>(c ^ 0x10));
}

}  // namespace

// ---- --checkpoint-every ------------------------------------------------------------------------

TEST(CheckpointEvery, ParsesStepsMinutesAndOff) {
  EXPECT_EQ(parse_checkpoint_every("").unit, CheckpointUnit::Off);
  EXPECT_EQ(parse_checkpoint_every("0").unit, CheckpointUnit::Off);
  CheckpointEvery s = parse_checkpoint_every("500");
  EXPECT_EQ(s.unit, CheckpointUnit::Steps);
  EXPECT_EQ(s.steps, 500);
  CheckpointEvery m = parse_checkpoint_every("1.5m");
  EXPECT_EQ(m.unit, CheckpointUnit::Minutes);
  EXPECT_DOUBLE_EQ(m.minutes, 1.5);
  EXPECT_EQ(m.to_string(), "1.5m");
  EXPECT_EQ(s.to_string(), "500");
}

TEST(CheckpointEvery, RejectsGarbage) {
  for (const char* bad : {"abc", "-3", "5s", "m", "10mm", "3.5", "0m"})
    EXPECT_EXIT(parse_checkpoint_every(bad), ExitedWithCode(2), "--checkpoint-every") << bad;
}

TEST(CheckpointTimer, StepsAreDueOnMultiples) {
  CheckpointTimer t(parse_checkpoint_every("3"));
  std::vector<int64_t> due;
  for (int64_t s = 0; s <= 10; ++s)
    if (t.due(s)) due.push_back(s);
  EXPECT_EQ(due, (std::vector<int64_t>{3, 6, 9}));
  CheckpointTimer off(parse_checkpoint_every("0"));
  EXPECT_FALSE(off.due(3));
  CheckpointTimer minutes(parse_checkpoint_every("0.001m"));  // 60 ms
  EXPECT_FALSE(minutes.due(1));
  ::usleep(80 * 1000);
  EXPECT_TRUE(minutes.due(2));
  minutes.saved();
  EXPECT_FALSE(minutes.due(3));
}

// ---- resume invariants ---------------------------------------------------------------------------

TEST(ResumeInvariants, IntervalsAndPathsMayChangeModelAndObjectiveMayNot) {
  const std::vector<std::pair<std::string, std::string>> resolved = {
      {"target", "/m/qwen3-8b"}, {"topology", "7-1"}, {"loss", "kl"}, {"log-every", "10"},
      {"checkpoint-every", "30m"}, {"out", "/runs/a"}, {"inject-fail-rank", "-1"}, {"seed", "1"}};
  const OptionMap inv = resume_invariants(resolved);
  EXPECT_EQ(inv.size(), 4u);
  EXPECT_TRUE(inv.count("target") && inv.count("topology") && inv.count("loss") && inv.count("seed"));
  EXPECT_FALSE(inv.count("log-every") || inv.count("out") || inv.count("checkpoint-every"));

  auto changed = resolved;
  changed[3].second = "1";  // log-every
  changed[5].second = "/runs/b";
  EXPECT_EQ(options_hash(resume_invariants(changed)), options_hash(inv));
  check_resume_compatible(inv, resume_invariants(changed), "ckpt");  // returns: accepted
}

TEST(ResumeInvariants, ChangedObjectiveOrTopologyIsRefusedNamingIt) {
  const OptionMap saved = {{"loss", "ce"}, {"topology", "7-1"}, {"target", "/m/a"}};
  OptionMap now = saved;
  now["loss"] = "kl";
  EXPECT_NE(options_hash(now), options_hash(saved));
  EXPECT_EXIT(check_resume_compatible(saved, now, "ckpt"), ExitedWithCode(2), "--loss: saved 'ce', now 'kl'");
  now = saved;
  now["topology"] = "6-2";
  EXPECT_EXIT(check_resume_compatible(saved, now, "ckpt"), ExitedWithCode(2), "--topology: saved '7-1'");
  now = saved;
  now.erase("target");
  now["draft-layers"] = "3";
  EXPECT_EXIT(check_resume_compatible(saved, now, "ckpt"), ExitedWithCode(2), "2 option");
}

// --optimizer-state may change on a resume (a checkpoint holds the state in fp32 either way, and either mode
// loads it: docs/checkpoint.md "Changing the optimizer state"); it is no invariant, so a checkpoint from before
// the option existed resumes in either mode too.
TEST(ResumeInvariants, OptimizerStateMayChange) {
  const OptionMap fp32 = resume_invariants({{"loss", "ce"}, {"optimizer-state", "fp32"}});
  const OptionMap bf16 = resume_invariants({{"loss", "ce"}, {"optimizer-state", "bf16"}});
  EXPECT_FALSE(fp32.count("optimizer-state"));
  EXPECT_EQ(options_hash(fp32), options_hash(bf16));
  check_resume_compatible(fp32, bf16, "ckpt");  // returns: accepted
  check_resume_compatible({{"loss", "ce"}}, bf16, "ckpt");
}

// A resume on another split (docs/checkpoint.md "Changing the split"): the topology, the world size and the
// micro-batches per step may differ; everything else is still refused.
TEST(ResumeInvariants, AnotherSplitMayChangeTheTopologyOnly) {
  const OptionMap saved = {{"loss", "ce"}, {"topology", "7-1"}, {"world-size", "8"}, {"grad-accum", "4"}};
  OptionMap now = saved;
  now["topology"] = "6-2";
  now["grad-accum"] = "2";
  check_resume_compatible(saved, now, "ckpt", ResumeSplit::Changed);  // returns: accepted
  EXPECT_EXIT(check_resume_compatible(saved, now, "ckpt", ResumeSplit::Same), ExitedWithCode(2), "--topology: saved '7-1'");
  now["world-size"] = "16";
  now["loss"] = "kl";
  // Only the loss is named: "1 option(s)".
  EXPECT_EXIT(check_resume_compatible(saved, now, "ckpt", ResumeSplit::Changed), ExitedWithCode(2), "from ckpt: 1 option");
  EXPECT_EXIT(check_resume_compatible(saved, now, "ckpt", ResumeSplit::Changed), ExitedWithCode(2), "--loss: saved 'ce', now 'kl'");
}

// A checkpoint written before an option existed lacks it: resuming with the value that means what it was
// trained with is accepted, any other value is refused as a change.
TEST(ResumeInvariants, OptionNewerThanTheCheckpointAtItsOldMeaningIsAccepted) {
  const OptionMap saved = {{"loss", "ce"}, {"topology", "7-1"}};
  OptionMap now = saved;
  now["anchors-per-record"] = "0";
  now["grad-accum"] = "1";
  now["global-batch-tokens"] = "0";
  now["adam-beta2"] = "0.95";  // the optimizer's settings before the reference's became the defaults
  now["weight-decay"] = "0.01";
  now["min-lr-ratio"] = "0.1";
  check_resume_compatible(saved, now, "ckpt");  // returns: accepted
  now["adam-beta2"] = "0.999";  // today's default is a change for such a checkpoint
  EXPECT_EXIT(check_resume_compatible(saved, now, "ckpt"), ExitedWithCode(2),
              "--adam-beta2: not in the checkpoint, now '0.999'");
  now["adam-beta2"] = "0.95";
  now["grad-accum"] = "2";
  EXPECT_EXIT(check_resume_compatible(saved, now, "ckpt"), ExitedWithCode(2),
              "--grad-accum: not in the checkpoint, now '2'");
  now = saved;
  now["draft-layers"] = "5";  // not an option added later: a change
  EXPECT_EXIT(check_resume_compatible(saved, now, "ckpt"), ExitedWithCode(2), "--draft-layers: not in the checkpoint");
}

// ---- save / load -------------------------------------------------------------------------------

TEST(Checkpoint, RoundTripIsBitExact) {
  const std::string dir = fresh_dir("roundtrip");
  FakeState a(1003, 7, 42);
  const std::string step_dir = save(dir, a);
  EXPECT_EQ(step_dir, checkpoint_step_dir(dir, 42));
  EXPECT_EQ(fs::path(step_dir).filename().string(), "step-00000042");
  EXPECT_TRUE(checkpoint_is_complete(step_dir));

  const CheckpointState st = read_checkpoint_state(step_dir);
  EXPECT_EQ(st.step, 42);
  EXPECT_EQ(st.schedule, a.st.schedule);
  ASSERT_EQ(st.data.size(), a.st.data.size());
  for (size_t t = 0; t < st.data.size(); ++t) {
    EXPECT_EQ(st.data[t].position, a.st.data[t].position);
    EXPECT_EQ(st.data[t].done_after, a.st.data[t].done_after);
  }
  EXPECT_EQ(st.rng_states, a.st.rng_states);
  EXPECT_EQ(st.options, a.st.options);

  FakeState b(1003, 99, 0);  // different contents, same length
  load_checkpoint_tensors(step_dir, b.views());
  EXPECT_EQ(0, std::memcmp(a.master.data(), b.master.data(), a.master.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.m.data(), b.m.data(), a.m.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.v.data(), b.v.data(), a.v.size() * 4));
}

TEST(Checkpoint, AlsoWriteFilesArePartOfTheCommit) {
  const std::string dir = fresh_dir("alsowrite");
  FakeState a(64, 1, 5);
  CheckpointSaveOptions opt;
  opt.also_write = [](const std::string& step_dir) {
    fs::create_directories(step_dir + "/drafter");
    std::ofstream(step_dir + "/drafter/config.json") << "{\"block_size\": 16}\n";
  };
  const std::string step_dir = save_checkpoint(dir, a.st, a.views(), opt);
  EXPECT_TRUE(checkpoint_is_complete(step_dir));
  std::ofstream(step_dir + "/drafter/config.json", std::ios::app) << " ";  // size changes after the commit
  std::string why;
  EXPECT_FALSE(checkpoint_is_complete(step_dir, &why));
  EXPECT_NE(why.find("drafter/config.json"), std::string::npos) << why;
}

TEST(Checkpoint, KeepsTheLastK) {
  const std::string dir = fresh_dir("keep");
  for (int64_t s = 1; s <= 5; ++s) {
    FakeState a(32, static_cast<uint32_t>(s), s * 10);
    save(dir, a, /*keep=*/2);
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000040", "step-00000050"}));
  EXPECT_EQ(find_latest_checkpoint(dir), checkpoint_step_dir(dir, 50));
}

// ---- discovery never picks an incomplete checkpoint --------------------------------------------

TEST(Checkpoint, HalfWrittenCheckpointsAreNeverPicked) {
  const std::string dir = fresh_dir("halfwritten");
  std::string s[4];
  for (int i = 1; i <= 3; ++i) {
    FakeState a(256, static_cast<uint32_t>(i), 100 * i);
    s[i] = save(dir, a, /*keep=*/10);
  }
  // Step 200 and 300: saves interrupted before their manifest (the state file is there, no manifest).
  fs::remove(s[2] + "/manifest.json");
  fs::remove(s[3] + "/manifest.json");
  // A stray directory name and a temp file are ignored.
  fs::create_directories(dir + "/step-abc");
  std::ofstream(dir + "/step-00000500.tmp.xyz") << "junk";

  EXPECT_EQ(find_latest_checkpoint(dir), s[1]);
  EXPECT_EQ(resolve_resume("auto", dir), s[1]);
  EXPECT_EXIT(resolve_resume(s[2], dir), ExitedWithCode(3), "not a complete checkpoint");
  EXPECT_EQ(resolve_resume(dir, "/nonexistent"), s[1]);  // a checkpoint dir as PATH: its newest complete one
  // The next save of the same run removes its own interrupted saves older than itself.
  FakeState b(256, 9, 350);
  save(dir, b, /*keep=*/10);
  EXPECT_FALSE(fs::exists(s[2]) || fs::exists(s[3]));
  EXPECT_TRUE(checkpoint_is_complete(s[1]));
}

// A committed checkpoint damaged afterwards (its manifest cut, a file truncated) is refused by --resume
// auto like a corrupt state file: skipping it would silently lose the steps since the previous one, and
// with nothing older, start from scratch (and later delete it) with exit 0.
TEST(Checkpoint, DamagedCheckpointsAreRefusedNotSkipped) {
  const std::string dir = fresh_dir("damaged");
  FakeState a(256, 1, 100);
  const std::string s100 = save(dir, a, /*keep=*/10);
  fs::resize_file(s100 + "/manifest.json", fs::file_size(s100 + "/manifest.json") / 2);  // not JSON
  EXPECT_EXIT(resolve_resume("auto", dir), ExitedWithCode(3), "damaged checkpoint .*step-00000100: .* is not valid JSON");
  EXPECT_EXIT(read_checkpoint_state(s100), ExitedWithCode(3), "not valid JSON");
  // Newer than a good one: still refused, not skipped to the older one.
  const std::string older = fresh_dir("damaged_older");
  FakeState b(256, 2, 100), c(256, 3, 200);
  save(older, b, 10);
  const std::string s200 = save(older, c, 10);
  fs::resize_file(s200 + "/state.safetensors", fs::file_size(s200 + "/state.safetensors") - 100);
  EXPECT_EXIT(resolve_resume("auto", older), ExitedWithCode(3), "damaged checkpoint .*truncated");
  EXPECT_EXIT(resolve_resume(s200, older), ExitedWithCode(3), "truncated");
  // Moved away as the hint says, the older one is picked.
  fs::rename(s200, s200 + ".damaged");
  EXPECT_EQ(resolve_resume("auto", older), checkpoint_step_dir(older, 100));
}

// The step, the data positions and the schedule are covered by the manifest's own hash: an edited manifest
// (valid JSON, every file of its size) would resume with gaps or skipped data.
TEST(Checkpoint, EditedManifestIsRefused) {
  const std::string dir = fresh_dir("edited");
  FakeState a(64, 4, 100);
  const std::string s100 = save(dir, a);
  EXPECT_EQ(read_checkpoint_state(s100).step, 100);  // the untouched one reads back
  const std::string path = s100 + "/manifest.json";
  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"step\": 100", "\"step\": 90"}, {"\"tokens\": 100000", "\"tokens\": 5"}}) {
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from << " not in " << path;
    std::string edited = text;
    edited.replace(at, from.size(), to);
    std::ofstream(path, std::ios::trunc) << edited;
    EXPECT_EXIT(read_checkpoint_state(s100), ExitedWithCode(3), "does not match its recorded hash") << to;
    EXPECT_EXIT(resolve_resume("auto", dir), ExitedWithCode(3), "damaged checkpoint .*recorded hash") << to;
  }
  std::ofstream(path, std::ios::trunc) << text;  // restored: reads again
  EXPECT_EQ(read_checkpoint_state(s100).step, 100);
}

// A run deletes only checkpoints of its own lineage (run_id: made at a fresh start, inherited on resume).
TEST(Checkpoint, PruningNeverDeletesAnotherRunsOrDamagedCheckpoints) {
  const std::string dir = fresh_dir("lineage");
  for (int64_t step : {10, 20}) {
    FakeState a(64, static_cast<uint32_t>(step), step);
    a.st.run_id = "run-a";
    save(dir, a, /*keep=*/1);
  }
  EXPECT_FALSE(fs::exists(checkpoint_step_dir(dir, 10)));  // run a pruned its own
  const std::string a20 = checkpoint_step_dir(dir, 20);
  // A damaged checkpoint (manifest cut) and another run's interrupted save, both older than run b's.
  FakeState d(64, 5, 25);
  d.st.run_id = "run-d";
  const std::string d25 = save(dir, d, 10);
  fs::resize_file(d25 + "/manifest.json", 10);
  fs::create_directories(checkpoint_step_dir(dir, 27));
  std::ofstream(checkpoint_step_dir(dir, 27) + "/state.safetensors") << "partial, writer unknown";
  // Run b saves three times with keep 1.
  for (int64_t step : {30, 40, 50}) {
    FakeState b(64, static_cast<uint32_t>(step), step);
    b.st.run_id = "run-b";
    save(dir, b, /*keep=*/1);
  }
  EXPECT_TRUE(checkpoint_is_complete(a20));  // run a's: untouched
  EXPECT_TRUE(fs::exists(d25 + "/manifest.json"));
  EXPECT_TRUE(fs::exists(checkpoint_step_dir(dir, 27) + "/state.safetensors"));
  EXPECT_FALSE(fs::exists(checkpoint_step_dir(dir, 30)) || fs::exists(checkpoint_step_dir(dir, 40)));
  EXPECT_TRUE(checkpoint_is_complete(checkpoint_step_dir(dir, 50)));
  EXPECT_EQ(read_checkpoint_state(checkpoint_step_dir(dir, 50)).run_id, "run-b");
  // Another run reaching a step run b holds does not pass b's state off as its own: b's is set aside.
  FakeState c(64, 99, 50);
  c.st.run_id = "run-c";
  save(dir, c, 10);
  EXPECT_EQ(read_checkpoint_state(checkpoint_step_dir(dir, 50)).run_id, "run-c");
  EXPECT_EQ(read_checkpoint_state(checkpoint_step_dir(dir, 50) + ".other-run").run_id, "run-b");
}

TEST(Checkpoint, ResumeAutoWithNothingStartsFresh) {
  const std::string dir = fresh_dir("empty");
  EXPECT_EQ(resolve_resume("auto", dir), "");
  EXPECT_EQ(resolve_resume("auto", dir + "/does-not-exist"), "");
  EXPECT_EQ(resolve_resume("", dir), "");
  EXPECT_EXIT(resolve_resume(dir + "/nope", dir), ExitedWithCode(3), "no such directory");
  EXPECT_EXIT(resolve_resume(dir, dir), ExitedWithCode(3), "no complete checkpoint");
}

TEST(Checkpoint, CorruptContentIsBadInput) {
  const std::string dir = fresh_dir("corrupt");
  FakeState a(512, 8, 7);
  a.st.rng_states.clear();  // adam.v is then the file's tail
  const std::string step_dir = save(dir, a);
  // Same size, one flipped bit inside adam.v: only the content hash can tell.
  flip_byte(step_dir + "/state.safetensors", 5);
  FakeState b(512, 9, 0);
  EXPECT_EXIT(load_checkpoint_tensors(step_dir, b.views()), ExitedWithCode(3), "corrupt checkpoint");
  // A flipped bit in an RNG state (the tail when there are RNG states).
  FakeState c(512, 8, 8);
  c.st.rng_states = {"rank0-state", "rank1-state"};
  const std::string s8 = save(dir, c);
  flip_byte(s8 + "/state.safetensors", 3);
  EXPECT_EXIT(read_checkpoint_state(s8), ExitedWithCode(3), "content hash of rng.rank00001");
}

TEST(Checkpoint, ParameterCountMismatchIsBadInput) {
  const std::string dir = fresh_dir("mismatch");
  FakeState a(512, 8, 7);
  const std::string step_dir = save(dir, a);
  FakeState b(500, 9, 0);
  EXPECT_EXIT(load_checkpoint_tensors(step_dir, b.views()), ExitedWithCode(3), "holds 512 drafter parameters");
}

TEST(Checkpoint, SavingAnExistingStepKeepsItAndReplacesLeftovers) {
  const std::string dir = fresh_dir("existing");
  FakeState a(64, 1, 10);
  const std::string s10 = save(dir, a);
  const auto mtime = fs::last_write_time(s10 + "/manifest.json");
  save(dir, a);  // a resumed run interrupted before its first step saves step 10 again
  EXPECT_EQ(fs::last_write_time(s10 + "/manifest.json"), mtime);
  // A leftover of a crashed save at step 20 is replaced by the new save.
  fs::create_directories(checkpoint_step_dir(dir, 20));
  std::ofstream(checkpoint_step_dir(dir, 20) + "/state.safetensors") << "partial";
  FakeState b(64, 2, 20);
  save(dir, b);
  EXPECT_TRUE(checkpoint_is_complete(checkpoint_step_dir(dir, 20)));
}

TEST(Checkpoint, NewerCheckpointsOfAnAbandonedTimelineAreSetAside) {
  const std::string dir = fresh_dir("timeline");
  for (int64_t s : {10, 20, 30}) {
    FakeState a(64, static_cast<uint32_t>(s), s);
    save(dir, a);
  }
  // Resumed explicitly from step 10, the run now saves step 15: auto must find 15, not 30.
  FakeState b(64, 15, 15);
  save(dir, b);
  EXPECT_EQ(find_latest_checkpoint(dir), checkpoint_step_dir(dir, 15));
  EXPECT_TRUE(fs::exists(checkpoint_step_dir(dir, 30) + ".superseded/manifest.json"));
}

TEST(Checkpoint, ContentHashSeesEveryBitAndTheLength) {
  std::vector<unsigned char> buf(1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 31 + 7);
  const uint64_t h = content_hash64(buf.data(), buf.size());
  EXPECT_EQ(h, content_hash64(buf.data(), buf.size()));
  for (size_t pos : {0, 17, 500, 992, 999}) {
    buf[pos] ^= 1;
    EXPECT_NE(h, content_hash64(buf.data(), buf.size())) << pos;
    buf[pos] ^= 1;
  }
  EXPECT_NE(h, content_hash64(buf.data(), buf.size() - 1));
  std::vector<unsigned char> zeros(64, 0);
  EXPECT_NE(content_hash64(zeros.data(), 32), content_hash64(zeros.data(), 64));
}

// ---- data resume points ------------------------------------------------------------------------

TEST(ResumePoints, PositionAdvancesOverConsecutiveBatchesOnly) {
  // Two targets; batches trained out of order and by several drafters.
  std::vector<DataResumePoint> points(2);
  for (int t = 0; t < 2; ++t) points[t].position = position_at(t, 2, 0);
  auto batch = [](int t, int64_t i) { return ConsumedBatch{t, i, position_at(t, 2, i + 1)}; };
  advance_resume_points(points, {batch(0, 1), batch(1, 0), batch(0, 3)});
  EXPECT_EQ(points[0].position, position_at(0, 2, 0));  // batch 0 of target 0 is still in flight
  EXPECT_TRUE(points[0].already_trained(1) && points[0].already_trained(3) && !points[0].already_trained(2));
  EXPECT_EQ(points[1].position, position_at(1, 2, 1));
  EXPECT_TRUE(points[1].done_after.empty());
  advance_resume_points(points, {batch(0, 0), batch(0, 2)});
  EXPECT_EQ(points[0].position, position_at(0, 2, 4));  // 0..3 all trained
  EXPECT_TRUE(points[0].done_after.empty());
}

TEST(ResumePoints, ABatchTrainedTwiceIsABug) {
  std::vector<DataResumePoint> points(1);
  points[0].position = position_at(0, 1, 5);
  EXPECT_EXIT(advance_resume_points(points, {ConsumedBatch{0, 4, position_at(0, 1, 5)}}), ExitedWithCode(9),
              "trained on twice");
  EXPECT_EXIT(advance_resume_points(points, {ConsumedBatch{1, 5, position_at(0, 1, 6)}}), ExitedWithCode(9),
              "names target 1");
}

// ---- stop signals ------------------------------------------------------------------------------

TEST(StopSignal, UsrOneAndTermOnlySetTheFlag) {
  install_stop_signal_handlers();
  clear_stop_signal();
  EXPECT_EQ(stop_signal_received(), 0);
  ASSERT_EQ(std::raise(SIGUSR1), 0);  // the process survives: the handler only records it
  EXPECT_EQ(stop_signal_received(), SIGUSR1);
  ASSERT_EQ(std::raise(SIGTERM), 0);
  EXPECT_EQ(stop_signal_received(), SIGUSR1);  // the first one counts
  clear_stop_signal();
  ASSERT_EQ(std::raise(SIGTERM), 0);
  EXPECT_EQ(stop_signal_received(), SIGTERM);
  clear_stop_signal();
  std::signal(SIGUSR1, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}
