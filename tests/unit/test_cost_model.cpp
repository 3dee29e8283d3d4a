// The cost model (src/plan/cost_model.h) and its calibration: every measured shape predicted within +-15 %
// (issue 44's bar), the JSON table equal to the built-in one, the scaled kinds marked, and the model's
// monotonicity (more anchors, longer context, more tokens: slower).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "plan/calibration_points.h"
#include "plan/cost_model.h"
#include "plan/gpu_calibration.h"

namespace dflash::plan {
namespace {

TEST(CostModelCalibration, EveryMeasuredShapeWithin15Percent) {
  std::set<std::string> gpus;
  int forwards = 0, steps = 0;
  for (const CalibrationPoint& p : calibration_points()) {
    const double ms = predicted_ms(p);
    std::printf("  %-5s %-58s measured %8.1f ms  predicted %8.1f ms  %+5.1f %%\n", p.gpu.c_str(), p.label.c_str(),
                p.measured_ms, ms, 100.0 * (ms / p.measured_ms - 1.0));
    EXPECT_NEAR(ms / p.measured_ms, 1.0, 0.15) << p.label << " on " << p.gpu << ": predicted " << ms << " ms, measured "
                                               << p.measured_ms << " ms (" << p.source << ")";
    gpus.insert(p.gpu);
    (p.role == MeasuredRole::TargetForward ? forwards : steps)++;
  }
  // Issue 44's bar: the target forward and the drafter step at three shapes each (8B, 27B hybrid, DFlash2
  // 27B), two anchor densities; on both measured kinds.
  EXPECT_GE(forwards, 3);
  EXPECT_GE(steps, 3);
  EXPECT_EQ(gpus, (std::set<std::string>{"h100", "h200"}));
}

TEST(CostModelCalibration, CoversTheIssuesShapes) {
  bool hybrid = false, dflash2 = false, recipe_density = false, batch_density = false;
  for (const CalibrationPoint& p : calibration_points()) {
    hybrid |= p.role == MeasuredRole::TargetForward && p.target.arch == TargetArch::HybridQwen35;
    dflash2 |= p.role == MeasuredRole::DrafterStep && p.drafter.arch == DrafterArch::DFlash2;
    recipe_density |= p.role == MeasuredRole::DrafterStep && p.drafter_batch.anchors == 3072;
    batch_density |= p.role == MeasuredRole::DrafterStep && p.drafter_batch.anchors == 512 && p.drafter_batch.context_tokens == 16384;
  }
  EXPECT_TRUE(hybrid && dflash2 && recipe_density && batch_density);
}

TEST(CostModelCalibration, JsonFileIsTheBuiltinTable) {
  const std::string path = std::string(DFLASH_TEST_DATA) + "/../../src/plan/calibration/gpus.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const nlohmann::json file = nlohmann::json::parse(in);
  EXPECT_EQ(file, calibrations_to_json(builtin_calibrations()))
      << "src/plan/calibration/gpus.json differs from src/plan/gpu_calibration.cpp: regenerate it with "
         "calibrations_to_json (docs/cost_model.md \"Recalibrating\")";
  EXPECT_EQ(file["version"].get<int>(), kCalibrationVersion);
}

TEST(CostModelCalibration, JsonRoundTripAndRefusals) {
  const nlohmann::json j = calibrations_to_json(builtin_calibrations());
  EXPECT_EQ(calibrations_to_json(calibrations_from_json(j, "table")), j);
  nlohmann::json other = j;
  other["version"] = kCalibrationVersion + 1;
  EXPECT_EXIT(calibrations_from_json(other, "f.json"), testing::ExitedWithCode(3), "calibration version");
  nlohmann::json zero = j;
  zero["gpus"][0]["gemm_tflops"] = 0;
  EXPECT_EXIT(calibrations_from_json(zero, "f.json"), testing::ExitedWithCode(3), "gemm_tflops");
  nlohmann::json missing = j;
  missing["gpus"][1].erase("memory_tbps");
  EXPECT_EXIT(calibrations_from_json(missing, "f.json"), testing::ExitedWithCode(3), "memory_tbps");
}

// The colocated overlap (docs/cost_model.md "The colocated layout"): the measured kinds carry the H100's 0.23;
// a file written before it (no key) reads as 0, the roles taking turns; above 1 or below 0 is refused.
TEST(CostModelCalibration, ColocatedOverlapInTheTableAndFiles) {
  EXPECT_DOUBLE_EQ(calibration_for("h100").colocated_overlap, 0.23);
  EXPECT_DOUBLE_EQ(calibration_for("h200").colocated_overlap, 0.23);
  EXPECT_EQ(calibration_for("rtx-pro-6000").source, CalibrationSource::Scaled);
  nlohmann::json j = calibrations_to_json({calibration_for("h100")});
  j["gpus"][0].erase("colocated_overlap");
  EXPECT_DOUBLE_EQ(calibrations_from_json(j, "old.json").front().colocated_overlap, 0);
  j["gpus"][0]["colocated_overlap"] = 1.5;
  EXPECT_EXIT(calibrations_from_json(j, "f.json"), testing::ExitedWithCode(3), "colocated_overlap");
  j["gpus"][0]["colocated_overlap"] = -0.1;
  EXPECT_EXIT(calibrations_from_json(j, "f.json"), testing::ExitedWithCode(3), "colocated_overlap");
}

// dflash-report's calibration.json (tools/dflash_report/forecast.py): the run's observed / predicted factors
// multiply every phase of their role, survive the JSON round trip, and --calibration picks the file's entry.
TEST(CostModelCalibration, RunCorrectionScalesEachRoleAndReadsBack) {
  GpuCalibration h100 = calibration_for("h100");
  const TargetShape t{TargetArch::DenseQwen3, 36, 4096, 12288, 32, 8, 128};
  const PackedBatchShape b = packed_batch_uniform(16384, 4096);
  DrafterShape d;
  d.hidden = 4096, d.intermediate = 12288, d.heads = 32, d.kv_heads = 8, d.head_dim = 128, d.vocab = 151936;
  d.layer_windows = {0, 0, 0, 0, 0};
  const DrafterBatchShape db{16384, 512, 4096};
  const double t0 = target_forward_cost(t, b, h100).seconds(), d0 = drafter_step_cost(d, db, h100).seconds();
  GpuCalibration fitted = h100;
  fitted.target_time_scale = 1.25;
  fitted.drafter_time_scale = 0.8;
  fitted.source = CalibrationSource::User;
  EXPECT_NEAR(target_forward_cost(t, b, fitted).seconds(), 1.25 * t0, 1e-9 * t0);
  EXPECT_NEAR(drafter_step_cost(d, db, fitted).seconds(), 0.8 * d0, 1e-9 * d0);
  const nlohmann::json j = calibrations_to_json({fitted, calibration_for("h200")});
  EXPECT_EQ(j["gpus"][0]["target_time_scale"].get<double>(), 1.25);
  EXPECT_FALSE(j["gpus"][1].contains("target_time_scale"));  // 1: not written (the built-in file has none)
  const std::string path = testing::TempDir() + "/calibration.json";
  std::ofstream(path) << j.dump();
  const GpuCalibration back = calibration_from_file(path, "h100");
  EXPECT_EQ(back.source, CalibrationSource::User);
  EXPECT_DOUBLE_EQ(back.drafter_time_scale, 0.8);
  EXPECT_DOUBLE_EQ(calibration_from_file(path, "h200").target_time_scale, 1.0);
  EXPECT_EXIT(calibration_from_file(path, "b200"), testing::ExitedWithCode(3), "no entry for GPU 'b200'");
  EXPECT_EXIT(calibration_from_file(path + ".absent", "h100"), testing::ExitedWithCode(3), "cannot be read");
  nlohmann::json bad = j;
  bad["gpus"][0]["drafter_time_scale"] = -1;
  std::ofstream(path) << bad.dump();
  EXPECT_EXIT(calibration_from_file(path, "h100"), testing::ExitedWithCode(3), "drafter_time_scale");
}

TEST(CostModelCalibration, ScaledKindsAreMarked) {
  EXPECT_EQ(calibration_for("h100").source, CalibrationSource::Measured);
  EXPECT_EQ(calibration_for("h200").source, CalibrationSource::Measured);
  for (const char* name : {"b200", "rtx-pro-6000", "96"}) {
    const GpuCalibration g = calibration_for(name);
    EXPECT_EQ(g.source, CalibrationSource::Scaled) << name;
    EXPECT_NE(g.basis.find("scaled, not measured"), std::string::npos) << name << ": " << g.basis;
    EXPECT_STREQ(calibration_source_name(g.source), "scaled, not measured");
  }
  // The RTX PRO 6000 has no NVLink: a plan over it is refused, PCIe is not.
  const GpuCalibration rtx = calibration_for("rtx-pro-6000");
  EXPECT_FALSE(has_link(TransportLink::NvLink, rtx));
  EXPECT_TRUE(has_link(TransportLink::Pcie, rtx));
  EXPECT_EXIT(transport_seconds(1e9, TransportLink::NvLink, rtx), testing::ExitedWithCode(3), "no nvlink link");
  // A GiB-only GPU: its memory, the H100's rates, power unknown.
  const GpuCalibration gib = calibration_for("96");
  EXPECT_DOUBLE_EQ(gib.memory_bytes, 96.0 * 1073741824.0);
  EXPECT_EQ(gib.tdp_watts, 0);
  EXPECT_EXIT(calibration_for("a100"), testing::ExitedWithCode(2), "no calibration for GPU 'a100'");
  // B200 faster than H100 in compute, RTX PRO slower.
  EXPECT_GT(calibration_for("b200").gemm_tflops, calibration_for("h100").gemm_tflops);
  EXPECT_LT(rtx.gemm_tflops, calibration_for("h100").gemm_tflops);
}

TEST(CostModel, DrafterSlowerWithMoreAnchorsAndLongerContext) {
  const GpuCalibration g = calibration_for("h100");
  const DrafterShape d = qwen3_8b_drafter();
  double last = 0;
  for (int64_t anchors : {256, 512, 1024, 2048, 3072}) {
    const double s = drafter_step_cost(d, DrafterBatchShape{16384, anchors, 3072}, g).seconds();
    EXPECT_GT(s, last) << anchors << " anchors";
    last = s;
  }
  last = 0;
  for (int64_t record : {512, 1024, 3072, 8192, 16384}) {
    const double s = drafter_step_cost(d, DrafterBatchShape{16384, 512, record}, g).seconds();
    EXPECT_GT(s, last) << "records of " << record;
    last = s;
  }
  // A sliding window bounds the attention: cheaper than full attention over long records.
  DrafterShape sliding = qwen36_27b_drafter(), full = qwen36_27b_drafter();
  full.layer_windows.assign(5, 0);
  const DrafterBatchShape long_records{16384, 512, 16384};
  EXPECT_LT(drafter_step_cost(sliding, long_records, g).attention_s, drafter_step_cost(full, long_records, g).attention_s);
  // KL costs a teacher lm_head more; the bf16 state moves fewer optimizer bytes; DFlash2 adds convs and a selector.
  const DrafterBatchShape b{3072, 512, 3072};
  EXPECT_GT(drafter_step_cost(qwen3_8b_drafter(LossObjective::KL), b, g).seconds(), drafter_step_cost(d, b, g).seconds());
  EXPECT_LT(drafter_step_cost(qwen3_8b_drafter(LossObjective::CE, OptimizerState::Bf16), b, g).optimizer_s,
            drafter_step_cost(d, b, g).optimizer_s);
  DrafterShape b8 = qwen36_27b_drafter();
  b8.block = 8;
  EXPECT_GT(drafter_step_cost(qwen36_27b_dflash2_drafter(), b, g).seconds(), drafter_step_cost(b8, b, g).seconds());
  EXPECT_NEAR(drafter_parameters(d) / 1e9, 1.05, 0.01);  // "1.05 B params" (bench/README-drafter.md)
}

TEST(CostModel, TargetForwardScalesWithTokensLayersAndRecordLength) {
  const GpuCalibration g = calibration_for("h200");
  const TargetShape t = qwen3_8b_target(36);
  EXPECT_LT(target_forward_cost(t, packed_batch_uniform(8192, 4096), g).seconds(),
            target_forward_cost(t, packed_batch_uniform(16384, 4096), g).seconds());
  // The capture cut: a CE job's 34 layers take less than all 36.
  EXPECT_LT(target_forward_cost(qwen3_8b_target(34), packed_batch_uniform(16384, 4096), g).seconds(),
            target_forward_cost(t, packed_batch_uniform(16384, 4096), g).seconds());
  // The quadratic term: the same tokens in shorter records attend over fewer pairs.
  EXPECT_LT(target_forward_cost(t, packed_batch_uniform(16384, 1024), g).attention_s,
            target_forward_cost(t, packed_batch_uniform(16384, 4096), g).attention_s);
  EXPECT_DOUBLE_EQ(packed_batch_uniform(10, 4).causal_pairs, 10 + 10 + 3);
  // The hybrid runs its delta rule on the Gated DeltaNet layers only.
  const TargetForwardCost h = target_forward_cost(qwen36_27b_target(64), packed_batch_uniform(32768, 4096), g);
  EXPECT_GT(h.linear_attention_s, 0);
  EXPECT_EQ(target_forward_cost(t, packed_batch_uniform(16384, 4096), g).linear_attention_s, 0);
  TargetShape empty;
  EXPECT_EXIT(target_forward_cost(empty, packed_batch_uniform(16, 16), g), testing::ExitedWithCode(3), "target shape");
}

TEST(CostModel, TransportAndAllreduce) {
  const GpuCalibration g = calibration_for("h100");
  // 5 captured layers x 16384 tokens x 4096 x bf16 + the index arrays
  const double bytes = batch_wire_bytes(16384, 4096, 5, false);
  EXPECT_DOUBLE_EQ(bytes, 16384.0 * 4096 * 5 * 2 + 16384.0 * 12);
  EXPECT_GT(batch_wire_bytes(16384, 4096, 5, true), bytes);  // KL: the final norm too
  EXPECT_LT(transport_seconds(bytes, TransportLink::NvLink, g), transport_seconds(bytes, TransportLink::Pcie, g));
  EXPECT_LT(transport_seconds(bytes, TransportLink::Pcie, g), transport_seconds(bytes, TransportLink::HostStaged, g));
  EXPECT_EQ(allreduce_seconds(1e9, 1, 1, g, 50), 0);
  // ring: 2 (n - 1) / n x 4 bytes a parameter at the bus bandwidth
  EXPECT_NEAR(allreduce_seconds(1e9, 4, 1, g, 50), 1.5 * 4e9 / (g.allreduce_busbw_gbps * 1e9), 1e-12);
  EXPECT_GT(allreduce_seconds(1e9, 8, 2, g, 50), allreduce_seconds(1e9, 8, 1, g, 50));  // across nodes: the NIC binds
}

}  // namespace

// An FP8 target (docs/fp8.md): the GEMM phase / fp8_gemm_speedup (fp8_token_gemm_speedup for FP8-Dynamic) on
// the sm_90 kinds, unchanged where the linears run dequantized (b200, rtx-pro-6000); nothing else moves.
TEST(CostModel, Fp8TargetDividesOnlyTheGemmsWhereTheKindHasTheFp8Gemm) {
  TargetShape t{TargetArch::DenseQwen3, 36, 4096, 12288, 32, 8, 128};
  const PackedBatchShape b = packed_batch_uniform(16384, 4096);
  for (const char* kind : {"h100", "h200", "b200", "rtx-pro-6000"}) {
    const GpuCalibration g = calibration_for(kind);
    t.linears = TargetShape::Linears::Bf16;
    const TargetForwardCost bf16 = target_forward_cost(t, b, g);
    // The block format and per token x per channel (FP8-Dynamic), each at its own measured factor
    // (bench/results/h100-issue44-45-46-20261206b, h100-speed-dflash2-fp8acc-20261206e).
    for (const auto& [linears, measured, table] :
         {std::tuple{TargetShape::Linears::Fp8, 1.14, g.fp8_gemm_speedup},
          std::tuple{TargetShape::Linears::Fp8Token, 1.82, g.fp8_token_gemm_speedup}}) {
      t.linears = linears;
      const TargetForwardCost fp8 = target_forward_cost(t, b, g);
      const double factor = has_fp8_block_gemm(g) ? measured : 1.0;
      EXPECT_EQ(table, factor) << kind;
      EXPECT_NEAR(fp8.gemm_s, bf16.gemm_s / factor, 1e-12) << kind;
      EXPECT_EQ(fp8.attention_s, bf16.attention_s) << kind;
      EXPECT_EQ(fp8.elementwise_s, bf16.elementwise_s) << kind;
    }
  }
}

}  // namespace dflash::plan
