// dflash-make-tiny: the default job's target loads, the dataset validates against it, and the data is the
// target's own continuation (its argmax predicts the next token far above chance), i.e. learnable.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "dflash/data.h"
#include "dflash/target.h"

using namespace dflash;

TEST(DataTiny, TargetAndDatasetFitAndAreLearnable) {
  const std::string bin = std::string(DFLASH_BIN_DIR) + "/dflash-make-tiny";
  struct stat st;
  if (::stat(bin.c_str(), &st) != 0) GTEST_SKIP() << "build the dflash-make-tiny target first (" << bin << ")";
  char tmpl[] = "/tmp/dflash-tiny-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  // A smaller variant of the default (fewer, shorter records) keeps the test fast.
  const std::string cmd = bin + " " + dir + " --seed 3 --records 48 --min-len 24 --max-len 40 --shards 3 > " + dir +
                          "/log.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "see " << dir << "/log.txt";

  const std::unique_ptr<TargetModel> target =
      make_target_model(load_target_config(dir + "/target"), dir + "/target", cpu_ctx(), {}, 4096);
  const Qwen3Config& c = target->config();
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.num_hidden_layers, 4);
  TokenDataset ds(dir + "/data.h5", c.vocab_size);
  ASSERT_EQ(ds.num_records(), 48u);
  TokenRecords rec = ds.read_all();
  for (size_t r = 0; r < ds.num_records(); ++r) {
    EXPECT_GE(ds.record_length(r), 24);
    EXPECT_LE(ds.record_length(r), 40);
    EXPECT_EQ(rec.loss_mask[rec.offsets[r]], 0) << "the prompt is not trained on";
    EXPECT_EQ(rec.loss_mask[rec.offsets[r + 1] - 1], 1);
  }

  // Full-context target argmax vs the next token of the data, at trained positions.
  PackedBatch b;
  b.tokens = rec.tokens;
  b.loss_mask = rec.loss_mask;
  b.cu_seqlens.assign(rec.offsets.begin(), rec.offsets.end());
  const int64_t T = b.num_tokens(), H = c.hidden_size, V = c.vocab_size;
  std::vector<float> norm(static_cast<size_t>(T * H)), logits(static_cast<size_t>(T * V));
  CaptureOut out;
  out.final_norm = cpu_view(norm.data(), {T, H});
  target->forward(b, out);
  target->lm_head_forward(cpu_view(logits.data(), {T, V}), cpu_view(norm.data(), {T, H}));
  int64_t hits = 0, total = 0;
  for (size_t r = 0; r < ds.num_records(); ++r)
    for (int64_t p = rec.offsets[r]; p + 1 < rec.offsets[r + 1]; ++p) {
      if (!rec.loss_mask[p + 1]) continue;
      const float* lg = logits.data() + p * V;
      hits += (std::max_element(lg, lg + V) - lg) == rec.tokens[p + 1];
      total++;
    }
  const double agree = double(hits) / double(total);
  EXPECT_GT(agree, 0.6) << "the data should mostly follow the target's own predictions (chance is 1/512)";
  std::printf("target argmax = next token at %.3f of %lld trained positions\n", agree, static_cast<long long>(total));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// dflash-prep end to end: a good conversion (vocab from --target) and a bad line reported with its number.
TEST(DataPrepApp, ConvertsAndReportsBadLines) {
  const std::string bin = std::string(DFLASH_BIN_DIR) + "/dflash-prep";
  struct stat st;
  if (::stat(bin.c_str(), &st) != 0) GTEST_SKIP() << "build the dflash-prep target first (" << bin << ")";
  char tmpl[] = "/tmp/dflash-prep-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string target = std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a/target";  // vocab 512
  {
    std::FILE* f = std::fopen((dir + "/in.jsonl").c_str(), "w");
    std::fputs("{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1]}\n{\"input_ids\": [511, 0]}\n", f);
    std::fclose(f);
    f = std::fopen((dir + "/bad.jsonl").c_str(), "w");
    std::fputs("{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [7, 512]}\n", f);
    std::fclose(f);
  }
  const std::string log = " > " + dir + "/log.txt 2>&1";
  int rc = std::system((bin + " " + dir + "/in.jsonl " + dir + "/out.h5 --target " + target + " --tokenizer t" + log).c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  ASSERT_EQ(WEXITSTATUS(rc), 0);
  TokenDataset ds(dir + "/out.h5", 512);
  EXPECT_EQ(ds.num_records(), 2u);
  EXPECT_EQ(ds.read_all().tokens, (std::vector<int32_t>{1, 2, 3, 511, 0}));

  rc = std::system((bin + " " + dir + "/bad.jsonl " + dir + "/bad.h5 --target " + target + log).c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 3);
  std::string text;
  {
    std::FILE* f = std::fopen((dir + "/log.txt").c_str(), "r");
    char buf[4096];
    size_t n = std::fread(buf, 1, sizeof(buf), f);
    std::fclose(f);
    text.assign(buf, n);
  }
  EXPECT_NE(text.find("bad.jsonl:2: \"input_ids\"[1] = 512 is outside [0, 512)"), std::string::npos) << text;
  EXPECT_NE(::stat((dir + "/bad.h5").c_str(), &st), 0) << "no output after a bad line";
  rc = std::system((bin + " " + dir + "/in.jsonl " + dir + "/x.h5 --vocab-size 512 --target " + target + log).c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2) << "both --vocab-size and --target";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}
