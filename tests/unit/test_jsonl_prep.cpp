// dflash-prep's JSONL reader (src/data/jsonl_prep.cpp): HF-style "labels" as the mask, --require-mask, and
// fields it does not use reported once each (include/dflash/jsonl_prep.h).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "dflash/data.h"
#include "dflash/jsonl_prep.h"
#include "test_support.h"

using namespace dflash;

namespace {

std::string write_jsonl(const std::string& text) {
  const std::string p = test::make_temp_dir("dflash-jsonl-prep-") + "/in.jsonl";
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST(JsonlPrep, LabelsBecomeTheMask) {
  const std::string p = write_jsonl(
      "{\"input_ids\": [5, 6, 7, 8], \"labels\": [-100, -100, 7, 8]}\n"
      "{\"input_ids\": [1, 2], \"loss_mask\": [0, 1], \"labels\": [-100, 2]}\n"
      "{\"input_ids\": [3, 4]}\n");
  JsonlPrepStats stats;
  TokenRecords r = read_jsonl_records(p, 10, JsonlPrepOptions{}, &stats);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 6, 7, 8, 1, 2, 3, 4}));
  EXPECT_EQ(r.loss_mask, (std::vector<uint8_t>{0, 0, 1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(stats.records_with_labels, 2);
  EXPECT_EQ(stats.records_with_loss_mask, 1);
  EXPECT_EQ(stats.records_without_mask, 1);
  EXPECT_TRUE(stats.unused_fields.empty());
}

TEST(JsonlPrep, UnusedFieldsAreReportedOnceEach) {
  const std::string p = write_jsonl(
      "{\"input_ids\": [1, 2], \"text\": \"hi\", \"attention_mask\": [1, 1]}\n"
      "{\"input_ids\": [3], \"text\": \"again\"}\n");
  JsonlPrepStats stats;
  testing::internal::CaptureStderr();
  read_jsonl_records(p, 10, JsonlPrepOptions{}, &stats);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(stats.unused_fields, (std::vector<std::string>{"attention_mask", "text"}));
  EXPECT_NE(err.find("in.jsonl:1: field \"text\" is not used"), std::string::npos) << err;
  EXPECT_NE(err.find("field \"attention_mask\" is not used"), std::string::npos) << err;
  EXPECT_EQ(err.find("in.jsonl:2"), std::string::npos) << "said once per field: " << err;
}

TEST(JsonlPrepDeathTest, RequireMaskAndBadLabels) {
  std::string p = write_jsonl("{\"input_ids\": [1, 2], \"labels\": [-100, 2]}\n{\"input_ids\": [1, 2]}\n");
  JsonlPrepOptions strict;
  strict.require_mask = true;
  EXPECT_EQ(read_jsonl_records(p, 10, JsonlPrepOptions{}, nullptr).loss_mask, (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EXIT(read_jsonl_records(p, 10, strict, nullptr), testing::ExitedWithCode(3),
              "in.jsonl:2: no \"loss_mask\" or \"labels\" .--require-mask.");
  p = write_jsonl("{\"input_ids\": [1, 2, 3], \"labels\": [2, 3, -100]}\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, JsonlPrepOptions{}, nullptr), testing::ExitedWithCode(3),
              "in.jsonl:1: \"labels\".0. = 2 is neither -100 nor input_ids.0. = 1");
  p = write_jsonl("{\"input_ids\": [1, 2], \"labels\": [-100]}\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, JsonlPrepOptions{}, nullptr), testing::ExitedWithCode(3),
              "\"labels\" has 1 entries for 2 input_ids");
  p = write_jsonl("{\"input_ids\": [1, 2], \"labels\": [-100, -7]}\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, JsonlPrepOptions{}, nullptr), testing::ExitedWithCode(3),
              "\"labels\".1. = -7 is neither -100");
  p = write_jsonl("{\"input_ids\": [1, 2], \"labels\": [-100, 2], \"loss_mask\": [1, 1]}\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, JsonlPrepOptions{}, nullptr), testing::ExitedWithCode(3),
              "\"loss_mask\".0. = 1 disagrees with \"labels\".0. = -100");
}
