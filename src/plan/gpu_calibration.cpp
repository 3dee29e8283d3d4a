// The calibration table and its JSON form: src/plan/gpu_calibration.h. Where each constant comes from is
// written beside it and in docs/cost_model.md "Calibration".
#include "plan/gpu_calibration.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dflash/error.h"

namespace dflash::plan {

namespace {

constexpr double kMiB = 1048576.0;

// Documented peaks the scaled kinds are derived from (vendor datasheets: dense bf16 tensor FLOP/s without
// sparsity, memory bandwidth, NVLink per direction, board power). docs/cost_model.md "Scaled kinds".
struct Peaks {
  double bf16_tflops, memory_tbps, nvlink_gbps, tdp_watts;
};
constexpr Peaks kH100Peaks{989, 3.35, 450, 700};
constexpr Peaks kB200Peaks{2250, 8.0, 900, 1000};
constexpr Peaks kRtxPro6000Peaks{504, 1.792, 0, 600};

// Achieved share of a documented link peak, for links no bench in the repository has measured yet (the
// two-GPU calls of bench/two_gpu/README.md): NCCL point to point and ring allreduce without NVLS reach about
// 80 % of the per-direction peak. An assumption, marked as one in docs/cost_model.md.
constexpr double kLinkEfficiency = 0.8;
// PCIe Gen5 x16: 64 GB/s per direction.
constexpr double kPcieGen5Gbps = 64;
// The host plane measured on one H200 with the system Open MPI: 6.0 GB/s (bench/planes/README.md).
constexpr double kHostStagedGbps = 6.0;

// The colocated layout's overlap, measured through the job on one H100 (bench/results/h100-issue44-45-46-20261206b,
// a random Qwen3-8B, 16384-token batches, 512 anchors per batch, after the per-shape GEMM autotune was fixed):
// the two roles taking turns (1-1, two processes sharing the GPU) 1 / 1.802 b/s = 0.555 s a batch, the model's
// roles 0.377 + 0.187 s scaled by that run's 0.984; both in one process 1 / 1.951 b/s = 0.513 s, so
// (0.555 - 0.513) / (0.187 x 0.984) = 0.23 of the shorter role hid under the other. (The first measurement,
// 0.20 in bench/results/h100-issue44-plan, ran while every batch paid a GEMM autotune.) Where both roles fill
// the GPU's memory the job measured less than back to back: src/plan/layout_plan.cpp models that regime.
constexpr double kColocatedOverlapH100 = 0.23;

// The H200, fitted to the measurements (docs/cost_model.md has the fit table):
//  gemm_tflops 705: the 8B forward's GEMMs 692 TFLOP/s and the 27B hybrid's 686-723 (bench/README.md "Issue
//    33's final numbers", "Results"), the drafters' layer GEMMs 713-759 (bench/README-drafter.md, issue 33).
//  target_attention_tflops 444: cuDNN's varlen causal attention in the 8B forward (bench/README.md).
//  drafter_attention_tflops 170 and drafter_block_overhead_us 4.0: the 8B block attention phase at S 3072
//    (34.9 ms, bench/README-drafter.md) together with the H100's 8B steps at S 16384 (issue 44), which need
//    the long-context rate; the same die and power limit on both kinds.
//  linear_attention_tflops 66: the gated delta rule, 9.9 TFLOP in 147-152 ms at 8 x 4096 (bench/README.md).
//  memory_tbps 3.7: AdamW at 3.5 TB/s, the norms and SwiGLU at 3.9-4.3 (bench/README.md, README-drafter.md).
GpuCalibration h200() {
  GpuCalibration g;
  g.name = "h200";
  g.model = "NVIDIA H200";
  g.source = CalibrationSource::Measured;
  g.basis = "fitted to bench/README.md and bench/README-drafter.md (H200, 2026-12-01..04) and issue 44's H100 steps";
  g.memory_bytes = 143771 * kMiB;  // nvidia-smi memory.total (src/runtime/options.cpp, parse_planned_gpu)
  g.gemm_tflops = 705;
  g.target_attention_tflops = 444;
  g.drafter_attention_tflops = 170;
  g.drafter_block_overhead_us = 4.0;
  g.linear_attention_tflops = 66;
  g.memory_tbps = 3.7;
  g.layer_overhead_us = 0;
  g.step_overhead_ms = 0;
  g.tdp_watts = 700;  // busy 618-688 W measured (bench/results/cudnn/power.txt, bench/results/pipeline)
  g.nvlink_gbps = kH100Peaks.nvlink_gbps * kLinkEfficiency;
  g.pcie_gbps = kPcieGen5Gbps * kLinkEfficiency;
  g.host_staged_gbps = kHostStagedGbps;
  g.allreduce_busbw_gbps = kH100Peaks.nvlink_gbps * kLinkEfficiency;
  // Measured on an H100 (bench/results/h100-issue44-45-46-20261206b): the forwards' GEMM phase, bf16 against
  // cuBLASLt's block-scaled FP8 (the activation quantization included): 8B 317.0 / 279.1 ms = 1.136, 27B
  // hybrid 2239.3 / 1952.4 ms = 1.147. The H200 (same die) takes it.
  g.fp8_gemm_speedup = 1.14;
  // The per-token x per-channel FP8 GEMM (compressed-tensors FP8-Dynamic, --target-precision fp8-dynamic), the
  // same phases with the activation quantization fused and fast accumulation (the sm_90 default,
  // docs/fp8.md "Accumulation"; bench/results/h100-speed-dflash2-fp8acc-20261206e): 8B 319.74 / 175.10 ms =
  // 1.826, 27B hybrid 2203.25 / 1209.03 ms = 1.822. (Exact accumulation: 8B 1.59.)
  g.fp8_token_gemm_speedup = 1.82;
  g.colocated_overlap = kColocatedOverlapH100;  // the H100's (same die); not measured on an H200
  return g;
}

// The H100: the same GH100 die at the same 700 W limit, so the compute rates are the H200's (its 8B forward
// measured 42.3 K tok/s against the H200's 41.1 K: issue 44, bench/README.md); memory-bound phases at its
// 3.35 TB/s against the H200's 4.8 (HBM3 vs HBM3e). Checked against issue 44's three H100 measurements.
GpuCalibration h100() {
  GpuCalibration g = h200();
  g.name = "h100";
  g.model = "NVIDIA H100 80GB HBM3";
  g.basis = "the H200's compute rates (same die and power limit), memory bandwidth x 3.35/4.8; checked against "
            "issue 44's H100 measurements (8B forward 42.3 K tok/s, 8B steps 271 and 1494 ms at S 16384)";
  g.memory_bytes = 81559 * kMiB;
  g.memory_tbps = 3.7 * 3.35 / 4.8;
  return g;
}

}  // namespace

const char* calibration_source_name(CalibrationSource s) {
  switch (s) {
    case CalibrationSource::Measured: return "measured";
    case CalibrationSource::Scaled: return "scaled, not measured";
    case CalibrationSource::User: return "user";
  }
  return "?";
}

GpuCalibration scaled_calibration(const GpuCalibration& reference, const std::string& name, const std::string& model,
                                  double memory_bytes, double compute_ratio, double memory_bw_ratio, double tdp_watts,
                                  double nvlink_gbps, double pcie_gbps, double allreduce_busbw_gbps) {
  GpuCalibration g = reference;
  g.name = name;
  g.model = model;
  g.source = CalibrationSource::Scaled;
  char basis[256];
  std::snprintf(basis, sizeof basis, "scaled, not measured: %s's rates x %.3f (peak dense bf16) and x %.3f (memory "
                "bandwidth)", reference.name.c_str(), compute_ratio, memory_bw_ratio);
  g.basis = basis;
  g.memory_bytes = memory_bytes;
  g.gemm_tflops *= compute_ratio;
  g.target_attention_tflops *= compute_ratio;
  g.drafter_attention_tflops *= compute_ratio;
  g.drafter_block_overhead_us /= compute_ratio;
  g.linear_attention_tflops *= compute_ratio;
  g.memory_tbps *= memory_bw_ratio;
  g.tdp_watts = tdp_watts;
  g.nvlink_gbps = nvlink_gbps;
  g.pcie_gbps = pcie_gbps;
  g.allreduce_busbw_gbps = allreduce_busbw_gbps;
  g.fp8_gemm_speedup = 1;  // another architecture: no block-scaled FP8 GEMM is known to run there
  g.fp8_token_gemm_speedup = 1;  // nor has the per-token one been measured there
  return g;
}

bool has_fp8_block_gemm(const GpuCalibration& g) { return g.name == "h100" || g.name == "h200"; }

const std::vector<GpuCalibration>& builtin_calibrations() {
  static const std::vector<GpuCalibration> table = [] {
    const GpuCalibration H100 = h100();
    std::vector<GpuCalibration> t{H100, h200()};
    t.push_back(scaled_calibration(H100, "b200", "NVIDIA B200", 183359 * kMiB, kB200Peaks.bf16_tflops / kH100Peaks.bf16_tflops,
                                   kB200Peaks.memory_tbps / kH100Peaks.memory_tbps, kB200Peaks.tdp_watts,
                                   kB200Peaks.nvlink_gbps * kLinkEfficiency, kPcieGen5Gbps * kLinkEfficiency,
                                   kB200Peaks.nvlink_gbps * kLinkEfficiency));
    // RTX PRO 6000 Blackwell (sm_120): no NVLink, PCIe Gen5; the gradient ring over PCIe. Its 99 KB of shared
    // memory per block refuses the fused block attention at head dim 128 and 256 (kernels/device_limits.cuh),
    // so the drafter's attention runs the chunked path, measured 1.45-1.75x slower on the H200
    // (bench/README-drafter.md "FA2 register layout", "head dim 256"): its rate and overhead take 1/1.6 more.
    GpuCalibration rtx = scaled_calibration(
        H100, "rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", 97887 * kMiB,
        kRtxPro6000Peaks.bf16_tflops / kH100Peaks.bf16_tflops, kRtxPro6000Peaks.memory_tbps / kH100Peaks.memory_tbps,
        kRtxPro6000Peaks.tdp_watts, 0, kPcieGen5Gbps * kLinkEfficiency, kPcieGen5Gbps * kLinkEfficiency);
    rtx.drafter_attention_tflops /= 1.6;
    rtx.drafter_block_overhead_us *= 1.6;
    rtx.basis += "; drafter attention / 1.6 (the chunked path under sm_120's shared memory)";
    t.push_back(rtx);
    return t;
  }();
  return table;
}

GpuCalibration calibration_for(const std::string& gpu_name) {
  for (const GpuCalibration& g : builtin_calibrations())
    if (g.name == gpu_name) return g;
  char* end = nullptr;
  const double gib = std::strtod(gpu_name.c_str(), &end);
  const bool number = !gpu_name.empty() && end && *end == '\0' && gpu_name.find_first_not_of("0123456789.") == std::string::npos;
  if (!number || !(gib > 0 && gib < 1e5))
    fatal(ExitCode::BadOptions, "no calibration for GPU '" + gpu_name + "'",
          "give h100, h200, b200 or rtx-pro-6000, or the GPU's memory in GiB (e.g. 96)");
  // Only its memory is known: the H100's rates and PCIe, no NVLink, power unknown.
  const GpuCalibration H100 = builtin_calibrations().front();
  GpuCalibration g = scaled_calibration(H100, gpu_name + " GiB", "", gib * 1073741824.0, 1, 1, 0, 0, H100.pcie_gbps,
                                        H100.pcie_gbps);
  g.basis = "scaled, not measured: a GPU known by its memory only, given the H100's rates, PCIe links and no power";
  return g;
}

GpuCalibration calibration_for_memory(double bytes) {
  for (const GpuCalibration& g : builtin_calibrations())
    if (std::abs(g.memory_bytes - bytes) <= 0.005 * g.memory_bytes) return g;
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.0f", bytes / 1073741824.0);
  return calibration_for(gib);
}

// ---- JSON ------------------------------------------------------------------------------------------------

nlohmann::json calibrations_to_json(const std::vector<GpuCalibration>& gpus) {
  nlohmann::json arr = nlohmann::json::array();
  for (const GpuCalibration& g : gpus)
    arr.push_back({{"name", g.name},
                   {"model", g.model},
                   {"source", calibration_source_name(g.source)},
                   {"basis", g.basis},
                   {"memory_bytes", g.memory_bytes},
                   {"gemm_tflops", g.gemm_tflops},
                   {"target_attention_tflops", g.target_attention_tflops},
                   {"drafter_attention_tflops", g.drafter_attention_tflops},
                   {"drafter_block_overhead_us", g.drafter_block_overhead_us},
                   {"linear_attention_tflops", g.linear_attention_tflops},
                   {"memory_tbps", g.memory_tbps},
                   {"layer_overhead_us", g.layer_overhead_us},
                   {"step_overhead_ms", g.step_overhead_ms},
                   {"tdp_watts", g.tdp_watts},
                   {"nvlink_gbps", g.nvlink_gbps},
                   {"pcie_gbps", g.pcie_gbps},
                   {"host_staged_gbps", g.host_staged_gbps},
                   {"allreduce_busbw_gbps", g.allreduce_busbw_gbps},
                   {"colocated_overlap", g.colocated_overlap}});
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i].target_time_scale != 1) arr[i]["target_time_scale"] = gpus[i].target_time_scale;
    if (gpus[i].drafter_time_scale != 1) arr[i]["drafter_time_scale"] = gpus[i].drafter_time_scale;
    if (gpus[i].fp8_gemm_speedup != 1) arr[i]["fp8_gemm_speedup"] = gpus[i].fp8_gemm_speedup;
    if (gpus[i].fp8_token_gemm_speedup != 1) arr[i]["fp8_token_gemm_speedup"] = gpus[i].fp8_token_gemm_speedup;
  }
  return {{"version", kCalibrationVersion}, {"gpus", arr}};
}

std::vector<GpuCalibration> calibrations_from_json(const nlohmann::json& j, const std::string& where) {
  const std::string hint = "a calibration file is {\"version\": " + std::to_string(kCalibrationVersion) +
                           ", \"gpus\": [...]} as src/plan/calibration/gpus.json (docs/cost_model.md)";
  if (!j.is_object() || !j.contains("version") || !j["version"].is_number_integer() || !j.contains("gpus") ||
      !j["gpus"].is_array())
    fatal(ExitCode::BadInput, where + ": not a calibration table", hint);
  if (j["version"].get<int>() != kCalibrationVersion)
    fatal(ExitCode::BadInput, where + ": calibration version " + std::to_string(j["version"].get<int>()) +
                                  ", this build reads version " + std::to_string(kCalibrationVersion),
          "recalibrate with bench/calibrate_sweep.sh (docs/cost_model.md)");
  std::vector<GpuCalibration> out;
  for (const nlohmann::json& e : j["gpus"]) {
    auto text = [&](const char* k) {
      if (!e.contains(k) || !e[k].is_string()) fatal(ExitCode::BadInput, where + ": a GPU entry lacks \"" + k + "\"", hint);
      return e[k].get<std::string>();
    };
    auto number = [&](const char* k, bool positive) {
      if (!e.contains(k) || !e[k].is_number()) fatal(ExitCode::BadInput, where + ": a GPU entry lacks \"" + k + "\"", hint);
      const double v = e[k].get<double>();
      if (!std::isfinite(v) || v < 0 || (positive && v <= 0))
        fatal(ExitCode::BadInput, where + ": \"" + k + "\" of " + e.value("name", "?") + " must be " +
                                      (positive ? "> 0" : ">= 0"), hint);
      return v;
    };
    GpuCalibration g;
    g.name = text("name");
    g.model = text("model");
    const std::string src = text("source");
    g.source = src == "measured" ? CalibrationSource::Measured
               : src == "user"   ? CalibrationSource::User
                                 : CalibrationSource::Scaled;
    g.basis = text("basis");
    g.memory_bytes = number("memory_bytes", true);
    g.gemm_tflops = number("gemm_tflops", true);
    g.target_attention_tflops = number("target_attention_tflops", true);
    g.drafter_attention_tflops = number("drafter_attention_tflops", true);
    g.drafter_block_overhead_us = number("drafter_block_overhead_us", false);
    g.linear_attention_tflops = number("linear_attention_tflops", true);
    g.memory_tbps = number("memory_tbps", true);
    g.layer_overhead_us = number("layer_overhead_us", false);
    g.step_overhead_ms = number("step_overhead_ms", false);
    g.tdp_watts = number("tdp_watts", false);
    g.nvlink_gbps = number("nvlink_gbps", false);
    g.pcie_gbps = number("pcie_gbps", false);
    g.host_staged_gbps = number("host_staged_gbps", false);
    g.allreduce_busbw_gbps = number("allreduce_busbw_gbps", false);
    g.colocated_overlap = e.contains("colocated_overlap") ? number("colocated_overlap", false) : 0.0;
    if (g.colocated_overlap > 1)
      fatal(ExitCode::BadInput, where + ": \"colocated_overlap\" of " + g.name + " must be at most 1", hint);
    g.target_time_scale = e.contains("target_time_scale") ? number("target_time_scale", true) : 1.0;
    g.drafter_time_scale = e.contains("drafter_time_scale") ? number("drafter_time_scale", true) : 1.0;
    g.fp8_gemm_speedup = e.contains("fp8_gemm_speedup") ? number("fp8_gemm_speedup", true) : 1.0;
    g.fp8_token_gemm_speedup =
        e.contains("fp8_token_gemm_speedup") ? number("fp8_token_gemm_speedup", true) : 1.0;
    out.push_back(g);
  }
  return out;
}

GpuCalibration calibration_from_file(const std::string& path, const std::string& gpu_name) {
  std::ifstream in(path);
  if (!in)
    fatal(ExitCode::BadInput, "--calibration " + path + ": cannot be read",
          "give the calibration.json dflash-report wrote (OUT/calibration.json), or drop --calibration");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fatal(ExitCode::BadInput, "--calibration " + path + ": not JSON (" + e.what() + ")",
          "give the calibration.json dflash-report wrote (OUT/calibration.json)");
  }
  const std::vector<GpuCalibration> gpus = calibrations_from_json(j, "--calibration " + path);
  for (const GpuCalibration& g : gpus)
    if (g.name == gpu_name) return g;
  if (gpus.size() == 1) return gpus.front();
  std::string names;
  for (const GpuCalibration& g : gpus) names += (names.empty() ? "" : ", ") + g.name;
  fatal(ExitCode::BadInput, "--calibration " + path + ": no entry for GPU '" + gpu_name + "' (it has: " + names + ")",
        "give --gpu one of the file's GPUs, or a file made on this GPU kind");
}

}  // namespace dflash::plan
