// Per-GPU-kind constants of the cost model (src/plan/cost_model.h): achieved rates, not peaks. H100 and H200
// are fitted to the measurements recorded in bench/README.md, bench/README-drafter.md and issue 44; the other
// kinds are scaled from those by their documented peak dense bf16 FLOP/s, memory bandwidth and links, and say
// so ("scaled, not measured"). The table is versioned; src/plan/calibration/gpus.json is its JSON form (a unit
// test keeps the two equal) and the form a later `--calibration FILE` (a user's own cluster) takes.
// docs/cost_model.md lists which measurement each constant came from and how to recalibrate.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dflash::plan {

// Version of the table's layout and fit; a calibration file of another version is refused.
constexpr int kCalibrationVersion = 1;

enum class CalibrationSource : uint8_t { Measured, Scaled, User };
const char* calibration_source_name(CalibrationSource s);  // "measured", "scaled, not measured", "user"

struct GpuCalibration {
  std::string name;   // "h100", as --gpu names it
  std::string model;  // "NVIDIA H100 80GB HBM3"
  CalibrationSource source = CalibrationSource::Measured;
  std::string basis;  // which measurements (or which scaling) the constants come from
  double memory_bytes = 0;
  // Achieved rates (what the project's kernels reach on this kind, power-limited clocks included).
  double gemm_tflops = 0;               // bf16 GEMMs of the layers and the lm_head (cuBLASLt)
  double target_attention_tflops = 0;   // the target's varlen causal attention, forward (4 nh hd per pair)
  double drafter_attention_tflops = 0;  // the drafter's block attention, forward + backward (3.5 x the forward)
  double drafter_block_overhead_us = 0; // per (anchor block, drafter layer): the block attention's fixed cost
  double linear_attention_tflops = 0;   // the gated delta rule (8 dk dv per token and value head)
  double memory_tbps = 0;               // elementwise / memory-bound passes, AdamW
  double layer_overhead_us = 0;         // per target layer: launches and gaps
  double step_overhead_ms = 0;          // per drafter step: host work, launches
  // Power and links.
  double tdp_watts = 0;                 // board power at full load; 0 = unknown
  double nvlink_gbps = 0;               // achieved point-to-point, one direction, GB/s; 0 = no NVLink
  double pcie_gbps = 0;                 // achieved peer-to-peer over PCIe, one direction
  double host_staged_gbps = 0;          // D2H -> MPI -> H2D through host memory
  double allreduce_busbw_gbps = 0;      // NCCL ring bus bandwidth inside one node (NVLink, else PCIe)
  // The colocated layout (both roles on every GPU, two streams): the share of the shorter role's time hidden
  // under the longer one, in [0, 1] (docs/cost_model.md "The colocated layout"). Optional in a file (absent =
  // 0: the roles take turns).
  double colocated_overlap = 0;
  // A run's correction (dflash-report's calibration.json, source "user"): observed / predicted seconds of the
  // target's forward and of the drafter's step, multiplied into every phase of each. 1 in the built-in table;
  // optional in a file (absent = 1), written only where not 1.
  double target_time_scale = 1, drafter_time_scale = 1;
  // An FP8 target's linears (docs/fp8.md): their GEMM time is the bf16 GEMMs' divided by this: the
  // fine-grained block format's (fp8_gemm_speedup), or the per-token x per-channel one's (FP8-Dynamic,
  // fp8_token_gemm_speedup). > 1 only where measured (sm_90: h100, h200); 1 where FP8 linears run dequantized
  // at bf16 speed (b200, rtx-pro-6000, a GPU known by its memory only: not measured). Optional in a file
  // (absent = 1), written only where not 1.
  double fp8_gemm_speedup = 1;
  double fp8_token_gemm_speedup = 1;
};

// Whether a kind runs an FP8 target's linears as block-scaled FP8 GEMMs, with its weights at 1 byte each
// (cuBLASLt's VEC128_32F scales exist on sm_90 only: docs/fp8.md): h100 and h200.
bool has_fp8_block_gemm(const GpuCalibration& g);

// The repository's table, version kCalibrationVersion: h100, h200 (measured), b200, rtx-pro-6000 (scaled).
const std::vector<GpuCalibration>& builtin_calibrations();
// By --gpu's name (h100, h200, b200, rtx-pro-6000), or a size in GiB ("96"): a GiB-only GPU gets the H100's
// rates (scaled, not measured: only its memory is known). Fatal BadOptions on anything else.
GpuCalibration calibration_for(const std::string& gpu_name);
// A kind scaled from a measured reference by documented peaks: compute by peak dense bf16 FLOP/s, memory-bound
// phases by memory bandwidth, links as given. Marked Scaled, with the ratios in `basis`.
GpuCalibration scaled_calibration(const GpuCalibration& reference, const std::string& name, const std::string& model,
                                  double memory_bytes, double peak_bf16_tflops_ratio, double memory_bw_ratio,
                                  double tdp_watts, double nvlink_gbps, double pcie_gbps, double allreduce_busbw_gbps);

// The GPU a job sees, known by its memory (NVML's total): the built-in kind whose memory it is (within 0.5 %:
// an H100 80GB, an H200, ...), else calibration_for(its size in GiB).
GpuCalibration calibration_for_memory(double bytes);

// JSON form: {"version": 1, "gpus": [{...}, ...]}. from_json refuses (fatal BadInput) another version, a
// missing field or a non-positive rate.
nlohmann::json calibrations_to_json(const std::vector<GpuCalibration>& gpus);
std::vector<GpuCalibration> calibrations_from_json(const nlohmann::json& j, const std::string& where);
// A calibration file (--calibration): its entry for `gpu_name`, or its only entry; fatal BadInput when the file
// cannot be read or holds neither.
GpuCalibration calibration_from_file(const std::string& path, const std::string& gpu_name);

}  // namespace dflash::plan
