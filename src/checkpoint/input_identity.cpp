// Content identities of a run's inputs, recorded in every checkpoint and compared on resume: a dataset
// regenerated at the same path, or other target weights copied over the same directory, would otherwise
// resume with every option equal and train on the wrong thing (docs/checkpoint.md "What a resume checks").
//
// Identities are cheap fingerprints, not full hashes (a job must not read 50 GB of weights to start): for the
// data, the file's size, its record offsets in full and the tokens and loss mask of 64 records spread over
// the file; for the target, each shard's size, its safetensors header (every tensor's name, dtype, shape and
// place) and its first and last MiB of tensor data; and its config.json, field by field (every field the
// model reads: rope_theta, rms_norm_eps, ... edited in place change the losses as surely as the weights).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/checkpoint.h"
#include "dflash/data.h"
#include "dflash/data_mix.h"
#include "dflash/error.h"
#include "dflash/safetensors.h"

namespace dflash {
namespace {

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Mixes the hash of `bytes` into `h` (order matters).
void mix(uint64_t& h, const void* bytes, size_t n) {
  const uint64_t part = content_hash64(bytes, n);
  const uint64_t both[2] = {h, part};
  h = content_hash64(both, sizeof(both));
}

constexpr size_t kSampledRecords = 64;
constexpr int64_t kSampledTokensPerRecord = 4096;
constexpr size_t kShardEdgeBytes = size_t(1) << 20;

// Bytes [at, at + n) of an open file (short at the end of the file).
std::vector<char> read_at(int fd, uint64_t at, size_t n, const std::string& path) {
  std::vector<char> buf(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, buf.data() + got, n - got, static_cast<off_t>(at + got));
    DF_CHECK(r >= 0, BadInput, "cannot read " << path << ": " << std::strerror(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  buf.resize(got);
  return buf;
}

std::string shard_identity(const std::string& path) {
  // Plain open: a Hugging Face cache's snapshot links its shards to blobs, and the loader follows them too.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DF_CHECK(fd >= 0, BadInput, "cannot open target shard " << path << ": " << std::strerror(errno));
  struct stat st;
  const bool ok = ::fstat(fd, &st) == 0;
  const uint64_t size = ok ? static_cast<uint64_t>(st.st_size) : 0;
  uint64_t h = 0, header_len = 0;
  const std::vector<char> len_bytes = read_at(fd, 0, 8, path);
  if (len_bytes.size() == 8) std::memcpy(&header_len, len_bytes.data(), 8);
  // The loader has validated the file; a header length beyond the file only means it changed since.
  header_len = std::min<uint64_t>(header_len, size >= 8 ? size - 8 : 0);
  mix(h, &size, sizeof(size));
  const std::vector<char> header = read_at(fd, 8, static_cast<size_t>(header_len), path);
  mix(h, header.data(), header.size());
  const uint64_t data_at = std::min<uint64_t>(8 + header_len, size), data_len = size - data_at;  // size < 8: none
  const std::vector<char> first = read_at(fd, data_at, static_cast<size_t>(std::min<uint64_t>(kShardEdgeBytes, data_len)), path);
  mix(h, first.data(), first.size());
  const uint64_t last_len = std::min<uint64_t>(kShardEdgeBytes, data_len);
  const std::vector<char> last = read_at(fd, size - last_len, static_cast<size_t>(last_len), path);
  mix(h, last.data(), last.size());
  ::close(fd);
  return hex(h);
}

// "k=v k=v ..." -> (k, v) pairs, in order.
std::vector<std::pair<std::string, std::string>> fields_of(const std::string& identity) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(identity);
  for (std::string word; in >> word;) {
    const size_t eq = word.find('=');
    out.emplace_back(word.substr(0, eq), eq == std::string::npos ? "" : word.substr(eq + 1));
  }
  return out;
}

}  // namespace

std::string dataset_identity(const TokenDataset& data) {
  const std::vector<int64_t> offsets = [&] {
    std::vector<int64_t> o{0};
    for (size_t r = 0; r < data.num_records(); ++r) o.push_back(o.back() + data.record_length(r));
    return o;
  }();
  uint64_t sample = 0;
  const size_t n = data.num_records();
  const size_t picks = std::min(kSampledRecords, n);
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  for (size_t i = 0; i < picks; ++i) {
    const size_t r = picks == 1 ? 0 : i * (n - 1) / (picks - 1);
    tokens.clear();
    mask.clear();
    data.read_record(r, tokens, mask, kSampledTokensPerRecord);
    mix(sample, tokens.data(), tokens.size() * sizeof(int32_t));
    mix(sample, mask.data(), mask.size());
  }
  std::ostringstream id;
  id << "bytes=" << data.file_bytes() << " records=" << n << " tokens=" << data.num_tokens()
     << " vocab_size=" << data.vocab_size() << " offsets=" << hex(content_hash64(offsets.data(), offsets.size() * 8))
     << " sampled_records=" << hex(sample);
  return id.str();
}

std::string dataset_identity(const DatasetMix& data) {
  if (!data.is_mix()) return dataset_identity(data.file(0));
  std::vector<int64_t> table;  // (file, record) of every slot
  table.reserve(2 * data.num_records());
  for (size_t s = 0; s < data.num_records(); ++s) {
    const auto [f, r] = data.slot(s);
    table.push_back(static_cast<int64_t>(f));
    table.push_back(r);
  }
  std::ostringstream id;
  id << "datasets=" << data.num_files() << " slots=" << data.num_records() << " tokens=" << data.num_tokens()
     << " slot_table=" << hex(content_hash64(table.data(), table.size() * sizeof(int64_t))) << " shares=";
  for (size_t i = 0; i < data.num_files(); ++i) {
    char share[32];
    std::snprintf(share, sizeof(share), "%s%.17g", i ? "," : "", data.share(i));
    id << share;
  }
  for (size_t i = 0; i < data.num_files(); ++i)
    for (const auto& [k, v] : fields_of(dataset_identity(data.file(i)))) id << " d" << i << "." << k << "=" << v;
  return id.str();
}

std::string target_weights_identity(const std::string& target_dir) {
  Checkpoint ckpt(target_dir);
  std::ostringstream id;
  const std::vector<std::string> shards = ckpt.shard_files();
  id << "shards=" << shards.size();
  for (const std::string& shard : shards) id << " " << shard << "=" << shard_identity(target_dir + "/" + shard);
  return id.str();
}

std::string target_config_identity(const std::string& target_dir) {
  const std::string path = target_dir + "/config.json";
  std::ifstream in(path);
  DF_CHECK(in.good(), BadInput, "cannot open " << path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  DF_CHECK(j.is_object(), BadInput, path << " is not a JSON object");
  // Written by the tools that saved the model, read by nothing that computes: a re-save by a newer
  // transformers must not refuse a resume.
  for (const char* meta : {"transformers_version", "_name_or_path"}) j.erase(meta);
  // One field per top-level key (nested ones, text_config of a multimodal target, as a whole): a change
  // then names the field ("rope_theta differ"). The parsed value is hashed, so formatting and key order
  // do not count (nlohmann's object keeps its keys sorted).
  std::ostringstream id;
  id << "fields=" << j.size();
  for (const auto& [k, v] : j.items()) {
    std::string key = k;
    for (char& c : key)
      if (c == '=' || static_cast<unsigned char>(c) <= ' ') c = '_';
    const std::string text = v.dump();
    id << " " << key << "=" << hex(content_hash64(text.data(), text.size()));
  }
  return id.str();
}

std::string describe_identity_change(const std::string& saved, const std::string& now) {
  const auto a = fields_of(saved), b = fields_of(now);
  std::vector<std::string> changed;
  for (const auto& [k, v] : a) {
    const auto it = std::find_if(b.begin(), b.end(), [&](const auto& kv) { return kv.first == k; });
    if (it == b.end()) changed.push_back(k + " gone");
    else if (it->second != v) {
      // Sizes and counts are worth showing; hashes only say "differ".
      const bool is_number = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 16;
      changed.push_back(is_number ? k + " " + v + " -> " + it->second : k + " differ");
    }
  }
  for (const auto& [k, v] : b)
    if (std::none_of(a.begin(), a.end(), [&](const auto& kv) { return kv.first == k; })) changed.push_back(k + " new");
  std::string out;
  for (const std::string& c : changed) out += (out.empty() ? "" : ", ") + c;
  return out.empty() ? "identical" : out;
}

}  // namespace dflash
