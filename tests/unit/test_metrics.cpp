// metrics.h5 writer/reader, crash survival, and the status line.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <hdf5.h>

#include "data/h5_util.h"
#include "dflash/metrics.h"
#include "test_support.h"

using namespace dflash;

namespace {

std::string make_temp_dir() { return test::make_temp_dir("dflash-metrics-test-"); }

StepMetrics step_row(int64_t i) {
  StepMetrics s;
  s.step = i;
  s.time_s = 0.5 * static_cast<double>(i);
  s.loss = 3.0 / static_cast<double>(i + 1);
  s.acc = 0.01 * static_cast<double>(i);
  s.agree = 0.02 * static_cast<double>(i);
  s.streak = 0.1 * static_cast<double>(i);
  s.lr = 1e-5 * static_cast<double>(i);
  s.noise = 0.1;
  s.grad_norm = 1.5 + static_cast<double>(i);
  s.tokens = 1000 + i;
  s.anchors = 50 + i;
  return s;
}

MetricsLayout cpu_layout(int t, int d, int flush_every = 4) {
  MetricsLayout l;
  l.num_targets = t;
  l.num_drafters = d;
  l.gpu_available = false;
  l.gpu_unavailable_reason = "CPU backend: no NVML";
  l.flush_every = flush_every;
  return l;
}

}  // namespace

TEST(Metrics, WriteAndReadBack) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  {
    MetricsWriter w(path, cpu_layout(3, 2));
    for (int64_t i = 0; i < 25; ++i) w.append_step(step_row(i));
    for (int iv = 0; iv < 2; ++iv)
      for (int r = 0; r < 5; ++r) {
        RankTiming t;
        t.interval = iv;
        t.time_s = 10.0 * (iv + 1);
        t.rank = r;
        t.role = r < 3 ? MetricsRole::Target : MetricsRole::Drafter;
        t.batches = 10 + r;
        t.busy_s = 7.5 + r;
        t.wait_s = 2.5 - 0.1 * r;
        t.compute_s = r < 3 ? t.busy_s : 6.0;
        t.credit_wait_s = r < 3 ? 1.0 : 0.0;
        t.allreduce_s = r < 3 ? 0.0 : 0.75;
        w.append_rank_timing(t);
      }
    w.append_queues(1.0, {4, 3, 2}, {1, 0});
    w.append_queues(2.0, {5, 5, 4}, {2, 2});
    w.set_attribute("topology", std::string("3-2"));
    w.set_attribute("options", std::string("{\"lr\": 0.0006}"));
    w.set_attribute("world_size", int64_t{5});
    w.set_attribute("token_budget_k", 32.768);
    w.set_attribute("topology", std::string("3-2 (overwritten)"));
    EXPECT_EQ(w.num_steps(), 25);
  }
  MetricsReader r(path);
  std::vector<double> step = r.series("steps/step"), loss = r.series("steps/loss"), tokens = r.series("steps/tokens");
  ASSERT_EQ(step.size(), 25u);
  for (int64_t i = 0; i < 25; ++i) {
    StepMetrics e = step_row(i);
    EXPECT_EQ(step[i], static_cast<double>(e.step));
    EXPECT_DOUBLE_EQ(loss[i], e.loss);
    EXPECT_EQ(tokens[i], static_cast<double>(e.tokens));
  }
  for (const char* s : {"time_s", "acc", "agree", "streak", "lr", "noise", "grad_norm", "anchors"})
    EXPECT_EQ(r.rows(std::string("steps/") + s), 25) << s;
  EXPECT_DOUBLE_EQ(r.series("steps/grad_norm")[24], step_row(24).grad_norm);
  EXPECT_EQ(r.rows("ranks/rank"), 10);
  EXPECT_DOUBLE_EQ(r.series("ranks/busy_s")[6], 8.5);
  EXPECT_EQ(r.series("ranks/role")[4], 1.0);
  EXPECT_DOUBLE_EQ(r.series("ranks/allreduce_s")[9], 0.75);
  int64_t cols = 0;
  std::vector<double> q_pre = r.matrix("queues/q_pre", &cols);
  EXPECT_EQ(cols, 3);
  EXPECT_EQ(q_pre, (std::vector<double>{4, 3, 2, 5, 5, 4}));
  std::vector<double> q_hs = r.matrix("queues/q_hs", &cols);
  EXPECT_EQ(cols, 2);
  EXPECT_EQ(q_hs, (std::vector<double>{1, 0, 2, 2}));
  EXPECT_EQ(r.series("queues/time_s"), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(r.attribute_string("/", "topology"), "3-2 (overwritten)");
  EXPECT_EQ(r.attribute_string("/", "options"), "{\"lr\": 0.0006}");
  EXPECT_EQ(r.attribute_number("/", "world_size"), 5.0);
  EXPECT_DOUBLE_EQ(r.attribute_number("/", "token_budget_k"), 32.768);
  // On the CPU backend: the gpus group says why there is nothing, and holds no invented numbers.
  EXPECT_EQ(r.attribute_number("/gpus", "available"), 0.0);
  EXPECT_EQ(r.attribute_string("/gpus", "reason"), "CPU backend: no NVML");
  EXPECT_FALSE(r.has("gpus/power_w"));
  EXPECT_TRUE(r.has("gpus"));
  auto names = r.attribute_names("/");
  EXPECT_NE(std::find(names.begin(), names.end(), "world_size"), names.end());
}

TEST(Metrics, GpuSeriesWhenAvailable) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  MetricsLayout l = cpu_layout(1, 1);
  l.gpu_available = true;
  l.num_gpus = 2;
  {
    MetricsWriter w(path, l);
    w.append_gpus(1.0, {350.5, 120.0}, {99, 10}, {70000, 2000});
  }
  MetricsReader r(path);
  int64_t cols = 0;
  EXPECT_EQ(r.matrix("gpus/power_w", &cols), (std::vector<double>{350.5, 120.0}));
  EXPECT_EQ(cols, 2);
  EXPECT_EQ(r.attribute_number("/gpus", "available"), 1.0);
}

TEST(Metrics, EveryDatasetHasUnitsAndADescription) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  MetricsLayout l = cpu_layout(2, 1);
  l.gpu_available = true;
  l.num_gpus = 3;
  { MetricsWriter w(path, l); }
  const MetricsReader r(path);
  const char* groups[][16] = {
      {"steps", "step", "time_s", "loss", "acc", "agree", "streak", "lr", "noise", "grad_norm", "tokens", "anchors",
       "epoch", "acc_by_pos", "block_position"},
      {"ranks", "interval", "time_s", "rank", "role", "batches", "busy_s", "wait_s", "compute_s", "credit_wait_s",
       "data_wait_s", "allreduce_s", "optimizer_s"},
      {"queues", "time_s", "q_pre", "q_hs"},
      {"gpus", "time_s", "power_w", "util_pct", "mem_used_mib"}};
  int checked = 0;
  for (const auto& g : groups) {
    for (int i = 1; i < 16 && g[i]; ++i) {
      const std::string ds = std::string("/") + g[0] + "/" + g[i];
      ASSERT_TRUE(r.has_attribute(ds, "units")) << ds;
      ASSERT_TRUE(r.has_attribute(ds, "description")) << ds;
      EXPECT_FALSE(r.attribute_string(ds, "description").empty()) << ds;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 14 + 12 + 3 + 4);
  EXPECT_EQ(r.attribute_string("/gpus/power_w", "units"), "W");
  EXPECT_EQ(r.attribute_string("/steps/time_s", "units"), "s");
  EXPECT_NE(r.attribute_string("/queues/q_hs", "description").find("[sample, drafter]"), std::string::npos);
}

// xarray (h5netcdf, netCDF4) names a dataset's axes after its netCDF-4 dimension scales: every axis has
// one, so no phony_dim_N.
TEST(Metrics, DimensionScalesNameEveryAxis) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  MetricsLayout l = cpu_layout(3, 2);
  l.gpu_available = true;
  l.num_gpus = 5;
  l.block_size = 4;
  {
    MetricsWriter w(path, l);
    w.append_step(step_row(1));
    w.append_queues(1.0, {1, 2, 3}, {0, 1});
  }
  const MetricsReader r(path);
  using Dims = std::vector<std::string>;
  for (const char* s : {"step", "time_s", "loss", "acc", "agree", "streak", "lr", "noise", "grad_norm", "tokens", "anchors", "epoch"})
    EXPECT_EQ(r.dimensions(std::string("steps/") + s), Dims{"step"}) << s;
  EXPECT_EQ(r.dimensions("steps/acc_by_pos"), (Dims{"step", "block_position"}));
  EXPECT_EQ(r.dimensions("steps/block_position"), Dims{"block_position"});
  EXPECT_EQ(r.series("steps/block_position"), (std::vector<double>{1, 2, 3}));  // the anchor (0) is never predicted
  for (const char* s : {"interval", "time_s", "rank", "role", "busy_s", "optimizer_s"})
    EXPECT_EQ(r.dimensions(std::string("ranks/") + s), Dims{"row"}) << s;
  EXPECT_EQ(r.dimensions("queues/time_s"), Dims{"sample"});
  EXPECT_EQ(r.dimensions("queues/q_pre"), (Dims{"sample", "target"}));
  EXPECT_EQ(r.dimensions("queues/q_hs"), (Dims{"sample", "drafter"}));
  EXPECT_EQ(r.rows("queues/target"), 3);
  EXPECT_EQ(r.rows("queues/drafter"), 2);
  EXPECT_EQ(r.dimensions("gpus/time_s"), Dims{"sample"});
  for (const char* s : {"power_w", "util_pct", "mem_used_mib"})
    EXPECT_EQ(r.dimensions(std::string("gpus/") + s), (Dims{"sample", "gpu"})) << s;
  EXPECT_EQ(r.rows("gpus/gpu"), 5);
  EXPECT_EQ(r.attribute_number("/", "format_version"), 2.0);
}

// The role is the committed HDF5 enum /ranks/role_t (netCDF-4's enum type: h5netcdf's EnumType).
TEST(Metrics, RoleIsACommittedEnum) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  {
    MetricsWriter w(path, cpu_layout(1, 1));
    RankTiming t;
    for (MetricsRole role : {MetricsRole::Target, MetricsRole::Drafter, MetricsRole::Idle}) {
      t.role = role;
      w.append_rank_timing(t);
    }
  }
  EXPECT_EQ(MetricsReader(path).series("ranks/role"), (std::vector<double>{0, 1, 2}));
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), h5::Handle::Kind::File);
  ASSERT_TRUE(file.valid());
  h5::Handle ds(H5Dopen2(file, "ranks/role", H5P_DEFAULT), h5::Handle::Kind::Dataset);
  h5::Handle type(H5Dget_type(ds), h5::Handle::Kind::Datatype);
  ASSERT_EQ(H5Tget_class(type), H5T_ENUM);
  EXPECT_GT(H5Tcommitted(type), 0);
  EXPECT_EQ(H5Tget_size(type), 1u);
  ASSERT_EQ(H5Tget_nmembers(type), 3);
  for (int8_t v = 0; v < 3; ++v) {
    char name[16] = {};
    ASSERT_GE(H5Tenum_nameof(type, &v, name, sizeof(name)), 0);
    EXPECT_STREQ(name, metrics_role_name(static_cast<MetricsRole>(v)));
  }
  EXPECT_GT(H5Lexists(file, "ranks/role_t", H5P_DEFAULT), 0);
}

TEST(Metrics, EpochAndAccuracyByBlockPosition) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  MetricsLayout l = cpu_layout(1, 1);
  l.block_size = 4;
  {
    MetricsWriter w(path, l);
    StepMetrics s = step_row(1);
    s.epoch = 0.25;
    s.acc_by_pos = {0.75, 0.5, 0.125};
    w.append_step(s);
    s = step_row(2);
    s.epoch = 0.5;  // no acc_by_pos: stored as NaN
    w.append_step(s);
  }
  const MetricsReader r(path);
  EXPECT_EQ(r.series("steps/epoch"), (std::vector<double>{0.25, 0.5}));
  int64_t cols = 0;
  const std::vector<double> acc = r.matrix("steps/acc_by_pos", &cols);
  ASSERT_EQ(cols, 3);
  ASSERT_EQ(acc.size(), 6u);
  EXPECT_EQ(std::vector<double>(acc.begin(), acc.begin() + 3), (std::vector<double>{0.75, 0.5, 0.125}));
  for (int k = 3; k < 6; ++k) EXPECT_TRUE(std::isnan(acc[k])) << k;
}

TEST(MetricsDeathTest, AccByPosOfAnotherBlockSizeIsRefused) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  MetricsLayout l = cpu_layout(1, 1);
  l.block_size = 4;
  MetricsWriter w(path, l);
  StepMetrics s = step_row(1);
  s.acc_by_pos = {0.5, 0.5};
  EXPECT_EXIT(w.append_step(s), testing::ExitedWithCode(9), "2 block positions for a layout of 3");
  l.block_size = 8;
  w.close();
  EXPECT_EXIT(MetricsWriter(path, l, MetricsOpen::Append), testing::ExitedWithCode(3), "block size 8");
}

// Run metadata with its types: an int as int64, a real as float64, a text as a string (xarray attrs).
TEST(Metrics, GroupAttributesAreTyped) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  {
    MetricsWriter w(path, cpu_layout(1, 1));
    w.set_group_attribute("options", "max-steps", int64_t{50});
    w.set_group_attribute("options", "lr", 6e-4);
    w.set_group_attribute("options", "topology", std::string("1-1"));
    w.set_group_attribute("options", "max-steps", int64_t{60});  // overwritten
  }
  {
    const MetricsReader r(path);
    EXPECT_EQ(r.attribute_number("/options", "max-steps"), 60.0);
    EXPECT_DOUBLE_EQ(r.attribute_number("/options", "lr"), 6e-4);
    EXPECT_EQ(r.attribute_string("/options", "topology"), "1-1");
  }
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), h5::Handle::Kind::File);
  h5::Handle group(H5Gopen2(file, "options", H5P_DEFAULT), h5::Handle::Kind::Group);
  auto type_class = [&](const char* name) {
    h5::Handle a(H5Aopen(group, name, H5P_DEFAULT), h5::Handle::Kind::Attribute);
    h5::Handle t(H5Aget_type(a), h5::Handle::Kind::Datatype);
    return H5Tget_class(t);
  };
  EXPECT_EQ(type_class("max-steps"), H5T_INTEGER);
  EXPECT_EQ(type_class("lr"), H5T_FLOAT);
  EXPECT_EQ(type_class("topology"), H5T_STRING);
}

namespace {
// A metrics.h5 as format 1 wrote it (no dimension scales, int64 roles, no epoch or acc_by_pos), `steps` rows.
void write_format1_file(const std::string& path, int steps) {
  h5::Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), h5::Handle::Kind::File);
  h5::write_attr_int64(file, "format_version", 1);
  auto series = [&](const std::string& name, hid_t type, hsize_t rows, hsize_t cols, const void* data) {
    const int rank = cols ? 2 : 1;
    hsize_t dims[2] = {rows, cols}, maxdims[2] = {H5S_UNLIMITED, cols}, chunk[2] = {64, cols ? cols : 1};
    h5::Handle space(H5Screate_simple(rank, dims, maxdims), h5::Handle::Kind::Dataspace);
    h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), h5::Handle::Kind::PropList);
    H5Pset_chunk(dcpl, rank, chunk);
    h5::Handle ds(H5Dcreate2(file, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), h5::Handle::Kind::Dataset);
    if (rows) H5Dwrite(ds, type == H5T_IEEE_F64LE ? H5T_NATIVE_DOUBLE : type == H5T_STD_I32LE ? H5T_NATIVE_INT32 : H5T_NATIVE_INT64,
                       H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  };
  for (const char* g : {"steps", "ranks", "queues", "gpus"})
    h5::Handle(H5Gcreate2(file, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), h5::Handle::Kind::Group);
  std::vector<int64_t> ints(steps);
  std::vector<double> reals(steps);
  for (int i = 0; i < steps; ++i) ints[i] = i + 1, reals[i] = 0.5 * (i + 1);
  for (const char* s : {"step", "tokens", "anchors"}) series(std::string("steps/") + s, H5T_STD_I64LE, steps, 0, ints.data());
  for (const char* s : {"time_s", "loss", "acc", "agree", "streak", "lr", "noise", "grad_norm"})
    series(std::string("steps/") + s, H5T_IEEE_F64LE, steps, 0, reals.data());
  const int64_t role = 1;
  for (const char* s : {"interval", "rank", "role", "batches"}) series(std::string("ranks/") + s, H5T_STD_I64LE, 1, 0, &role);
  const double zero = 0;
  for (const char* s : {"time_s", "busy_s", "wait_s", "compute_s", "credit_wait_s", "data_wait_s", "allreduce_s", "optimizer_s"})
    series(std::string("ranks/") + s, H5T_IEEE_F64LE, 1, 0, &zero);
  series("queues/time_s", H5T_IEEE_F64LE, 0, 0, nullptr);
  series("queues/q_pre", H5T_STD_I32LE, 0, 2, nullptr);
  series("queues/q_hs", H5T_STD_I32LE, 0, 1, nullptr);
  h5::Handle gpus(H5Gopen2(file, "gpus", H5P_DEFAULT), h5::Handle::Kind::Group);
  h5::write_attr_int64(gpus, "available", 0);
}
}  // namespace

// A run resumed on a file of format 1 keeps its rows and gets what format 2 has: epoch and acc_by_pos
// (NaN over the earlier rows), dimension scales on every axis; its int64 roles stay int64.
TEST(Metrics, ResumingAFormat1FileBringsItToFormat2) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  write_format1_file(path, 3);
  MetricsLayout l = cpu_layout(2, 1);
  l.block_size = 3;
  {
    MetricsWriter w(path, l, MetricsOpen::Append);
    StepMetrics s = step_row(4);
    s.epoch = 0.75;
    s.acc_by_pos = {0.5, 0.25};
    w.append_step(s);
    RankTiming t;
    t.role = MetricsRole::Target;
    w.append_rank_timing(t);
  }
  const MetricsReader r(path);
  EXPECT_EQ(r.series("steps/step"), (std::vector<double>{1, 2, 3, 4}));
  const std::vector<double> epoch = r.series("steps/epoch");
  ASSERT_EQ(epoch.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(epoch[i])) << i;
  EXPECT_EQ(epoch[3], 0.75);
  int64_t cols = 0;
  const std::vector<double> acc = r.matrix("steps/acc_by_pos", &cols);
  ASSERT_EQ(cols, 2);
  ASSERT_EQ(acc.size(), 8u);
  EXPECT_TRUE(std::isnan(acc[0]));
  EXPECT_EQ(acc[6], 0.5);
  EXPECT_EQ(r.series("ranks/role"), (std::vector<double>{1, 0}));
  EXPECT_EQ(r.dimensions("steps/loss"), std::vector<std::string>{"step"});
  EXPECT_EQ(r.dimensions("ranks/role"), std::vector<std::string>{"row"});
  EXPECT_EQ(r.dimensions("queues/q_pre"), (std::vector<std::string>{"sample", "target"}));
  EXPECT_EQ(r.attribute_number("/", "format_version"), 2.0);
  EXPECT_NE(r.attribute_string("/steps/epoch", "description").find("epoch"), std::string::npos);
}

TEST(Metrics, AppendResumesAndDropsStepsAfterCheckpoint) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  {
    MetricsWriter w(path, cpu_layout(2, 1));
    for (int64_t i = 1; i <= 10; ++i) w.append_step(step_row(i));
  }
  {
    MetricsWriter w(path, cpu_layout(2, 1), MetricsOpen::Append);
    EXPECT_EQ(w.num_steps(), 10);
    w.drop_steps_after(6);  // resumed from the step-6 checkpoint
    EXPECT_EQ(w.num_steps(), 6);
    w.append_step(step_row(7));
  }
  MetricsReader r(path);
  EXPECT_EQ(r.series("steps/step"), (std::vector<double>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r.rows("steps/anchors"), 7);
  EXPECT_EQ(r.rows("steps/epoch"), 7);
  EXPECT_EQ(r.rows("steps/acc_by_pos"), 7);
}

// A new run never overwrites a file that holds steps: it is kept as metrics.N.h5, numbered in the order
// the runs ran; a step-less file (a start that failed before its first step) is simply replaced.
TEST(Metrics, CreateKeepsEveryFileThatHoldsSteps) {
  const std::string dir = make_temp_dir();
  const std::string path = dir + "/metrics.h5";
  auto run = [&](int64_t steps) {
    MetricsWriter w(path, cpu_layout(2, 1));
    for (int64_t i = 1; i <= steps; ++i) w.append_step(step_row(i));
  };
  run(7);
  run(0);  // failed start: the 7-step file is kept
  EXPECT_EQ(MetricsReader(dir + "/metrics.1.h5").rows("steps/step"), 7);
  EXPECT_EQ(MetricsReader(path).rows("steps/step"), 0);
  run(0);  // another failed start: the step-less file is replaced, metrics.1.h5 untouched
  EXPECT_FALSE(std::filesystem::exists(dir + "/metrics.2.h5"));
  run(3);
  run(5);
  EXPECT_EQ(MetricsReader(dir + "/metrics.1.h5").rows("steps/step"), 7);
  EXPECT_EQ(MetricsReader(dir + "/metrics.2.h5").rows("steps/step"), 3);
  EXPECT_EQ(MetricsReader(path).rows("steps/step"), 5);
  // A file that is not a metrics file is kept too (nobody knows what it holds), with the next number.
  std::filesystem::remove(path);
  std::ofstream(path) << "not hdf5";
  run(1);
  EXPECT_EQ(std::filesystem::file_size(dir + "/metrics.3.h5"), 8u);
  EXPECT_FALSE(std::filesystem::exists(path + ".prev"));
}

// A resume on another split (docs/metrics.md "Segments"): the earlier split's /queues move to /segments/K/
// (K: that split's first segment) and this split's start anew; the rows of /steps and /ranks go on.
TEST(Metrics, AppendWithAnotherSplitMovesTheSplitsSeries) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  {
    MetricsWriter w(path, cpu_layout(2, 1));
    SegmentInfo seg;
    seg.targets_per_node = 2;
    EXPECT_EQ(w.begin_segment(seg), 0);
    w.append_queues(1.0, {1, 2}, {3});
    w.append_step(step_row(0));
  }
  {
    MetricsWriter w(path, cpu_layout(2, 1), MetricsOpen::Append);  // the same split: /queues goes on
    SegmentInfo seg;
    seg.kind = SegmentKind::Resume;
    EXPECT_EQ(w.begin_segment(seg), 1);
    w.append_queues(2.0, {0, 1}, {2});
  }
  {
    MetricsWriter w(path, cpu_layout(1, 2), MetricsOpen::Append);  // another split
    SegmentInfo seg;
    seg.kind = SegmentKind::Resplit;
    seg.targets_per_node = 1;
    seg.drafters_per_node = 2;
    EXPECT_EQ(w.begin_segment(seg), 2);
    w.append_queues(3.0, {4}, {1, 1});
    w.append_step(step_row(1));
  }
  MetricsReader r(path);
  int64_t cols = 0;
  EXPECT_EQ(r.matrix("segments/0/queues/q_pre", &cols), (std::vector<double>{1, 2, 0, 1}));
  EXPECT_EQ(cols, 2);
  EXPECT_EQ(r.matrix("queues/q_pre", &cols), (std::vector<double>{4}));
  EXPECT_EQ(cols, 1);
  EXPECT_EQ(r.matrix("queues/q_hs", &cols), (std::vector<double>{1, 1}));
  EXPECT_EQ(r.series("segments/kind"), (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(r.series("segments/targets_per_node"), (std::vector<double>{2, 1, 1}));
  EXPECT_EQ(r.series("steps/step").size(), 2u);
}

TEST(MetricsDeathTest, MissingSeriesIsNamed) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  { MetricsWriter w(path, cpu_layout(2, 1)); }
  EXPECT_EXIT(MetricsReader(path).series("steps/nope"), testing::ExitedWithCode(3), "has no series /steps/nope");
}

TEST(Metrics, SurvivesSigkillUpToTheLastFlush) {
  const std::string path = make_temp_dir() + "/metrics.h5";
  const int flush_every = 5;
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipefd[0]);
    MetricsWriter w(path, cpu_layout(2, 1, flush_every));
    w.set_attribute("topology", std::string("2-1"));
    for (int64_t i = 0; i < 23; ++i) w.append_step(step_row(i));  // flushed after rows 5, 10, 15, 20
    char ok = 'k';
    ssize_t n = write(pipefd[1], &ok, 1);
    (void)n;
    for (;;) pause();  // killed here, the writer never closes the file
  }
  close(pipefd[1]);
  char c = 0;
  ASSERT_EQ(read(pipefd[0], &c, 1), 1);
  close(pipefd[0]);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  MetricsReader r(path);
  std::vector<double> steps = r.series("steps/step");
  EXPECT_GE(steps.size(), 20u);  // everything up to the last flush
  EXPECT_LE(steps.size(), 23u);
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i], static_cast<double>(i));
  EXPECT_EQ(r.rows("steps/loss"), static_cast<int64_t>(steps.size()));
  EXPECT_EQ(r.attribute_string("/", "topology"), "2-1");
}

// ---- status line ------------------------------------------------------------------------------

TEST(Status, DurationFormats) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(42.9), "42s");
  EXPECT_EQ(format_duration(59.99), "59s");
  EXPECT_EQ(format_duration(60), "1m");
  EXPECT_EQ(format_duration(5 * 60 + 59), "5m");
  EXPECT_EQ(format_duration(3600), "1h0m");
  EXPECT_EQ(format_duration(3 * 3600 + 12 * 60 + 30), "3h12m");
  EXPECT_EQ(format_duration(86400 * 1.2), "1.2d");
  EXPECT_EQ(format_duration(86400 * 4.7), "4.7d");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(INFINITY), "?");
}

TEST(Status, ExactShapeOfTheDesignExample) {
  StatusInputs in;
  in.elapsed_s = 5 * 60 + 3;
  in.step = 58;
  in.loss = 2.25771;
  in.acc = 0.0291;
  in.streak = 0.04;
  in.lr = 9.8412e-06;
  in.noise = 0.1;
  in.target_batches_per_s = 0.8812;
  in.drafter_batches_per_s = 0.8149;
  in.tokens_per_s = 25123;
  in.q_pre = {50, 49, 49, 50, 50, 50, 50};
  in.q_hs = {20};
  in.epoch = 0.0099;
  in.eta_s = 4.7 * 86400 + 100;
  EXPECT_EQ(format_status_line(in),
            "[5m] step=58 loss=2.2577 acc=0.029 streak=0.04 lr=9.84e-06 noise=0.1000 | tgt=0.88 batch/s dft=0.81 batch/s "
            "(25.1Ktok/s) | q_pre=[50, 49, 49, 50, 50, 50, 50] q_hs=[20] | epoch~0.01 ETA=4.7d");
  in.power_w = 4213;
  in.eta_s.reset();
  in.tokens_per_s = 2.5e6;
  in.elapsed_s = 42;
  EXPECT_EQ(format_status_line(in),
            "[42s] step=58 loss=2.2577 acc=0.029 streak=0.04 lr=9.84e-06 noise=0.1000 | tgt=0.88 batch/s dft=0.81 batch/s "
            "(2.5Mtok/s) pwr=4.2kW | q_pre=[50, 49, 49, 50, 50, 50, 50] q_hs=[20] | epoch~0.01 ETA=?");
  in.power_w = 640;
  in.tokens_per_s = 812;
  in.q_pre = {1};
  in.q_hs = {0, 3};
  std::string s = format_status_line(in);
  EXPECT_NE(s.find("(812tok/s) pwr=640W | q_pre=[1] q_hs=[0, 3] |"), std::string::npos) << s;
  in.grad_accum = 4;  // --grad-accum 4: optimizer steps of 4 micro-batches
  s = format_status_line(in);
  EXPECT_NE(s.find("] step=58 (x4 mb) loss=2.2577"), std::string::npos) << s;
}

TEST(Status, QueueDepthsAgainstTheirCapacity) {
  StatusInputs in;
  in.q_pre = {3, 4};
  in.q_hs = {0};
  in.q_pre_capacity = 4;
  in.q_hs_capacity = 2;
  const std::string s = format_status_line(in);
  EXPECT_NE(s.find("| q_pre=[3/4, 4/4] q_hs=[0/2] |"), std::string::npos) << s;
}

TEST(Status, EtaFromThisSegmentsRateAndTheAbsoluteProgress) {
  // A fresh run: 100 steps in 50 s (2 steps/s), --max-steps 300 -> 200 steps left = 100 s.
  EtaInputs e;
  e.step = 100;
  e.segment_train_s = 50;
  e.max_steps = 300;
  e.epochs = 0;
  ASSERT_TRUE(estimate_eta_s(e).has_value());
  EXPECT_DOUBLE_EQ(*estimate_eta_s(e), 100);
  // Resumed at step 900 of 1000 steps per epoch, 1 epoch: 100 steps in this segment's 50 s, epoch 0.95 ->
  // 50 steps left at 2 steps/s = 25 s. (Absolute epochs over this segment's time said 0.05 * 50 / 0.95 ~ 2.6 s.)
  e = EtaInputs{};
  e.step = 950;
  e.segment_first_step = 850;
  e.segment_train_s = 50;
  e.epochs = 1;
  e.epoch = 0.95;
  ASSERT_TRUE(estimate_eta_s(e).has_value());
  EXPECT_NEAR(*estimate_eta_s(e), 25, 1e-9);
  // Both ends known: the nearer one wins (--max-steps 960 -> 10 steps = 5 s).
  e.max_steps = 960;
  EXPECT_NEAR(*estimate_eta_s(e), 5, 1e-9);
  // Past the end: 0, not negative.
  e.max_steps = 900;
  EXPECT_DOUBLE_EQ(*estimate_eta_s(e), 0);
  // No step in this segment yet, or no end known: unknown.
  e.step = 850;
  EXPECT_FALSE(estimate_eta_s(e).has_value());
  e = EtaInputs{};
  e.step = 10;
  e.segment_train_s = 5;
  e.epochs = 0;
  EXPECT_FALSE(estimate_eta_s(e).has_value());
}

// Issue 48 item 10: evaluation is counted apart. 100 steps in 80 s of which 30 s were 3 evaluations (every
// 30 steps): training ran 2 steps/s; 200 steps to --max-steps 300 take 100 s, and the evaluations due at
// 120, 150, ..., 300 (7 of them, 300 on the schedule: no extra one) 10 s each. Before, the rate was
// 100 / 80 steps/s and the evaluations were not counted: 160 s.
TEST(Status, EtaCountsTheEvaluationsApart) {
  EtaInputs e;
  e.step = 100;
  e.segment_train_s = 80;
  e.max_steps = 300;
  e.epochs = 0;
  e.evals_done = 3;
  e.eval_s = 30;
  e.eval_every = 30;
  EXPECT_NEAR(remaining_eval_s(e, 300), 70, 1e-9);
  ASSERT_TRUE(estimate_eta_s(e).has_value());
  EXPECT_NEAR(*estimate_eta_s(e), 100 + 70, 1e-9);
  // --max-steps 290 is off the schedule: 120 .. 270 (6) and the one after the last.
  e.max_steps = 290;
  EXPECT_NEAR(remaining_eval_s(e, 290), 70, 1e-9);
  // Only after the last (--eval-every 0): one more.
  e.eval_every = 0;
  EXPECT_NEAR(remaining_eval_s(e, 290), 10, 1e-9);
  // None measured yet: nothing to predict from; no eval set: none due.
  e.evals_done = 0;
  e.eval_s = 0;
  EXPECT_DOUBLE_EQ(remaining_eval_s(e, 290), 0);
  e.eval_every = -1;
  EXPECT_DOUBLE_EQ(remaining_eval_s(e, 290), 0);
  // The status line says the evaluation part.
  StatusInputs in;
  in.eta_s = 170;
  in.eta_eval_s = 70;
  const std::string s = format_status_line(in);
  EXPECT_NE(s.find("ETA=2m (eval 1m)"), std::string::npos) << s;
}
