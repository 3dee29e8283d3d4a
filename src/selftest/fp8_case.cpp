// The FP8 part of dflash-selftest (issue 46, docs/fp8.md "The FP8 golden"): the case's target quantized on
// load (--target-precision fp8: 128x128 weight blocks, activations per token in groups of 128) against
// fp8.safetensors, which tests/data/golden/gen_golden_fp8.py made with transformers' own model code and its
// fine-grained FP8 arithmetic (float32). Rows fp8.hidden[l], fp8.final_norm and fp8.shift.
#include <algorithm>
#include <cmath>
#include <cstdio>
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
// - CUDA (bf16 activations and weights): the bf16 roundings move values across e4m3 rounding boundaries (one
//   e4m3 step is 32x a bf16 one), in the weights as they are quantized and in every linear's input, and the
//   flips cascade. Measured on an H100 (bench/results/h100-issue46-20261207e, the selftest at 8a104c2),
//   relative error after 1, 2, ... layers: qwen3-tiny-a 0.060, 0.069, 0.072, 0.076, 0.082, 0.084, final norm
//   0.086; qwen35-tiny-a 0.053, 0.083, 0.102, 0.127, final norm 0.127. transformers' own model code run in
//   bf16 with the golden's FP8 arithmetic lands further still (0.069 -> 0.096 and 0.065 -> 0.142;
//   tests/data/golden/README.md "The FP8 golden"): this is bf16's doing, not ours. The rule 8e-2 + 2.5e-2 per
//   layer passed leaves 1.4x over every measured row (1.27x over transformers' bf16 run). It catches an O(1)
//   error (a scale not applied, a transposed block) but not a skipped quantization (8-17 % from the FP8
//   golden at these sizes): the row fp8.shift below does.
double fp8_forward_tolerance(Device device, int64_t layers_passed) {
  if (device == Device::CPU) return layers_passed <= 1 ? 1e-4 : 5e-2;
  return 8e-2 + 2.5e-2 * static_cast<double>(std::max<int64_t>(1, layers_passed));
}

// The row fp8.shift: how far the FP8 forward moves from the same target run unquantized, against how far the
// golden's moves (golden.safetensors' target.* is the unquantized forward). r = ||ours_fp8 - ours_plain|| /
// ||golden_fp8 - golden_plain|| over every layer's output and the final norm; the row's rel_err is |r - 1|.
// Why: at the golden cases' sizes the CUDA forward's e4m3 boundary flips (above) put it 5-13 % from the
// float32 FP8 golden, as far as a forward that skipped the quantization would be (8-17 %), so the fp8.hidden
// rows alone cannot tell the two apart. r can: each FP8 forward is one draw of the quantization noise, and
// a draw lands as far from the unquantized forward as any other (transformers' own model code in bf16 with
// the golden's FP8 arithmetic: r = 0.98-1.06 per layer on both cases, tests/data/golden/README.md "The FP8
// golden"), while a skipped quantization gives r ~ 0 and a coarser or double one r >> 1.
constexpr double kFp8ShiftTolerance = 0.25;

namespace {

void compare_shift(SelftestReport& report, SafetensorsFile& fp8_golden, const CaseForward& fp8,
                   const CaseForward& plain, const std::string& case_dir) {
  SafetensorsFile golden(case_dir + "/golden.safetensors");
  const int64_t L = fp8.L, T = fp8.T, H = fp8.H;
  std::vector<float> ours_fp8 = fp8.hidden, ours_plain = plain.hidden;
  std::vector<float> gold_fp8 = golden_f32(fp8_golden, "fp8.hidden", {L, T, H});
  std::vector<float> gold_plain = golden_f32(golden, "target.hidden", {L, T, H});
  const auto append = [](std::vector<float>& v, const std::vector<float>& w) { v.insert(v.end(), w.begin(), w.end()); };
  append(ours_fp8, fp8.final_norm);
  append(ours_plain, plain.final_norm);
  append(gold_fp8, golden_f32(fp8_golden, "fp8.final_norm", {T, H}));
  append(gold_plain, golden_f32(golden, "target.final_norm", {T, H}));
  double ours = 0.0, gold = 0.0, max_abs = 0.0;
  for (size_t i = 0; i < ours_fp8.size(); ++i) {
    const double d_ours = static_cast<double>(ours_fp8[i]) - ours_plain[i];
    const double d_gold = static_cast<double>(gold_fp8[i]) - gold_plain[i];
    ours += d_ours * d_ours;
    gold += d_gold * d_gold;
    const double e = std::fabs(d_ours - d_gold);
    max_abs = (std::isnan(e) || e > max_abs) ? e : max_abs;
  }
  const double r = std::sqrt(ours) / (gold > 0.0 ? std::sqrt(gold) : 1.0);
  char line[256];
  std::snprintf(line, sizeof line,
                "fp8.shift: ||fp8 - unquantized|| / the golden's, over every layer and the final norm: r = %.4f "
                "(the row's rel_err is |r - 1|, tolerance %.2f; its max_abs_err: of the two shifts' difference)",
                r, kFp8ShiftTolerance);
  report.note(line);
  report.add(Comparison{"fp8.shift", {L + 1, T, H}, max_abs, std::fabs(r - 1.0), kFp8ShiftTolerance});
}

}  // namespace

int selftest_target_fp8(const std::string& case_dir, const Ctx& ctx, const CaseForward& unquantized,
                        SelftestReport& report) {
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
                                         : "8e-2 + 2.5e-2 per layer passed") + " relative");
  compare_forward(report, golden, "fp8", f,
                  [&](int64_t layers_passed) { return fp8_forward_tolerance(ctx.device, layers_passed); });
  compare_shift(report, golden, f, unquantized, case_dir);
  return 0;
}

}  // namespace dflash
