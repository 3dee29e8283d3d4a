// Mixing datasets (--data a.h5:0.7 --data b.h5:0.3, include/dflash/data_mix.h): slot counts per weight,
// the seeded table (same for a seed, other for another), slots within range and read from their file, one
// file read exactly as before, the loader resuming on a mix, the identity a resume checks, the refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "dflash/checkpoint.h"
#include "dflash/data.h"
#include "dflash/data_mix.h"
#include "test_support.h"

using namespace dflash;
using namespace std::chrono_literals;

namespace {

constexpr int kVocab = 1000000;

// A dataset of n records whose tokens say where they came from: token = tag * 100000 + record * 100 + position.
std::string make_file(const std::string& dir, const std::string& name, int n, int tag,
                      const std::string& tokenizer = "synthetic") {
  TokenRecords rec;
  for (int r = 0; r < n; ++r) {
    const int len = 2 + (r * 7) % 30;
    std::vector<int32_t> ids(len);
    for (int p = 0; p < len; ++p) ids[p] = tag * 100000 + r * 100 + p;
    rec.add(ids);
  }
  const std::string path = dir + "/" + name;
  write_token_dataset(path, rec, kVocab, tokenizer);
  return path;
}

struct Files {
  std::string dir, a, b;  // a: 50 records, b: 30 records
};
const Files& files() {
  static const Files f = [] {
    Files x;
    x.dir = test::make_temp_dir("dflash-mix-test-");
    x.a = make_file(x.dir, "a.h5", 50, 1);
    x.b = make_file(x.dir, "b.h5", 30, 2);
    return x;
  }();
  return f;
}

std::vector<std::pair<size_t, int64_t>> table(const DatasetMix& m) {
  std::vector<std::pair<size_t, int64_t>> t;
  for (size_t s = 0; s < m.num_records(); ++s) t.push_back(m.slot(s));
  return t;
}

std::vector<LoadedBatch> drain(Loader& loader) {
  std::vector<LoadedBatch> out;
  LoadedBatch b;
  while (loader.pop(b, 5000ms) == PopResult::Batch) out.push_back(b);
  return out;
}

}  // namespace

TEST(DataMix, SlotCountsFollowTheWeightsAndAddUpToTheRecords) {
  EXPECT_EQ(mix_slot_counts({200, 120}, {0.7, 0.3}), (std::vector<int64_t>{224, 96}));
  EXPECT_EQ(mix_slot_counts({200, 120}, {7, 3}), (std::vector<int64_t>{224, 96}));  // weights are relative
  EXPECT_EQ(mix_slot_counts({10, 10, 10}, {1, 1, 1}), (std::vector<int64_t>{10, 10, 10}));
  EXPECT_EQ(mix_slot_counts({3, 4}, {1, 1}), (std::vector<int64_t>{4, 3}));  // 3.5 each: the tie to the first
  EXPECT_EQ(mix_slot_counts({50, 30}, {0.7, 0.3}), (std::vector<int64_t>{56, 24}));
  EXPECT_EQ(mix_slot_counts({1000, 10}, {1, 1}), (std::vector<int64_t>{505, 505}));  // b repeats, a is subsampled
  // Largest remainder: the total is the records, always; each count within one of its exact share.
  for (int k = 0; k < 200; ++k) {
    std::vector<int64_t> rec{1 + k * 7 % 97, 1 + k * 13 % 89, 1 + k % 5};
    std::vector<double> w{0.1 + k % 7, 0.01 * (1 + k % 11), 1.0 / (1 + k % 3)};
    const std::vector<int64_t> c = mix_slot_counts(rec, w);
    const int64_t n = std::accumulate(rec.begin(), rec.end(), int64_t{0});
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), int64_t{0}), n);
    const double sum = w[0] + w[1] + w[2];
    for (size_t i = 0; i < 3; ++i) EXPECT_LT(std::abs(static_cast<double>(c[i]) - w[i] / sum * n), 1.0) << k;
  }
}

TEST(DataMix, SlotsNameRecordsOfTheirFileAndReadThem) {
  const DatasetMix m({{files().a, 0.7}, {files().b, 0.3}}, 7, kVocab);
  ASSERT_TRUE(m.is_mix());
  ASSERT_EQ(m.num_records(), 80u);
  EXPECT_EQ(m.file_slots(0), 56);
  EXPECT_EQ(m.file_slots(1), 24);
  EXPECT_DOUBLE_EQ(m.share(0), 0.7);
  std::map<std::pair<size_t, int64_t>, int> uses;
  int64_t tokens = 0;
  for (size_t s = 0; s < m.num_records(); ++s) {
    const auto [f, r] = m.slot(s);
    ASSERT_LT(f, 2u);
    ASSERT_GE(r, 0);
    ASSERT_LT(r, static_cast<int64_t>(m.file(f).num_records()));
    uses[{f, r}]++;
    EXPECT_EQ(m.record_length(s), m.file(f).record_length(static_cast<size_t>(r)));
    std::vector<int32_t> got, want;
    std::vector<uint8_t> got_mask, want_mask;
    m.read_record(s, got, got_mask, 5);
    m.file(f).read_record(static_cast<size_t>(r), want, want_mask, 5);
    EXPECT_EQ(got, want);
    EXPECT_EQ(got[0], static_cast<int32_t>((f + 1) * 100000 + r * 100));
    tokens += m.record_length(s);
  }
  EXPECT_EQ(m.num_tokens(), tokens);
  // a (50 records, 56 slots): every record, 6 of them twice; b (30 records, 24 slots): 24 distinct ones.
  int a_records = 0, a_twice = 0, b_records = 0;
  for (const auto& [fr, n] : uses) {
    if (fr.first == 0) {
      a_records++;
      a_twice += n == 2;
    } else {
      b_records++;
      EXPECT_EQ(n, 1);
    }
    EXPECT_LE(n, 2);
  }
  EXPECT_EQ(a_records, 50);
  EXPECT_EQ(a_twice, 6);
  EXPECT_EQ(b_records, 24);
  EXPECT_NE(m.summary().find("a.h5 70% (50 records -> 56 slots), "), std::string::npos) << m.summary();
  EXPECT_NE(m.summary().find("b.h5 30% (30 records -> 24 slots)"), std::string::npos) << m.summary();
}

TEST(DataMix, TheSameForASeedAndAnotherForAnotherSeed) {
  const std::vector<DataSource> src{{files().a, 0.7}, {files().b, 0.3}};
  const DatasetMix m1(src, 7, kVocab), m2(src, 7, kVocab), m3(src, 8, kVocab);
  EXPECT_EQ(table(m1), table(m2));
  EXPECT_NE(table(m1), table(m3));  // the seeded subsets differ
  EXPECT_EQ(m1.num_records(), m3.num_records());
  EXPECT_EQ(dataset_identity(m1), dataset_identity(m2));
  EXPECT_NE(dataset_identity(m1), dataset_identity(m3));
  // Other weights: another table, another identity, and the resume check names what differs.
  const DatasetMix m4({{files().a, 0.5}, {files().b, 0.5}}, 7, kVocab);
  EXPECT_NE(dataset_identity(m1), dataset_identity(m4));
  const std::string change = describe_identity_change(dataset_identity(m1), dataset_identity(m4));
  EXPECT_NE(change.find("slot_table differ"), std::string::npos) << change;
  EXPECT_NE(change.find("shares differ"), std::string::npos) << change;
  // The identity covers each file: d0.*, d1.*.
  EXPECT_NE(dataset_identity(m1).find(" d1.offsets="), std::string::npos) << dataset_identity(m1);
}

TEST(DataMix, OneFileIsTheFileItself) {
  const auto file = std::make_shared<const TokenDataset>(files().a, kVocab);
  for (double w : {0.0, 0.3}) {  // a weight on the only file means nothing
    const auto m = std::make_shared<const DatasetMix>(std::vector<DataSource>{{files().a, w}}, 7, kVocab);
    EXPECT_FALSE(m->is_mix());
    ASSERT_EQ(m->num_records(), file->num_records());
    for (size_t s = 0; s < m->num_records(); ++s) EXPECT_EQ(m->slot(s), (std::pair<size_t, int64_t>{0, static_cast<int64_t>(s)}));
    EXPECT_EQ(m->num_tokens(), file->num_tokens());
    EXPECT_EQ(m->path(), files().a);
    EXPECT_EQ(dataset_identity(*m), dataset_identity(*file));  // checkpoints of one file resume as before
    LoaderOptions o;
    o.token_budget = 40;
    o.max_epochs = 2;
    o.seed = 7;
    Loader from_mix(m, o), from_file(file, o);
    const std::vector<LoadedBatch> x = drain(from_mix), y = drain(from_file);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].batch.tokens, y[i].batch.tokens);
      EXPECT_EQ(x[i].records, y[i].records);
      EXPECT_EQ(x[i].next, y[i].next);
    }
  }
}

TEST(DataMix, LoaderCoversEverySlotAndResumesFromAPosition) {
  const auto m = std::make_shared<const DatasetMix>(std::vector<DataSource>{{files().a, 0.7}, {files().b, 0.3}}, 7, kVocab);
  LoaderOptions o;
  o.token_budget = 40;
  o.max_epochs = 2;
  o.seed = 7;
  o.num_shards = 2;
  std::multiset<std::pair<int64_t, int64_t>> seen;  // (epoch, slot)
  std::vector<LoadedBatch> shard0;
  for (int t = 0; t < 2; ++t) {
    o.shard_index = t;
    Loader l(m, o);
    const std::vector<LoadedBatch> all = drain(l);
    for (const LoadedBatch& b : all)
      for (int64_t s : b.records) seen.insert({b.epoch, s});
    if (t == 0) shard0 = all;
  }
  EXPECT_EQ(seen.size(), 2 * m->num_records());
  for (int64_t e = 0; e < 2; ++e)
    for (size_t s = 0; s < m->num_records(); ++s) EXPECT_EQ(seen.count({e, static_cast<int64_t>(s)}), 1u);
  // From the position after batch 3 of shard 0: the same batches as the run that went on.
  ASSERT_GT(shard0.size(), 6u);
  o.shard_index = 0;
  Loader resumed(m, o, shard0[3].next);
  const std::vector<LoadedBatch> rest = drain(resumed);
  ASSERT_EQ(rest.size(), shard0.size() - 4);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].batch.tokens, shard0[i + 4].batch.tokens);
    EXPECT_EQ(rest[i].index, shard0[i + 4].index);
  }
}

TEST(DataMix, ParsesWeightsAndTheListText) {
  const DataSource w = parse_data_source("a.h5:0.7");
  EXPECT_EQ(w.path, "a.h5");
  EXPECT_DOUBLE_EQ(w.weight, 0.7);
  EXPECT_EQ(parse_data_source("a.h5").weight, 0);
  EXPECT_EQ(parse_data_source("run:v2.h5").path, "run:v2.h5");  // not a number: part of the name
  EXPECT_EQ(parse_data_source("/data/x:1-2").path, "/data/x:1-2");
  EXPECT_EQ(parse_data_source("/data/x.h5:3").path, "/data/x.h5");
  EXPECT_EQ(data_sources_text({{"a.h5", 0}}), "a.h5");
  EXPECT_EQ(data_sources_text({{"a.h5", 0.3}}), "a.h5");  // one file: its path, as before mixes
  EXPECT_EQ(data_sources_text({{"a.h5", 0.7}, {"b.h5", 0.3}}), "a.h5:0.7,b.h5:0.3");
}

TEST(DataMixDeathTest, BadWeightsAndListsAreRefused) {
  EXPECT_EXIT(parse_data_source("a.h5:0"), testing::ExitedWithCode(2), "the weight 0 is not a number > 0");
  EXPECT_EXIT(parse_data_source("a.h5:-1"), testing::ExitedWithCode(2), "is not a number > 0");
  EXPECT_EXIT(check_data_sources({{"a.h5", 0}, {"b.h5", 0}}), testing::ExitedWithCode(2),
              "--data is given 2 times, and a.h5, b.h5 without a weight");
  EXPECT_EXIT(check_data_sources({{"a.h5", 0.5}, {"b.h5", 0}}), testing::ExitedWithCode(2), "b.h5 without a weight");
  EXPECT_EXIT(check_data_sources({{"a.h5", 0.5}, {"a.h5", 0.5}}), testing::ExitedWithCode(2), "--data a.h5 is given twice");
}

TEST(DataMixDeathTest, FilesThatDoNotMixAreRefused) {
  const std::string dir = files().dir;
  const std::string other = make_file(dir, "other-tokenizer.h5", 20, 3, "another/tokenizer");
  EXPECT_EXIT(DatasetMix({{files().a, 1}, {other, 1}}, 7, kVocab), testing::ExitedWithCode(3),
              "a mix trains on one tokenizer's ids");
  // One file under two names.
  const std::string link = dir + "/a-link.h5";
  ASSERT_EQ(::symlink(files().a.c_str(), link.c_str()), 0);
  EXPECT_EXIT(DatasetMix({{files().a, 1}, {link, 1}}, 7, kVocab), testing::ExitedWithCode(3), "are one file");
  // A weight too small for its file to get one slot of the 80.
  EXPECT_EXIT(DatasetMix({{files().a, 1}, {files().b, 0.001}}, 7, kVocab), testing::ExitedWithCode(2),
              "gets no record of the mix");
}
