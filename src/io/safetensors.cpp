// safetensors reading: one memory-mapped file (SafetensorsFile) and HF checkpoint directories (Checkpoint).
//
// The reader trusts nothing in the file: the header length, the JSON, every entry's dtype/shape/offsets and
// the tiling of the data region are all checked before a single tensor pointer is handed out, so a
// truncated or hand-edited file ends in a BadInput error naming the file and tensor, never in a crash.
#include "dflash/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dflash/error.h"
#include "io/json_file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader maps it in place and needs a little-endian host"
#endif

namespace dflash {
namespace {

// The reference implementation refuses headers above 100 MB; so do we (a garbage length must not make us
// parse gigabytes of tensor bytes as JSON).
constexpr uint64_t kMaxHeaderBytes = 100u * 1000u * 1000u;

const char* const kFormatHint =
    "the file is not a valid safetensors file (truncated copy, interrupted download or a different format); "
    "re-download or re-export it";

enum class DTypeLookup { Supported, Unsupported, Unknown };

DTypeLookup parse_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> supported[] = {
      {"F32", DType::F32}, {"BF16", DType::BF16}, {"F16", DType::F16},
      {"I32", DType::I32}, {"U8", DType::U8},     {"I64", DType::I64},
      {"F8_E4M3", DType::F8E4M3}};
  for (const auto& [name, t] : supported)
    if (s == name) {
      *out = t;
      return DTypeLookup::Supported;
    }
  static const char* const known_other[] = {"BOOL", "I8", "I16", "U16", "U32", "U64",
                                            "F64", "F8_E5M2", "F8_E8M0", "F4"};
  for (const char* name : known_other)
    if (s == name) return DTypeLookup::Unsupported;
  return DTypeLookup::Unknown;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool dir_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string join_path(const std::string& dir, const std::string& file) {
  if (dir.empty() || dir.back() == '/') return dir + file;
  return dir + "/" + file;
}

// One header entry, before the tiling check.
struct RawEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

// Parses and checks one "name": {"dtype", "shape", "data_offsets"} entry.
RawEntry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& e) {
  const std::string where = "tensor '" + name + "' in " + path;
  DF_CHECK_HINT(e.is_object(), BadInput, "safetensors header entry for " << where << " is not a JSON object",
                kFormatHint);
  for (const char* key : {"dtype", "shape", "data_offsets"})
    DF_CHECK_HINT(e.contains(key), BadInput, "safetensors header entry for " << where << " has no '" << key << "'",
                  kFormatHint);
  RawEntry r;
  r.name = name;

  const auto& jd = e["dtype"];
  DF_CHECK_HINT(jd.is_string(), BadInput, "dtype of " << where << " is not a string: " << jd.dump(), kFormatHint);
  const std::string dname = jd.get<std::string>();
  switch (parse_dtype(dname, &r.dtype)) {
    case DTypeLookup::Supported: break;
    case DTypeLookup::Unsupported:
      DF_FAIL(BadInput, "unsupported dtype " << dname << " of " << where,
              "dflash-train reads BF16, F16 and F32 weights (and I32/U8/I64 data); convert the checkpoint, "
              "e.g. load it in transformers and save_pretrained with torch_dtype=torch.bfloat16");
    case DTypeLookup::Unknown:
      DF_FAIL(BadInput, "unknown dtype '" << dname << "' of " << where, kFormatHint);
  }

  const auto& js = e["shape"];
  DF_CHECK_HINT(js.is_array(), BadInput, "shape of " << where << " is not an array: " << js.dump(), kFormatHint);
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : js) {
    DF_CHECK_HINT(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), BadInput,
                  "shape of " << where << " holds '" << d.dump() << "', not a non-negative integer", kFormatHint);
    uint64_t v = d.get<uint64_t>();
    DF_CHECK_HINT(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), BadInput,
                  "shape of " << where << " has an impossible dimension " << v, kFormatHint);
    if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / v) overflow = true;
    numel *= v;
    r.shape.push_back(static_cast<int64_t>(v));
  }
  const uint64_t elem = dtype_size(r.dtype);
  DF_CHECK_HINT(!overflow && numel <= std::numeric_limits<uint64_t>::max() / elem, BadInput,
                "shape " << shape_to_string(r.shape) << " of " << where << " overflows", kFormatHint);

  const auto& jo = e["data_offsets"];
  DF_CHECK_HINT(jo.is_array() && jo.size() == 2 && jo[0].is_number_unsigned() && jo[1].is_number_unsigned(),
                BadInput, "data_offsets of " << where << " must be two non-negative integers [begin, end], got "
                                             << jo.dump(),
                kFormatHint);
  r.begin = jo[0].get<uint64_t>();
  r.end = jo[1].get<uint64_t>();
  DF_CHECK_HINT(r.begin <= r.end, BadInput,
                "data_offsets of " << where << " end before they begin: [" << r.begin << ", " << r.end << "]",
                kFormatHint);
  DF_CHECK_HINT(r.end - r.begin == numel * elem, BadInput,
                "data_offsets of " << where << " span " << (r.end - r.begin) << " bytes but " << dname << " "
                                   << shape_to_string(r.shape) << " needs " << numel * elem << " bytes",
                kFormatHint);
  return r;
}

}  // namespace

// ---- TensorInfo -----------------------------------------------------------------------------------
size_t TensorInfo::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;  // a 0-d tensor (shape []) holds one element, as in safetensors and torch
}

std::string TensorInfo::shape_str() const { return shape_to_string(shape); }

// ---- SafetensorsFile ------------------------------------------------------------------------------
SafetensorsFile::SafetensorsFile(const std::string& path, LinkPolicy links) : path_(path) {
  // O_NONBLOCK: a FIFO at the path is refused below (not a regular file) instead of blocking the open.
  int fd = links == LinkPolicy::Refuse ? open_own_file(path, O_RDONLY, 0, HardLinks::Accept)
                                       : ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  DF_CHECK_HINT(fd >= 0, BadInput, "cannot open safetensors file " << path << ": "
                                                  << (links == LinkPolicy::Refuse ? own_file_error(errno) : std::strerror(errno)),
                "check the path and its permissions");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DF_FAIL(BadInput, path << " is not a regular file", "point at a .safetensors file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    DF_FAIL(BadInput, "safetensors file " << path << " is truncated: " << file_size
                                          << " bytes, shorter than the 8-byte header length",
            kFormatHint);
  }
  map_ = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    DF_FAIL(SystemFailure, "cannot mmap " << path << " (" << file_size << " bytes): " << std::strerror(map_errno),
            "check free address space / vm.max_map_count");
  }
  map_size_ = file_size;
  const unsigned char* base = static_cast<const unsigned char*>(map_);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little-endian u64
  DF_CHECK_HINT(header_len <= kMaxHeaderBytes, BadInput,
                "safetensors file " << path << " declares a header of " << header_len
                                    << " bytes, above the 100 MB limit",
                kFormatHint);
  DF_CHECK_HINT(8 + header_len <= file_size, BadInput,
                "safetensors file " << path << " is truncated: header length " << header_len
                                    << " runs past the end of the " << file_size << "-byte file",
                kFormatHint);

  const char* hbegin = reinterpret_cast<const char*>(base + 8);
  nlohmann::json header = nlohmann::json::parse(hbegin, hbegin + header_len, nullptr, /*allow_exceptions=*/false);
  DF_CHECK_HINT(!header.is_discarded(), BadInput, "safetensors header of " << path << " is not valid JSON",
                kFormatHint);
  DF_CHECK_HINT(header.is_object(), BadInput, "safetensors header of " << path << " is not a JSON object",
                kFormatHint);

  std::vector<RawEntry> entries;
  entries.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      DF_CHECK_HINT(it->is_object(), BadInput, "__metadata__ of " << path << " is not a JSON object", kFormatHint);
      for (auto m = it->begin(); m != it->end(); ++m) {
        DF_CHECK_HINT(m->is_string(), BadInput,
                      "__metadata__ entry '" << m.key() << "' of " << path << " is not a string", kFormatHint);
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, it.key(), *it));
  }

  // The data region must be tiled exactly: sorted by begin, each tensor starts where the previous ended.
  const uint64_t data_size = file_size - 8 - header_len;
  std::sort(entries.begin(), entries.end(), [](const RawEntry& a, const RawEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  std::string previous;
  for (const RawEntry& r : entries) {
    if (r.begin < expected)
      DF_FAIL(BadInput, "safetensors file " << path << ": tensor '" << r.name << "' [" << r.begin << ", " << r.end
                                            << ") overlaps tensor '" << previous << "' (which ends at " << expected
                                            << ")",
              kFormatHint);
    if (r.begin > expected)
      DF_FAIL(BadInput, "safetensors file " << path << ": gap of " << (r.begin - expected) << " bytes before tensor '"
                                            << r.name << "' (begins at " << r.begin << ", previous data ends at "
                                            << expected << ")",
              kFormatHint);
    expected = r.end;
    previous = r.name;
  }
  if (expected != data_size) {
    if (expected > data_size)
      DF_FAIL(BadInput, "safetensors file " << path << " is truncated: tensor '" << previous << "' ends at data offset "
                                            << expected << " but the file holds only " << data_size
                                            << " bytes of data",
              kFormatHint);
    DF_FAIL(BadInput, "safetensors file " << path << " has " << (data_size - expected)
                                          << " bytes after the last tensor"
                                          << (previous.empty() ? std::string() : " '" + previous + "'")
                                          << " (the data must end at the end of the file)",
            kFormatHint);
  }

  const unsigned char* data_start = base + 8 + header_len;
  for (RawEntry& r : entries) {
    TensorInfo t;
    t.name = r.name;
    t.dtype = r.dtype;
    t.shape = std::move(r.shape);
    t.data = data_start + r.begin;
    t.nbytes = static_cast<size_t>(r.end - r.begin);
    order_.push_back(r.name);
    tensors_.emplace(r.name, std::move(t));
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

bool SafetensorsFile::has(const std::string& name) const { return tensors_.count(name) != 0; }

const TensorInfo& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  DF_CHECK_HINT(it != tensors_.end(), BadInput, "missing tensor " << name << " in " << path_,
                "the file does not match what the model expects (wrong checkpoint or architecture?)");
  return it->second;
}

void tensor_to_f32(const TensorInfo& t, float* dst, const std::string& source) {
  DF_CHECK_HINT(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16, BadInput,
                "tensor " << t.name << " in " << source << " has dtype " << dtype_name(t.dtype)
                          << "; a floating-point dtype (F32, BF16, F16) is needed",
                "the checkpoint holds a different kind of tensor under this name");
  const size_t n = t.numel();
  const size_t esize = dtype_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % esize == 0) {
    to_f32(dst, t.data, t.dtype, n);
    return;
  }
  // Misaligned in the file (legal: offsets need not be aligned); convert through an aligned bounce buffer.
  constexpr size_t kChunkBytes = 1 << 18;
  std::vector<uint64_t> bounce_storage(kChunkBytes / 8);  // uint64_t: 8-byte aligned
  unsigned char* bounce = reinterpret_cast<unsigned char*>(bounce_storage.data());
  const size_t per_chunk = kChunkBytes / esize;
  const unsigned char* src = static_cast<const unsigned char*>(t.data);
  for (size_t i = 0; i < n; i += per_chunk) {
    size_t m = std::min(per_chunk, n - i);
    std::memcpy(bounce, src + i * esize, m * esize);
    to_f32(dst + i, bounce, t.dtype, m);
  }
}

// ---- Checkpoint -----------------------------------------------------------------------------------
Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  DF_CHECK_HINT(dir_exists(dir), BadInput, "checkpoint directory " << dir << " does not exist",
                "point at a Hugging Face checkpoint directory (config.json + *.safetensors)");
  const std::string index_path = join_path(dir, "model.safetensors.index.json");
  const std::string single_path = join_path(dir, "model.safetensors");
  if (file_exists(index_path)) {
    nlohmann::json index = read_json_file(index_path, "re-download the checkpoint's index file");
    DF_CHECK_HINT(index.contains("weight_map") && index["weight_map"].is_object(), BadInput,
                  index_path << " has no 'weight_map' object (tensor name -> shard file)",
                  "re-download the checkpoint's index file");
    std::set<std::string> checked;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      DF_CHECK_HINT(it->is_string(), BadInput,
                    index_path << ": weight_map entry for tensor '" << it.key() << "' is not a file name",
                    "re-download the checkpoint's index file");
      const std::string shard = it->get<std::string>();
      DF_CHECK_HINT(!shard.empty() && shard.find('/') == std::string::npos, BadInput,
                    index_path << ": weight_map entry for tensor '" << it.key() << "' names '" << shard
                               << "', not a file in the checkpoint directory",
                    "re-download the checkpoint's index file");
      if (checked.insert(shard).second)
        DF_CHECK_HINT(file_exists(join_path(dir, shard)), BadInput,
                      "missing shard file " << join_path(dir, shard) << " (listed in " << index_path
                                            << " for tensor " << it.key() << ")",
                      "the checkpoint download is incomplete: fetch every model-*.safetensors shard");
      weight_map_[it.key()] = shard;
    }
    DF_CHECK_HINT(!weight_map_.empty(), BadInput, index_path << " lists no tensors",
                  "re-download the checkpoint's index file");
  } else if (file_exists(single_path)) {
    // A single file must be opened to learn its names; it stays open (release_shard drops it).
    auto file = std::make_unique<SafetensorsFile>(single_path);
    for (const std::string& n : file->names()) weight_map_[n] = "model.safetensors";
    open_["model.safetensors"] = std::move(file);
  } else {
    DF_FAIL(BadInput, "no model.safetensors.index.json or model.safetensors in " << dir,
            "point at a Hugging Face checkpoint directory (config.json + model.safetensors, or sharded "
            "model-*.safetensors with model.safetensors.index.json)");
  }
}

bool Checkpoint::has(const std::string& name) const { return weight_map_.count(name) != 0; }

const TensorInfo& Checkpoint::expect_float(const std::string& name, const std::vector<int64_t>& shape,
                                           const std::string& hint) {
  const TensorInfo& t = get(name);  // fatal BadInput naming the tensor when missing
  if (t.shape != shape) {
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    DF_FAIL(BadInput, "tensor " << name << " in " << dir_ << " has shape " << t.shape_str() << ", expected "
                                << want << "] from config.json",
            hint);
  }
  DF_CHECK_HINT(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16, BadInput,
                "tensor " << name << " in " << dir_ << " has dtype " << dtype_name(t.dtype)
                          << "; F32, BF16 or F16 is needed",
                "the checkpoint holds a different kind of tensor under this name");
  return t;
}

const std::string& Checkpoint::shard_of(const std::string& name) const {
  auto it = weight_map_.find(name);
  DF_CHECK_HINT(it != weight_map_.end(), BadInput, "missing tensor " << name << " in " << dir_,
                "the checkpoint does not hold every tensor its config.json implies");
  return it->second;
}

const TensorInfo& Checkpoint::get(const std::string& name) {
  auto it = weight_map_.find(name);
  DF_CHECK_HINT(it != weight_map_.end(), BadInput, "missing tensor " << name << " in " << dir_,
                "the checkpoint does not match the model config (wrong directory, or a different architecture)");
  const std::string& shard = it->second;
  auto f = open_.find(shard);
  if (f == open_.end()) f = open_.emplace(shard, std::make_unique<SafetensorsFile>(join_path(dir_, shard))).first;
  DF_CHECK_HINT(f->second->has(name), BadInput,
                "missing tensor " << name << " in " << f->second->path() << " (the index of " << dir_
                                  << " says it is there)",
                "the index file and the shards do not belong together: re-download the checkpoint");
  return f->second->get(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(weight_map_.size());
  for (const auto& kv : weight_map_) out.push_back(kv.first);
  return out;
}

void Checkpoint::check_dtype_label(const std::vector<std::string>& names, const std::string& label) {
  const std::string config_path = join_path(dir_, "config.json");  // where the label came from (messages)
  const DType said = label == "bfloat16" ? DType::BF16 : label == "float16" ? DType::F16 : DType::F32;
  const std::string* first_half = nullptr;  // the first half-precision tensor seen (mixing check)
  DType first_dtype = DType::F32;
  for (const std::string& name : names) {
    const DType d = get(name).dtype;
    if (d != DType::BF16 && d != DType::F16) continue;
    const char* dn = d == DType::BF16 ? "BF16" : "F16";
    DF_CHECK_HINT(said == DType::F32 || d == said, BadInput,
                  "tensor " << name << " in " << shard_of(name) << " is " << dn << ", but " << config_path
                            << " says the weights are " << label << " (bytes relabelled? they would load as other numbers)",
                  "re-export the checkpoint (save_pretrained) so the shards' dtypes and config.json agree");
    if (!first_half) {
      first_half = &name;
      first_dtype = d;
    }
    DF_CHECK_HINT(d == first_dtype, BadInput,
                  "the checkpoint " << dir_ << " mixes BF16 (" << (first_dtype == DType::BF16 ? *first_half : name)
                                    << ") and F16 (" << (first_dtype == DType::F16 ? *first_half : name) << ") tensors",
                  "re-export the checkpoint (save_pretrained) in one dtype");
  }
}

std::vector<std::string> Checkpoint::shard_files() const {
  std::set<std::string> shards;
  for (const auto& kv : weight_map_) shards.insert(kv.second);
  return {shards.begin(), shards.end()};
}

std::vector<std::string> Checkpoint::names_in_shard(const std::string& shard_file) const {
  std::vector<std::string> out;
  for (const auto& kv : weight_map_)
    if (kv.second == shard_file) out.push_back(kv.first);
  return out;
}

void Checkpoint::release_shard(const std::string& shard_file) { open_.erase(shard_file); }

void Checkpoint::load_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) {
  const TensorInfo& t = get(name);
  DF_CHECK_HINT(t.shape == shape, BadInput,
                "tensor " << name << " in " << dir_ << " has shape " << t.shape_str() << ", expected "
                          << shape_to_string(shape),
                "the checkpoint does not match its config.json (or the drafter does not match the target)");
  tensor_to_f32(t, dst, dir_);
  // A NaN or Inf in a weight (a damaged download, a bad export) makes every loss NaN, which the trainer
  // could only blame on its learning rate: named here, where it is known to be the file's.
  const size_t n = t.numel();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(dst[i]) && bad++ == 0) first = i;
  DF_CHECK_HINT(bad == 0, BadInput,
                "tensor " << name << " in " << join_path(dir_, shard_of(name)) << " holds " << bad
                          << " non-finite value(s) (NaN/Inf; the first at flat index " << first << " of " << t.shape_str()
                          << ")",
                "the checkpoint is damaged or was exported wrong: re-download or re-export it; no training "
                "setting (--lr, warm-up) can fix a non-finite weight");
}

}  // namespace dflash
