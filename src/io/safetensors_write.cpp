// safetensors writing and atomic file replacement.
//
// Every file is written to a temp file in the destination's directory, fsync'ed, renamed over the
// destination and the directory fsync'ed, so a crash or a full disk leaves either the old file or the new
// one, never a torn one (docs/checkpoint.md "Commit protocol": a failure never corrupts a checkpoint).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

#include "dflash/error.h"
#include "dflash/safe_file.h"
#include "dflash/safetensors.h"

namespace dflash {
namespace {

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Writes to an open temp file; the first failure is fatal and removes the temp file.
class TempFileWriter {
 public:
  TempFileWriter(TempFile& temp, std::string final_path) : t_(temp), final_(std::move(final_path)) {}

  void write(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(t_.fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("write");
      c += w;
      n -= static_cast<size_t>(w);
    }
  }

  [[noreturn]] void fail(const char* what) {
    const int err = errno;
    discard_temp(t_);
    DF_FAIL(SystemFailure, "cannot write " << final_ << ": " << what << " of " << t_.path << " failed: "
                                           << std::strerror(err),
            "check free disk space and write permission in " + parent_dir(final_));
  }

 private:
  TempFile& t_;
  std::string final_;
};

// temp file next to `path` -> fill(writer) -> fsync -> rename -> fsync(dir), all relative to the one
// descriptor of the directory (include/dflash/safe_file.h): a link swapped in on the way while the file is
// written cannot move the rename elsewhere.
void write_atomically(const std::string& path, const std::function<void(TempFileWriter&)>& fill) {
  const std::string dir = parent_dir(path);
  // mkstemp's name (unpredictable, O_EXCL) with the mode creat(2) would give: exported models and configs are
  // read by others as the user's umask allows (include/dflash/safe_file.h).
  TempFile temp = create_temp_next_to(path);
  TempFileWriter w(temp, path);
  fill(w);
  if (::fsync(temp.fd) != 0) w.fail("fsync");
  const int fd = temp.fd;
  temp.fd = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    discard_temp(temp);
    DF_FAIL(SystemFailure, "cannot write " << path << ": close failed: " << std::strerror(err),
            "check free disk space in " + dir);
  }
  if (const int err = commit_temp(temp); err != 0) {
    discard_temp(temp);
    // A directory where the job writes a file (planted in a shared --out): named as one, not a system failure.
    if (err == EISDIR || err == ENOTEMPTY || err == EEXIST)
      DF_FAIL(BadOptions, "cannot write " << path << ": " << own_file_error(EISDIR),
              "move it away (mv " + path + " " + path + ".moved); the job writes its own file there");
    DF_FAIL(SystemFailure, "cannot rename " << temp.path << " to " << path << ": " << std::strerror(err),
            "check write permission in " + dir + " (and that " + path + " is not a directory)");
  }
}

bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

}  // namespace

void write_file_atomic(const std::string& path, const std::string& contents) {
  write_atomically(path, [&](TempFileWriter& w) { w.write(contents.data(), contents.size()); });
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Header: __metadata__ first, then the tensors in the given order, laid out back to back.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::set<std::string> seen;
  std::vector<size_t> nbytes(tensors.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToWrite& t = tensors[i];
    // Writers are called by our own code: a bad request is a bug, not bad user input.
    DF_CHECK(!t.name.empty() && t.name != "__metadata__" && seen.insert(t.name).second, Internal,
             "write_safetensors(" << path << "): bad or duplicate tensor name '" << t.name << "'");
    DF_CHECK(t.f32 != nullptr || t.raw != nullptr, Internal,
             "write_safetensors(" << path << "): tensor " << t.name << " has no data");
    DF_CHECK(t.f32 == nullptr || is_float_dtype(t.dtype), Internal,
             "write_safetensors(" << path << "): cannot convert float data of " << t.name << " to "
                                  << dtype_name(t.dtype));
    size_t numel = 1;
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int64_t d : t.shape) {
      DF_CHECK(d >= 0, Internal, "write_safetensors(" << path << "): negative dimension in " << t.name);
      numel *= static_cast<size_t>(d);
      shape.push_back(d);
    }
    nbytes[i] = numel * dtype_size(t.dtype);
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = dtype_name(t.dtype);
    entry["shape"] = shape;
    entry["data_offsets"] = {offset, offset + nbytes[i]};
    header[t.name] = entry;
    offset += nbytes[i];
  }
  std::string header_text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned (what the reference writer does).
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  write_atomically(path, [&](TempFileWriter& w) {
    unsigned char len_le[8];
    uint64_t n = header_text.size();
    for (int b = 0; b < 8; ++b) len_le[b] = static_cast<unsigned char>(n >> (8 * b));
    w.write(len_le, 8);
    w.write(header_text.data(), header_text.size());
    // Conversion in bounded chunks: exporting a large drafter must not double its memory.
    constexpr size_t kChunkElems = 1 << 16;
    std::vector<uint16_t> half(kChunkElems);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorToWrite& t = tensors[i];
      if (t.f32 == nullptr || t.dtype == DType::F32) {
        w.write(t.f32 ? static_cast<const void*>(t.f32) : t.raw, nbytes[i]);
        continue;
      }
      const size_t numel = nbytes[i] / 2;
      for (size_t j = 0; j < numel; j += kChunkElems) {
        size_t m = std::min(kChunkElems, numel - j);
        if (t.dtype == DType::BF16)
          for (size_t k = 0; k < m; ++k) half[k] = f32_to_bf16(t.f32[j + k]);
        else
          for (size_t k = 0; k < m; ++k) half[k] = f32_to_f16(t.f32[j + k]);
        w.write(half.data(), m * 2);
      }
    }
  });
}

}  // namespace dflash
