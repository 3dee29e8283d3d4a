// safetensors reader/writer and Checkpoint: the golden checkpoints, write->read round trips, and every
// malformed file giving a clear BadInput error (exit code 3), never a crash or a hang.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dflash/error.h"
#include "dflash/hf_config.h"
#include "dflash/safetensors.h"

using namespace dflash;

namespace {

const std::string kGolden = std::string(DFLASH_TEST_DATA) + "/golden/qwen3-tiny-a";
const int kBadInput = static_cast<int>(ExitCode::BadInput);

std::string make_temp_dir() {
  char tmpl[] = "/tmp/dflash_st_XXXXXX";
  char* d = ::mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? std::string(d) : std::string("/tmp");
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file with the given header text and `data_bytes` bytes of data.
std::string st_bytes(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\x01');
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_bytes(path)); }

class SafetensorsBad : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Writes a file into the temp dir and returns its path.
  std::string file(const std::string& name, const std::string& bytes) {
    std::string p = dir_ + "/" + name;
    write_bytes(p, bytes);
    return p;
  }
  std::string dir_;
};

}  // namespace

// ---- golden checkpoints --------------------------------------------------------------------------
TEST(Checkpoint, ReadsShardedGoldenTarget) {
  Checkpoint ck(kGolden + "/target");
  const nlohmann::json index = read_json(kGolden + "/target/model.safetensors.index.json");
  EXPECT_EQ(ck.names().size(), index["weight_map"].size());
  EXPECT_EQ(ck.shard_files().size(), 14u);
  // Sizes from the index's own metadata must match what the shards hold.
  size_t total_bytes = 0, total_params = 0;
  for (const std::string& shard : ck.shard_files()) {
    for (const std::string& n : ck.names_in_shard(shard)) {
      const TensorInfo& t = ck.get(n);
      EXPECT_EQ(t.dtype, DType::F32) << n;
      EXPECT_EQ(t.nbytes, t.numel() * 4) << n;
      total_bytes += t.nbytes;
      total_params += t.numel();
    }
    ck.release_shard(shard);
  }
  EXPECT_EQ(total_bytes, index["metadata"]["total_size"].get<size_t>());
  EXPECT_EQ(total_params, index["metadata"]["total_parameters"].get<size_t>());

  // load_f32 gives the shard's bytes, with the shape from config.json.
  Qwen3Config cfg = load_qwen3_config(kGolden + "/target/config.json");
  const std::string name = cfg.weight_prefix + "embed_tokens.weight";
  std::vector<float> w(static_cast<size_t>(cfg.vocab_size) * cfg.hidden_size);
  ck.load_f32(name, {cfg.vocab_size, cfg.hidden_size}, w.data());
  SafetensorsFile shard(kGolden + "/target/" + index["weight_map"][name].get<std::string>());
  const TensorInfo& t = shard.get(name);
  ASSERT_EQ(t.nbytes, w.size() * 4);
  EXPECT_EQ(std::memcmp(t.data, w.data(), t.nbytes), 0);
  double sumsq = 0;
  for (float v : w) sumsq += v * v;
  EXPECT_GT(sumsq, 0.0);
}

TEST(Checkpoint, ReadsSingleFileGoldenDrafter) {
  Checkpoint ck(kGolden + "/drafter_init");
  DrafterConfig d = load_drafter_config(kGolden + "/drafter_init/config.json");
  const int64_t H = d.layers.hidden_size;
  const int64_t k = static_cast<int64_t>(d.target_layer_ids.size());
  ASSERT_EQ(ck.shard_files(), std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(ck.has("fc.weight"));
  EXPECT_TRUE(ck.has("hidden_norm.weight"));
  EXPECT_TRUE(ck.has("norm.weight"));
  EXPECT_FALSE(ck.has("embed_tokens.weight"));
  EXPECT_FALSE(ck.has("lm_head.weight"));
  std::vector<float> fc(static_cast<size_t>(H * k * H));
  ck.load_f32("fc.weight", {H, k * H}, fc.data());
  for (int l = 0; l < d.layers.num_hidden_layers; ++l) {
    const std::string q = "layers." + std::to_string(l) + ".self_attn.q_proj.weight";
    ASSERT_TRUE(ck.has(q)) << q;
    EXPECT_EQ(ck.get(q).shape,
              (std::vector<int64_t>{int64_t(d.layers.num_attention_heads) * d.layers.head_dim, H}));
  }
}

TEST(Safetensors, ReadsGoldenDataFile) {
  SafetensorsFile f(kGolden + "/golden.safetensors");
  EXPECT_EQ(f.path(), kGolden + "/golden.safetensors");
  const nlohmann::json c = read_json(kGolden + "/case.json");
  const TensorInfo& tokens = f.get("tokens");
  const TensorInfo& cu = f.get("cu_seqlens");
  const TensorInfo& mask = f.get("loss_mask");
  EXPECT_EQ(tokens.dtype, DType::I32);
  EXPECT_EQ(cu.dtype, DType::I32);
  EXPECT_EQ(mask.dtype, DType::U8);
  const auto& seqs = c["config"]["seqs"];
  ASSERT_EQ(cu.numel(), seqs.size() + 1);
  const int32_t* cup = static_cast<const int32_t*>(cu.data);
  int32_t total = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(cup[i], total);
    total += seqs[i].get<int32_t>();
  }
  EXPECT_EQ(cup[seqs.size()], total);
  EXPECT_EQ(tokens.shape, std::vector<int64_t>{total});
  EXPECT_EQ(mask.shape, std::vector<int64_t>{total});
  const int32_t* tok = static_cast<const int32_t*>(tokens.data);
  for (int32_t i = 0; i < total; ++i) {
    EXPECT_GE(tok[i], 0);
    EXPECT_LT(tok[i], c["config"]["V"].get<int32_t>());
  }
  const TensorInfo& hidden = f.get("target.hidden");
  EXPECT_EQ(hidden.dtype, DType::F32);
  EXPECT_EQ(hidden.shape, (std::vector<int64_t>{c["config"]["L"].get<int64_t>(), total, c["config"]["H"].get<int64_t>()}));
  // names() lists every tensor once, in file (data offset) order.
  const char* prev_end = nullptr;
  for (const std::string& name : f.names()) {
    const TensorInfo& t = f.get(name);
    if (prev_end) {
      EXPECT_EQ(static_cast<const char*>(t.data), prev_end) << name;
    }
    prev_end = static_cast<const char*>(t.data) + t.nbytes;
  }
}

// ---- write -> read round trips -------------------------------------------------------------------
TEST(Safetensors, RoundTripF32Bf16F16AndMetadata) {
  const std::string dir = make_temp_dir();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> a(3 * 5), b(7), c(2 * 3 * 4);
  for (auto* v : {&a, &b, &c})
    for (float& x : *v) x = nd(rng);
  const int32_t ints[3] = {5, -1, 1 << 30};
  std::vector<TensorToWrite> ts = {
      {"a.f32", DType::F32, {3, 5}, a.data(), nullptr},
      {"b.bf16", DType::BF16, {7}, b.data(), nullptr},
      {"c.f16", DType::F16, {2, 3, 4}, c.data(), nullptr},
      {"ids", DType::I32, {3}, nullptr, ints},
  };
  const std::string path = dir + "/rt.safetensors";
  write_safetensors(path, ts, {{"format", "pt"}, {"step", "12"}});

  const std::string bytes = read_bytes(path);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(hlen % 8, 0u);

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "12");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a.f32", "b.bf16", "c.f16", "ids"}));
  std::vector<float> ra(a.size()), rb(b.size()), rc(c.size());
  tensor_to_f32(f.get("a.f32"), ra.data(), path);
  tensor_to_f32(f.get("b.bf16"), rb.data(), path);
  tensor_to_f32(f.get("c.f16"), rc.data(), path);
  EXPECT_EQ(std::memcmp(ra.data(), a.data(), a.size() * 4), 0);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(rb[i], b[i], std::fabs(b[i]) * 0.0040f) << i;  // 2^-8
  for (size_t i = 0; i < c.size(); ++i) EXPECT_NEAR(rc[i], c[i], std::fabs(c[i]) * 0.0005f + 1e-7f) << i;
  EXPECT_EQ(f.get("b.bf16").nbytes, b.size() * 2);
  EXPECT_EQ(f.get("c.f16").shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(std::memcmp(f.get("ids").data, ints, sizeof(ints)), 0);

  // A Checkpoint over the single file sees the same tensors; wrong shape and missing names fail.
  write_safetensors(dir + "/model.safetensors", ts);
  Checkpoint ck(dir);
  std::vector<float> again(a.size());
  ck.load_f32("a.f32", {3, 5}, again.data());
  EXPECT_EQ(again, a);
  // Exactly the two files written: no temp files are left behind.
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"model.safetensors", "rt.safetensors"}));
  std::filesystem::remove_all(dir);
}

// A NaN or Inf in a weight is the file's fault, named at load (exit 3), not a NaN loss blamed on --lr.
TEST(Checkpoint, NonFiniteWeightIsBadInputNamingTheTensor) {
  const std::string dir = make_temp_dir();
  std::vector<float> ok(6, 0.5f), lm(12, 0.25f);
  lm[7] = std::numeric_limits<float>::infinity();
  lm[9] = std::numeric_limits<float>::quiet_NaN();
  write_safetensors(dir + "/model.safetensors", {{"ok", DType::BF16, {2, 3}, ok.data(), nullptr},
                                                 {"lm_head.weight", DType::BF16, {3, 4}, lm.data(), nullptr}});
  Checkpoint ck(dir);
  std::vector<float> out(12);
  ck.load_f32("ok", {2, 3}, out.data());
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EXIT(ck.load_f32("lm_head.weight", {3, 4}, out.data()), testing::ExitedWithCode(3),
              "tensor lm_head.weight in .*model.safetensors holds 2 non-finite value\\(s\\) \\(NaN/Inf; the first at "
              "flat index 7 of \\[3, 4\\]\\)");
  std::filesystem::remove_all(dir);
}

TEST(Safetensors, WritesEmptyAndZeroSizedTensorsWithoutMetadata) {
  const std::string dir = make_temp_dir();
  write_safetensors(dir + "/e.safetensors", {});
  SafetensorsFile e(dir + "/e.safetensors");
  EXPECT_TRUE(e.names().empty());
  EXPECT_TRUE(e.metadata().empty());
  float x = 2.f;
  write_safetensors(dir + "/z.safetensors", {{"z", DType::BF16, {0, 8}, &x, nullptr}, {"x", DType::F16, {}, &x, nullptr}});
  SafetensorsFile z(dir + "/z.safetensors");
  EXPECT_EQ(z.get("z").nbytes, 0u);
  EXPECT_EQ(z.get("x").numel(), 1u);  // a 0-d tensor holds one element
  float back = 0;
  tensor_to_f32(z.get("x"), &back, "z");
  EXPECT_EQ(back, 2.f);
  std::filesystem::remove_all(dir);
}

TEST(Safetensors, WriteIntoMissingDirectoryIsASystemFailure) {
  float x = 1.f;
  EXPECT_EXIT(write_safetensors("/tmp/dflash_no_such_dir_x9/m.safetensors", {{"x", DType::F32, {1}, &x, nullptr}}),
              testing::ExitedWithCode(static_cast<int>(ExitCode::SystemFailure)), "cannot create a temp file next to");
}

TEST(Safetensors, WriteFileAtomicReplacesContents) {
  const std::string dir = make_temp_dir();
  const std::string p = dir + "/config.json";
  write_file_atomic(p, "first");
  write_file_atomic(p, "{\"second\": true}\n");
  EXPECT_EQ(read_bytes(p), "{\"second\": true}\n");
  struct stat st;
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_TRUE(st.st_mode & S_IRUSR);
  std::filesystem::remove_all(dir);
}

// ---- malformed files ---------------------------------------------------------------------------
TEST_F(SafetensorsBad, TruncatedFile) {
  const std::string p = file("t.safetensors", "\x10\x00\x00");
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "truncated");
}

TEST_F(SafetensorsBad, HeaderLengthPastEndOfFile) {
  const std::string p = file("t.safetensors", le64(1000) + "{}");
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "runs past the end");
}

TEST_F(SafetensorsBad, HeaderLengthAbove100MB) {
  const std::string p = file("t.safetensors", le64(uint64_t(1) << 40) + "{}");
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "100 MB");
}

TEST_F(SafetensorsBad, HeaderNotJson) {
  const std::string p = file("t.safetensors", st_bytes("{\"a\": [1, 2", 0));
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "not valid JSON");
  const std::string q = file("u.safetensors", st_bytes("[1, 2]  ", 0));
  EXPECT_EXIT(SafetensorsFile f(q), testing::ExitedWithCode(kBadInput), "not a JSON object");
}

TEST_F(SafetensorsBad, EntryMissingField) {
  const std::string p = file("t.safetensors", st_bytes(R"({"w": {"dtype": "F32", "shape": [2]}})", 8));
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "tensor 'w' in .*has no 'data_offsets'");
}

TEST_F(SafetensorsBad, OverlappingOffsets) {
  const std::string p = file("t.safetensors", st_bytes(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12));
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "tensor 'b' .* overlaps tensor 'a'");
}

TEST_F(SafetensorsBad, GappedOffsets) {
  const std::string p = file("t.safetensors", st_bytes(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}})", 24));
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "gap of 8 bytes before tensor 'b'");
}

TEST_F(SafetensorsBad, FirstTensorNotAtZero) {
  const std::string p = file("t.safetensors", st_bytes(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})", 4));
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "gap of 2 bytes before tensor 'a'");
}

TEST_F(SafetensorsBad, SizeNotNumelTimesDtypeSize) {
  const std::string p = file("t.safetensors", st_bytes(R"({"a": {"dtype": "BF16", "shape": [3, 2], "data_offsets": [0, 24]}})", 24));
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "tensor 'a' .* span 24 bytes but BF16 \\[3, 2\\] needs 12");
}

TEST_F(SafetensorsBad, DataNotEndingAtFileEnd) {
  const std::string h = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  const std::string p = file("t.safetensors", st_bytes(h, 12));
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "4 bytes after the last tensor 'a'");
  const std::string q = file("u.safetensors", st_bytes(h, 6));
  EXPECT_EXIT(SafetensorsFile f(q), testing::ExitedWithCode(kBadInput), "truncated: tensor 'a' ends at data offset 8");
}

TEST_F(SafetensorsBad, UnsupportedDtype) {
  const std::string p = file("t.safetensors", st_bytes(R"({"w64": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})", 16));
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "unsupported dtype F64 of tensor 'w64' in .*t.safetensors");
  const std::string q = file("u.safetensors", st_bytes(R"({"w8": {"dtype": "F8_E5M2", "shape": [2], "data_offsets": [0, 2]}})", 2));
  EXPECT_EXIT(SafetensorsFile f(q), testing::ExitedWithCode(kBadInput), "unsupported dtype F8_E5M2 of tensor 'w8'");
  const std::string r = file("v.safetensors", st_bytes(R"({"wx": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}})", 2));
  EXPECT_EXIT(SafetensorsFile f(r), testing::ExitedWithCode(kBadInput), "unknown dtype 'Q4' of tensor 'wx'");
}

TEST_F(SafetensorsBad, BadShapeAndMetadata) {
  const std::string p = file("t.safetensors", st_bytes(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8));
  EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "shape of tensor 'a'");
  const std::string q = file("u.safetensors", st_bytes(R"({"__metadata__": {"step": 3}})", 0));
  EXPECT_EXIT(SafetensorsFile f(q), testing::ExitedWithCode(kBadInput), "__metadata__ entry 'step'");
}

TEST_F(SafetensorsBad, MissingFile) {
  EXPECT_EXIT(SafetensorsFile f(dir_ + "/nope.safetensors"), testing::ExitedWithCode(kBadInput),
              "cannot open safetensors file .*nope.safetensors");
}

TEST_F(SafetensorsBad, EmptyHeaderAndZeroSizedTensorsAreFine) {
  SafetensorsFile empty(file("e.safetensors", st_bytes("{}      ", 0)));
  EXPECT_TRUE(empty.names().empty());
  SafetensorsFile z(file("z.safetensors", st_bytes(R"({"z": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]},
      "a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}})", 3)));
  EXPECT_EQ(z.get("z").numel(), 0u);
  EXPECT_EQ(z.get("a").nbytes, 3u);
}

// ---- Checkpoint errors -------------------------------------------------------------------------
TEST_F(SafetensorsBad, CheckpointMissingShardFile) {
  file("model.safetensors.index.json",
       R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  float one = 1.f;
  write_safetensors(dir_ + "/model-00001-of-00002.safetensors", {{"a", DType::F32, {1}, &one, nullptr}});
  EXPECT_EXIT(Checkpoint ck(dir_), testing::ExitedWithCode(kBadInput),
              "missing shard file .*model-00002-of-00002.safetensors");
}

TEST_F(SafetensorsBad, CheckpointMissingIndexAndModelFile) {
  EXPECT_EXIT(Checkpoint ck(dir_), testing::ExitedWithCode(kBadInput),
              "no model.safetensors.index.json or model.safetensors in .*HINT");
  EXPECT_EXIT(Checkpoint ck(dir_ + "/absent"), testing::ExitedWithCode(kBadInput), "does not exist");
}

TEST_F(SafetensorsBad, CheckpointBadIndex) {
  file("model.safetensors.index.json", "{\"weight_map\": ");
  EXPECT_EXIT(Checkpoint ck(dir_), testing::ExitedWithCode(kBadInput), "index.json is not valid JSON(.|\n)*HINT: re-download");
  file("model.safetensors.index.json", "[]");
  EXPECT_EXIT(Checkpoint ck(dir_), testing::ExitedWithCode(kBadInput), "index.json is not a JSON object");
}

TEST_F(SafetensorsBad, CheckpointMissingTensorAndWrongShape) {
  std::vector<float> w(6, 0.5f);
  write_safetensors(dir_ + "/model.safetensors", {{"w", DType::BF16, {2, 3}, w.data(), nullptr}});
  Checkpoint ck(dir_);
  std::vector<float> out(6);
  ck.load_f32("w", {2, 3}, out.data());
  EXPECT_EQ(out, w);
  EXPECT_EXIT(ck.load_f32("missing.weight", {2, 3}, out.data()), testing::ExitedWithCode(kBadInput),
              "missing tensor missing.weight in ");
  EXPECT_EXIT(ck.load_f32("w", {3, 2}, out.data()), testing::ExitedWithCode(kBadInput),
              "tensor w in .* has shape \\[2, 3\\], expected \\[3, 2\\]");
}

TEST_F(SafetensorsBad, CheckpointIndexNamesTensorTheShardLacks) {
  float one = 1.f;
  write_safetensors(dir_ + "/s1.safetensors", {{"a", DType::F32, {1}, &one, nullptr}});
  file("model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  Checkpoint ck(dir_);
  EXPECT_TRUE(ck.has("b"));
  EXPECT_EXIT(ck.get("b"), testing::ExitedWithCode(kBadInput), "missing tensor b in .*s1.safetensors");
}

TEST_F(SafetensorsBad, IntegerTensorIsNotLoadedAsFloat) {
  const int32_t ids[2] = {1, 2};
  write_safetensors(dir_ + "/model.safetensors", {{"ids", DType::I32, {2}, nullptr, ids}});
  Checkpoint ck(dir_);
  float out[2];
  EXPECT_EXIT(ck.load_f32("ids", {2}, out), testing::ExitedWithCode(kBadInput), "has dtype I32");
}

// Every truncation of a valid file is refused with exit code 3 (never a crash, a hang or a silent read).
TEST_F(SafetensorsBad, EveryTruncationIsRefused) {
  std::vector<float> w(5, 1.5f);
  const int32_t ids[3] = {1, 2, 3};
  write_safetensors(dir_ + "/full.safetensors",
                    {{"w", DType::BF16, {5}, w.data(), nullptr}, {"ids", DType::I32, {3}, nullptr, ids}},
                    {{"k", "v"}});
  const std::string full = read_bytes(dir_ + "/full.safetensors");
  SafetensorsFile ok(dir_ + "/full.safetensors");
  EXPECT_EQ(ok.names().size(), 2u);
  for (size_t len = 0; len < full.size(); len += 5) {
    const std::string p = file("cut.safetensors", full.substr(0, len));
    EXPECT_EXIT(SafetensorsFile f(p), testing::ExitedWithCode(kBadInput), "safetensors") << "length " << len;
  }
}

// Offsets need not be aligned: an F32 tensor after 3 bytes of U8 still converts exactly.
TEST_F(SafetensorsBad, MisalignedFloatTensorConvertsExactly) {
  const uint8_t mask[3] = {1, 0, 1};
  std::vector<float> w = {1.25f, -3.5f, 1e-20f, 65504.f, 7.f};
  write_safetensors(dir_ + "/model.safetensors",
                    {{"mask", DType::U8, {3}, nullptr, mask}, {"w", DType::F32, {5}, nullptr, w.data()}});
  Checkpoint ck(dir_);
  ASSERT_NE(reinterpret_cast<uintptr_t>(ck.get("w").data) % 4, 0u);  // really misaligned
  std::vector<float> out(5);
  ck.load_f32("w", {5}, out.data());
  EXPECT_EQ(out, w);
}

TEST(Checkpoint, ReadsGoldenQwen35Target) {
  Checkpoint ck(std::string(DFLASH_TEST_DATA) + "/golden/qwen35-tiny-a/target");
  size_t n = 0;
  for (const std::string& shard : ck.shard_files()) {
    for (const std::string& name : ck.names_in_shard(shard)) {
      const TensorInfo& t = ck.get(name);
      std::vector<float> v(t.numel());
      ck.load_f32(name, t.shape, v.data());
      ++n;
    }
    ck.release_shard(shard);
  }
  EXPECT_EQ(n, ck.names().size());
  EXPECT_GT(n, 0u);
}
