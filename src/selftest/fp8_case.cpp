// The FP8 part of dflash-selftest (issue 46, docs/fp8.md "The FP8 golden"): the case's target quantized on
// load (--target-precision fp8: 128x128 weight blocks, activations per token in groups of 128) against
// fp8.safetensors, which tests/data/golden/gen_golden_fp8.py made with transformers' own model code and its
// fine-grained FP8 arithmetic (float32). Rows fp8.hidden[l] and fp8.final_norm.
#include <filesystem>

#include "dflash/safetensors.h"
#include "selftest/selftest.h"

namespace dflash {

// Measured against the FP8 golden (tests/unit/test_fp8_target.cpp holds the same numbers on the CPU):
// - CPU (float32): both sides use torch's e4m3 cast, only the summation orders differ, but an activation on
//   an e4m3 rounding boundary rounds to the other code on one side (one e4m3 step is ~6 % of it) and each
//   such flip moves the next layers' inputs across more boundaries. The hybrid qwen35-tiny-a has none (at most
//   5.8e-6); the dense qwen3-tiny-a flips in layer 0 (1.25e-5) and reaches 2.2-2.3 % from layer 1 on, as
//   much as the reference moves between float32 and float64 itself. So: 1e-4 after one layer, 5e-2 beyond.
// - CUDA (bf16 activations between the linears): the bf16 forward's own rule (forward_tolerance) plus the
//   e4m3 boundary flips the bf16 roundings cause, ~1e-2 rms per linear's input (the GPU test
//   tests/gpu/test_fp8_target_gpu.cpp measured 3.8e-2 over two 128-aligned layers against the CPU
//   emulation): twice the bf16 rule plus 2e-2. Not yet calibrated on a GPU for the golden cases; a wrong op
//   (a scale not applied, a transposed block) shows up as O(1).
double fp8_forward_tolerance(Device device, int64_t layers_passed) {
  if (device == Device::CPU) return layers_passed <= 1 ? 1e-4 : 5e-2;
  return 2 * forward_tolerance(device, layers_passed) + 2e-2;
}

int selftest_target_fp8(const std::string& case_dir, const Ctx& ctx, SelftestReport& report) {
  const std::string path = case_dir + "/fp8.safetensors";
  if (!std::filesystem::exists(path)) {
    report.note("fp8 part: skipped (the case has no fp8.safetensors)");
    return 0;
  }
  const CaseForward f = forward_case(case_dir, ctx, "fp8", report);
  SafetensorsFile golden(path);
  report.note("fp8: the target under --target-precision fp8 against " + path +
              " (transformers' fine-grained FP8 arithmetic), tolerance " +
              (ctx.device == Device::CPU ? "1e-4 after one layer, 5e-2 beyond"
                                         : "2 x the bf16 rule + 2e-2") + " relative");
  compare_forward(report, golden, "fp8", f,
                  [&](int64_t layers_passed) { return fp8_forward_tolerance(ctx.device, layers_passed); });
  return 0;
}

}  // namespace dflash
