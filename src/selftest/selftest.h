// dflash-selftest: runs a reference case (the layout of tests/data/golden/*: target/, optional
// drafter_init/, golden.safetensors, case.json) and reports one row per compared tensor.
//
// Output: `# `-prefixed metadata lines (case, backend, shapes), then a fixed-width table
//   name  shape  max_abs_err  rel_err  tol  PASS|FAIL
// rel_err = ||got - ref|| / ||ref||; a row passes when rel_err < tol (and both are finite).
#pragma once
#include <cstdint>
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

// The parts of a case. Each returns an exit code for the part (0 = it ran; PASS/FAIL live in the report).
int selftest_target(const std::string& case_dir, const Ctx& ctx, SelftestReport& report);
int selftest_drafter(const std::string& case_dir, const dflash::Ctx& ctx, SelftestReport& report);  // drafter part

// The program: dflash-selftest CASE_DIR [--backend cpu|cuda]. Returns the process exit code
// (0 all rows passed, 1 a row failed); bad usage and unsupported cases end through fatal().
int selftest_main(int argc, char** argv);

}  // namespace dflash
