// dflash-selftest: runs a reference case (the layout of tests/data/golden/*: target/, optional
// drafter_init/, golden.safetensors, case.json) and reports one row per compared tensor.
//
// Output: `# `-prefixed metadata lines (case, backend, shapes), then a fixed-width table
//   name  shape  max_abs_err  rel_err  tol  PASS|FAIL
// rel_err = ||got - ref|| / ||ref|| (the FP8 part's fp8.shift row: |r - 1|, fp8_case.cpp); a row passes when
// rel_err < tol (and both are finite).
#pragma once
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "dflash/tensor.h"

namespace dflash {

struct Comparison {
  std::string name;
  std::vector<int64_t> shape;
  double max_abs_err = 0.0;
  double rel_err = 0.0;
  double tolerance = 0.0;
  bool passed() const;
};

// rel_err and max_abs_err of got against ref, n elements each (host float32).
Comparison compare_tensors(const std::string& name, const std::vector<int64_t>& shape, const float* got,
                           const float* ref, size_t n, double tolerance);

class SelftestReport {
 public:
  explicit SelftestReport(std::ostream& out) : out_(out) {}
  // Prints "# <line>" at once (metadata and notes).
  void note(const std::string& line);
  void add(Comparison c) { rows_.push_back(std::move(c)); }
  // compare_tensors + add.
  const Comparison& compare(const std::string& name, const std::vector<int64_t>& shape, const float* got,
                            const float* ref, size_t n, double tolerance);
  void print_table() const;
  const std::vector<Comparison>& rows() const { return rows_; }
  bool all_passed() const;  // true for an empty report
  int failures() const;

 private:
  std::ostream& out_;
  std::vector<Comparison> rows_;
};

// Relative-error tolerance for hidden states and logits on a backend: float32 CPU against the golden
// float64 reference 1e-5; bf16 CUDA 2e-2 up to six layers, 1e-2 more per layer beyond (the error grows with
// depth: selftest.cpp says what was measured).
double forward_tolerance(Device device, int64_t layers_passed);  // hidden[l]: l + 1; final norm, logits: L + 1

// The FP8 rows' tolerance (fp8_case.cpp says what was measured): hidden[l] after l + 1 layers, the final
// norm after L + 1. The row fp8.shift has its own (kFp8ShiftTolerance).
double fp8_forward_tolerance(Device device, int64_t layers_passed);

// ---- what the parts share (target_case.cpp) ----
class SafetensorsFile;
std::vector<int32_t> golden_i32(SafetensorsFile& g, const std::string& name);  // a 1-d I32 tensor
// The golden tensor `name` as float32, checked to have `shape` (fatal BadInput naming it otherwise).
std::vector<float> golden_f32(SafetensorsFile& g, const std::string& name, const std::vector<int64_t>& shape);
std::vector<float> download_f32(const Ctx& ctx, const Tensor& t);  // any device, any dtype -> host float32

// The case's target forward on the golden tokens, on the host as float32: every layer's output [L, T, H],
// the final norm [T, H], and (precision "" only) the logits [T, V]. precision: --target-precision ("" = the
// checkpoint's own; the target's shape is noted in the report then).
struct CaseForward {
  int64_t L = 0, T = 0, H = 0, V = 0;
  std::vector<float> hidden, final_norm, logits;
};
CaseForward forward_case(const std::string& case_dir, const Ctx& ctx, const std::string& precision,
                         SelftestReport& report);
// Rows <prefix>.hidden[l] (tolerance(l + 1)) and <prefix>.final_norm (tolerance(L + 1)): f against the golden
// file's <prefix>.hidden [L, T, H] and <prefix>.final_norm [T, H].
void compare_forward(SelftestReport& report, SafetensorsFile& golden, const std::string& prefix, const CaseForward& f,
                     const std::function<double(int64_t)>& tolerance);

// The parts of a case. Each returns an exit code for the part (0 = it ran; PASS/FAIL live in the report).
// forward_out (optional): the forward the rows compared, for the FP8 part's fp8.shift.
int selftest_target(const std::string& case_dir, const Ctx& ctx, SelftestReport& report,
                    CaseForward* forward_out = nullptr);
// The FP8 target (issue 46, docs/fp8.md): where the case has fp8.safetensors (tests/data/golden/
// gen_golden_fp8.py: transformers' fine-grained FP8 arithmetic), the target under --target-precision fp8
// against its fp8.hidden and fp8.final_norm, and the row fp8.shift (the FP8 forward's distance from the
// unquantized one, `unquantized` = selftest_target's forward, against the golden's); a note and nothing else
// where it has none.
int selftest_target_fp8(const std::string& case_dir, const Ctx& ctx, const CaseForward& unquantized,
                        SelftestReport& report);
int selftest_drafter(const std::string& case_dir, const dflash::Ctx& ctx, SelftestReport& report);  // drafter part

// The program: dflash-selftest CASE_DIR [--backend cpu|cuda]. Returns the process exit code
// (0 all rows passed, 1 a row failed); bad usage and unsupported cases end through fatal().
int selftest_main(int argc, char** argv);

}  // namespace dflash
