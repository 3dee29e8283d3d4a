// Token dataset: write/read round trip, every validation error (exit code 3), JSONL conversion.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <string>
#include <vector>

#include "dflash/data.h"
#include "dflash/error.h"
#include "test_support.h"

using namespace dflash;

namespace {

std::string make_temp_dir() { return test::make_temp_dir("dflash-data-test-"); }

// Writes arbitrary (possibly invalid) arrays with the raw HDF5 API, bypassing write_token_dataset's checks.
void write_raw(const std::string& path, const std::vector<int32_t>& tokens, const std::vector<int64_t>& offsets,
               const std::vector<uint8_t>& mask, int vocab = 100, bool with_mask = true) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  auto put = [&](const char* name, hid_t type, const void* data, size_t n) {
    hsize_t dim = n;
    hid_t s = H5Screate_simple(1, &dim, nullptr);
    hid_t d = H5Dcreate2(f, name, type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (n) H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(d);
    H5Sclose(s);
  };
  put("tokens", H5T_NATIVE_INT32, tokens.data(), tokens.size());
  put("offsets", H5T_NATIVE_INT64, offsets.data(), offsets.size());
  if (with_mask) put("loss_mask", H5T_NATIVE_UINT8, mask.data(), mask.size());
  hid_t s = H5Screate(H5S_SCALAR);
  int64_t v = vocab, fmt = kTokenDatasetFormatVersion;
  hid_t a = H5Acreate2(f, "vocab_size", H5T_NATIVE_INT64, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a);
  a = H5Acreate2(f, "format_version", H5T_NATIVE_INT64, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &fmt);
  H5Aclose(a);
  H5Sclose(s);
  H5Fclose(f);
}

TokenRecords sample_records() {
  TokenRecords r;
  r.add({1, 2, 3}, {0, 1, 1});
  r.add({4, 5});
  r.add({6, 7, 8, 9}, {0, 0, 1, 1});
  return r;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

}  // namespace

TEST(Data, WriteReadRoundTrip) {
  std::string dir = make_temp_dir();
  TokenRecords rec = sample_records();
  write_token_dataset(dir + "/d.h5", rec, 100, "test-tok");
  TokenDataset ds(dir + "/d.h5", 100);
  EXPECT_EQ(ds.num_records(), 3u);
  EXPECT_EQ(ds.num_tokens(), 9);
  EXPECT_EQ(ds.record_length(2), 4);
  EXPECT_EQ(ds.vocab_size(), 100);
  EXPECT_EQ(ds.tokenizer(), "test-tok");
  EXPECT_EQ(ds.format_version(), kTokenDatasetFormatVersion);
  TokenRecords back = ds.read_all();
  EXPECT_EQ(back.tokens, rec.tokens);
  EXPECT_EQ(back.offsets, rec.offsets);
  EXPECT_EQ(back.loss_mask, rec.loss_mask);
  std::vector<int32_t> t;
  std::vector<uint8_t> m;
  ds.read_record(2, t, m, 3);  // cut to 3 tokens
  EXPECT_EQ(t, (std::vector<int32_t>{6, 7, 8}));
  EXPECT_EQ(m, (std::vector<uint8_t>{0, 0, 1}));
}

TEST(Data, ValidOffsetsAndVocabFromFileAttribute) {
  std::string dir = make_temp_dir();
  write_raw(dir + "/ok.h5", {1, 2, 99}, {0, 1, 3}, {1, 1, 1}, 100);
  TokenDataset ds(dir + "/ok.h5", 0);  // 0 = use the file's vocab_size
  EXPECT_EQ(ds.num_records(), 2u);
}

using DataDeathTest = ::testing::Test;

TEST(DataDeathTest, MissingFile) {
  EXPECT_EXIT(TokenDataset("/nonexistent/x.h5", 100), testing::ExitedWithCode(3), "cannot read dataset /nonexistent/x.h5");
}

TEST(DataDeathTest, NotHdf5) {
  std::string dir = make_temp_dir();
  write_text(dir + "/x.h5", "this is not hdf5");
  EXPECT_EXIT(TokenDataset(dir + "/x.h5", 100), testing::ExitedWithCode(3), "is not an HDF5 file");
}

TEST(DataDeathTest, OffsetsMustStartAtZero) {
  std::string dir = make_temp_dir();
  write_raw(dir + "/b.h5", {1, 2, 3}, {1, 2, 3}, {1, 1, 1});
  EXPECT_EXIT(TokenDataset(dir + "/b.h5", 100), testing::ExitedWithCode(3), "offsets.0. is 1, must be 0");
}

TEST(DataDeathTest, OffsetsMustNotDecrease) {
  std::string dir = make_temp_dir();
  write_raw(dir + "/b.h5", {1, 2, 3, 4}, {0, 3, 2, 4}, {1, 1, 1, 1});
  EXPECT_EXIT(TokenDataset(dir + "/b.h5", 100), testing::ExitedWithCode(3), "offsets decrease at record 1");
}

TEST(DataDeathTest, EmptyRecord) {
  std::string dir = make_temp_dir();
  write_raw(dir + "/b.h5", {1, 2, 3}, {0, 2, 2, 3}, {1, 1, 1});
  EXPECT_EXIT(TokenDataset(dir + "/b.h5", 100), testing::ExitedWithCode(3), "b.h5: record 1 is empty");
}

TEST(DataDeathTest, OffsetsMustEndAtTokenCount) {
  std::string dir = make_temp_dir();
  write_raw(dir + "/b.h5", {1, 2, 3, 4}, {0, 2, 3}, {1, 1, 1, 1});
  EXPECT_EXIT(TokenDataset(dir + "/b.h5", 100), testing::ExitedWithCode(3), "offsets end at 3 but /tokens has 4");
}

TEST(DataDeathTest, MaskLengthMustMatch) {
  std::string dir = make_temp_dir();
  write_raw(dir + "/b.h5", {1, 2, 3}, {0, 3}, {1, 1});
  EXPECT_EXIT(TokenDataset(dir + "/b.h5", 100), testing::ExitedWithCode(3), "/loss_mask has 2 entries but /tokens has 3");
}

TEST(DataDeathTest, MissingLossMask) {
  std::string dir = make_temp_dir();
  write_raw(dir + "/b.h5", {1, 2, 3}, {0, 3}, {}, 100, /*with_mask=*/false);
  EXPECT_EXIT(TokenDataset(dir + "/b.h5", 100), testing::ExitedWithCode(3), "has no /loss_mask");
}

TEST(DataDeathTest, IdOutsideTargetVocab) {
  std::string dir = make_temp_dir();
  write_raw(dir + "/b.h5", {1, 2, 3, 4, 50}, {0, 2, 3, 5}, {1, 1, 1, 1, 1}, 50);
  // Outside the target's 50 ids: record 2, position 1.
  EXPECT_EXIT(TokenDataset(dir + "/b.h5", 50), testing::ExitedWithCode(3), "record 2 has token id 50 at position 1");
}

// The vocab_size attribute: the target's, or up to min(2048, V/16) padding rows more in the target.
TEST(DataDeathTest, DatasetOfAnotherVocabularyIsRefused) {
  std::string dir = make_temp_dir();
  for (int attr : {100, 40}) {
    const std::string p = dir + "/v" + std::to_string(attr) + ".h5";
    write_raw(p, {1, 2, 3, 4, 5}, {0, 2, 5}, {1, 1, 1, 1, 1}, attr);
    EXPECT_EXIT(TokenDataset(p, 50), testing::ExitedWithCode(3),
                "tokenized for a vocabulary of " + std::to_string(attr) + " ids .*the target has 50 embedding rows");
  }
  write_raw(dir + "/v47.h5", {1, 2, 3, 4, 5}, {0, 2, 5}, {1, 1, 1, 1, 1}, 47);  // 3 padding rows: fine
  EXPECT_EQ(TokenDataset(dir + "/v47.h5", 50).vocab_size(), 47);
}

TEST(DataDeathTest, NegativeId) {
  std::string dir = make_temp_dir();
  write_raw(dir + "/b.h5", {1, -3}, {0, 1, 2}, {1, 1});
  EXPECT_EXIT(TokenDataset(dir + "/b.h5", 100), testing::ExitedWithCode(3), "record 1 has token id -3");
}

TEST(DataDeathTest, EmptyDataset) {
  std::string dir = make_temp_dir();
  write_raw(dir + "/b.h5", {}, {0}, {});
  EXPECT_EXIT(TokenDataset(dir + "/b.h5", 100), testing::ExitedWithCode(3), "b.h5 is empty");
}

TEST(DataDeathTest, WriterRefusesEmptyDataset) {
  std::string dir = make_temp_dir();
  TokenRecords none;
  EXPECT_EXIT(write_token_dataset(dir + "/e.h5", none, 10, "t"), testing::ExitedWithCode(3), "empty dataset");
}

// ---- JSONL conversion ----------------------------------------------------------------------------

TEST(Data, JsonlRoundTrip) {
  std::string dir = make_temp_dir();
  write_text(dir + "/in.jsonl",
             "{\"input_ids\": [5, 6, 7], \"loss_mask\": [0, 1, 1]}\n"
             "\n"
             "{\"input_ids\": [8, 9]}\n"
             "{\"input_ids\": [1], \"loss_mask\": null, \"text\": \"ignored\"}\n");
  PrepResult r = convert_jsonl_to_dataset(dir + "/in.jsonl", dir + "/out.h5", 10, "tok", Progress::Quiet);
  EXPECT_EQ(r.records, 3);
  EXPECT_EQ(r.tokens, 6);
  EXPECT_EQ(r.loss_tokens, 5);
  TokenDataset ds(dir + "/out.h5", 10);
  TokenRecords back = ds.read_all();
  EXPECT_EQ(back.tokens, (std::vector<int32_t>{5, 6, 7, 8, 9, 1}));
  EXPECT_EQ(back.offsets, (std::vector<int64_t>{0, 3, 5, 6}));
  EXPECT_EQ(back.loss_mask, (std::vector<uint8_t>{0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(ds.tokenizer(), "tok");
}

TEST(DataDeathTest, JsonlBadLinesNameTheLine) {
  std::string dir = make_temp_dir();
  const std::string p = dir + "/in.jsonl";
  write_text(p, "{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 2\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, Progress::Quiet), testing::ExitedWithCode(3), "in.jsonl:2: not valid JSON");
  write_text(p, "{\"input_ids\": [1, 2]}\n\n{\"input_ids\": [1, 12]}\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, Progress::Quiet), testing::ExitedWithCode(3),
              "in.jsonl:3: \"input_ids\".1. = 12 is outside .0, 10.");
  write_text(p, "{\"input_ids\": [1, 2], \"loss_mask\": [1]}\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, Progress::Quiet), testing::ExitedWithCode(3),
              "in.jsonl:1: \"loss_mask\" has 1 entries for 2 input_ids");
  write_text(p, "{\"input_ids\": [1, 2], \"loss_mask\": [1, 3]}\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, Progress::Quiet), testing::ExitedWithCode(3), "in.jsonl:1: \"loss_mask\".1. = 3");
  write_text(p, "{\"ids\": [1]}\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, Progress::Quiet), testing::ExitedWithCode(3), "in.jsonl:1: no \"input_ids\"");
  write_text(p, "{\"input_ids\": []}\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, Progress::Quiet), testing::ExitedWithCode(3), "in.jsonl:1: \"input_ids\" is empty");
  write_text(p, "{\"input_ids\": [1, 2.5]}\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, Progress::Quiet), testing::ExitedWithCode(3), "not an integer");
  write_text(p, "\n\n");
  EXPECT_EXIT(read_jsonl_records(p, 10, Progress::Quiet), testing::ExitedWithCode(3), "holds no records");
}
