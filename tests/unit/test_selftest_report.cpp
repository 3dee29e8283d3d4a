// dflash-selftest's comparison table and its target part (src/selftest/).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "dflash/safetensors.h"
#include "selftest/selftest.h"

namespace dflash {
namespace {

const std::string kCase = std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a";

TEST(SelftestReport, ComparisonMeasuresRelativeAndMaxError) {
  const std::vector<float> ref = {3.0f, 4.0f}, got = {3.0f, 4.5f};
  Comparison c = compare_tensors("x", {2}, got.data(), ref.data(), 2, 0.2);
  EXPECT_DOUBLE_EQ(c.max_abs_err, 0.5);
  EXPECT_DOUBLE_EQ(c.rel_err, 0.1);  // 0.5 / 5
  EXPECT_TRUE(c.passed());
  EXPECT_FALSE(compare_tensors("x", {2}, got.data(), ref.data(), 2, 0.05).passed());
  const std::vector<float> nan = {3.0f, NAN};
  EXPECT_FALSE(compare_tensors("x", {2}, nan.data(), ref.data(), 2, 1e9).passed());
}

TEST(SelftestReport, TablePrintsOneRowPerComparison) {
  std::ostringstream out;
  SelftestReport report(out);
  const std::vector<float> a = {1.0f, 2.0f}, b = {1.0f, 3.0f};
  report.note("case: test");
  report.compare("good", {2}, a.data(), a.data(), 2, 1e-5);
  report.compare("bad", {1, 2}, a.data(), b.data(), 2, 1e-5);
  report.print_table();
  EXPECT_EQ(report.failures(), 1);
  EXPECT_FALSE(report.all_passed());
  const std::string s = out.str();
  EXPECT_EQ(s.rfind("# case: test\n", 0), 0u);
  EXPECT_NE(s.find("good"), std::string::npos);
  EXPECT_NE(s.find("PASS"), std::string::npos);
  EXPECT_NE(s.find("[1, 2]"), std::string::npos);
  EXPECT_NE(s.find("FAIL"), std::string::npos);
}

TEST(SelftestReport, GoldenTargetPartPassesOnCpu) {
  std::ostringstream out;
  SelftestReport report(out);
  ASSERT_EQ(selftest_target(kCase, cpu_ctx(), report), 0);
  EXPECT_EQ(report.rows().size(), 6u + 2u);  // every layer, final_norm, logits
  EXPECT_TRUE(report.all_passed()) << out.str();
}

TEST(SelftestReport, PerturbedGoldenLayerFails) {
  // A case whose golden target.hidden[2] is off by 1e-3 relative: exactly that row must fail.
  char tmpl[] = "/tmp/dflash_selftest_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::filesystem::create_directory_symlink(std::filesystem::absolute(kCase + "/target"), dir + "/target");
  SafetensorsFile g(kCase + "/golden.safetensors");
  std::vector<std::vector<float>> keep;
  std::vector<TensorToWrite> out_tensors;
  for (const std::string& name : g.names()) {
    const TensorInfo& t = g.get(name);
    if (t.dtype != DType::F32) {
      out_tensors.push_back({name, t.dtype, t.shape, nullptr, t.data});
      continue;
    }
    keep.emplace_back(t.numel());
    to_f32(keep.back().data(), t.data, t.dtype, t.numel());
    if (name == "target.hidden") {
      const size_t layer = t.numel() / t.shape[0];
      for (size_t i = 2 * layer; i < 3 * layer; ++i) keep.back()[i] *= 1.001f;
    }
    out_tensors.push_back({name, DType::F32, t.shape, keep.back().data(), nullptr});
  }
  write_safetensors(dir + "/golden.safetensors", out_tensors);

  std::ostringstream out;
  SelftestReport report(out);
  ASSERT_EQ(selftest_target(dir, cpu_ctx(), report), 0);
  ASSERT_EQ(report.failures(), 1) << out.str();
  for (const Comparison& c : report.rows()) EXPECT_EQ(c.passed(), c.name != "target.hidden[2]") << c.name;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dflash
