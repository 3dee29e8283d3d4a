// The bench writer (bench/bench_common.h, CPU part): the row format with units under the header, missing
// cells, the metadata lines, --json taken out of argv and one parseable JSON line per case.
#define DFLASH_BENCH_WRITER_ONLY
#include "../../bench/bench_common.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

using dflash::bench::Cell;
using dflash::bench::num;
using dflash::bench::text;
using dflash::bench::Writer;

std::vector<std::string> lines_of(FILE* f) {
  std::rewind(f);
  std::vector<std::string> out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f)) {
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    out.push_back(s);
  }
  return out;
}

// Runs a small driver: the metadata, a three-column table, two cases (the second with a missing cell).
std::vector<std::string> run(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(args.size());
  FILE* f = std::tmpfile();
  Writer w("test_bench", argc, argv.data(), f);
  EXPECT_EQ(argc, 3);  // --json taken out
  EXPECT_EQ(std::string(argv[1]), "--model");
  w.begin("0 \"Fake GPU\", 1.0 GiB", "2 warm-up + 5 timed, CUDA events, median");
  w.meta("model", "8b");
  w.columns({text("case", 10), text("model", 5), num("T", "", 0), num("step_ms", "ms", 2), num("tok_per_s", "tok/s", 0)});
  w.row({"forward", "8b", 16384, 98.214, 166823.4});
  w.row({"gemm", "8b", 16384, 70.5});
  w.note("all checks passed");
  std::vector<std::string> out = lines_of(f);
  std::fclose(f);
  return out;
}

TEST(BenchWriter, MetadataThenFixedWidthRowsWithUnits) {
  const auto out = run({"test_bench", "--model", "8b"});
  ASSERT_GE(out.size(), 13u);
  EXPECT_EQ(out[0], "# bench: test_bench");
  EXPECT_EQ(out[1], "# command: test_bench --model 8b");
  EXPECT_EQ(out[2].rfind("# date: 20", 0), 0u);
  EXPECT_EQ(out[3].rfind("# build: ", 0), 0u);
  EXPECT_EQ(out[5], "# device: 0 \"Fake GPU\", 1.0 GiB");
  EXPECT_EQ(out[6], "# timing: 2 warm-up + 5 timed, CUDA events, median");
  EXPECT_EQ(out[8], "# model: 8b");
  // Header: the keys; under it the units, right-aligned over the numbers; then the rows, same widths.
  EXPECT_EQ(out[9], "# case       model      T step_ms tok_per_s");
  EXPECT_EQ(out[10], "#                            (ms)   (tok/s)");
  EXPECT_EQ(out[11], "  forward    8b     16384   98.21    166823");
  EXPECT_EQ(out[12], "  gemm       8b     16384   70.50         -");
  EXPECT_EQ(out[9].size(), out[11].size());
  EXPECT_EQ(out[13], "# all checks passed");
}

TEST(BenchWriter, JsonOneLinePerCase) {
  const auto out = run({"test_bench", "--json", "--model", "8b"});
  std::vector<nlohmann::json> cases;
  for (const auto& l : out) {
    if (l.empty() || l[0] == '#') continue;
    ASSERT_EQ(l[0], '{') << l;
    cases.push_back(nlohmann::json::parse(l));
  }
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_EQ(cases[0]["bench"], "test_bench");
  EXPECT_EQ(cases[0]["device"], "0 \"Fake GPU\", 1.0 GiB");
  EXPECT_EQ(cases[0]["case"], "forward");
  EXPECT_EQ(cases[0]["model"], "8b");
  EXPECT_EQ(cases[0]["T"], 16384);
  EXPECT_DOUBLE_EQ(cases[0]["step_ms"].get<double>(), 98.21);
  EXPECT_TRUE(cases[1]["tok_per_s"].is_null());
  EXPECT_TRUE(cases[0].contains("commit"));
}

TEST(BenchWriter, DisabledPrintsNothingNonFiniteIsMissingNoBlanksInText) {
  char a0[] = "x";
  char* argv[] = {a0, nullptr};
  int argc = 1;
  FILE* f = std::tmpfile();
  Writer w("x", argc, argv, f);
  w.columns({text("case"), num("ms", "ms", 1)});
  w.row({"a", 0.0 / 0.0});
  w.row({"b c", 1.0});
  w.set_enabled(false);
  w.row({"b", 1.0});
  w.meta("k", "v");
  const auto out = lines_of(f);
  std::fclose(f);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[2], "  a             -");
  EXPECT_EQ(out[3], "  b_c         1.0");  // blanks in text: '_', so a row splits into its columns
}

}  // namespace
