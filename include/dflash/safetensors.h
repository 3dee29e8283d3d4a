// safetensors reading (memory-mapped, fully validated) and writing (atomic), single files and HF
// sharded checkpoints (model.safetensors.index.json). Any violation is a BadInput fatal error that names
// the file and, where it applies, the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dflash/safe_file.h"  // LinkPolicy
#include "dflash/tensor.h"

namespace dflash {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapping
  size_t nbytes = 0;
  size_t numel() const;
  std::string shape_str() const;
};

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  // Validates everything; fatal BadInput on violation. A FIFO at the path never blocks the open.
  // LinkPolicy::Refuse for a file under the run directory (a checkpoint's state): opened through the held
  // descriptor, never through a link (include/dflash/safe_file.h).
  explicit SafetensorsFile(const std::string& path, LinkPolicy links = LinkPolicy::Follow);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const;
  const TensorInfo& get(const std::string& name) const;  // fatal BadInput naming the tensor if missing
  const std::vector<std::string>& names() const { return order_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> metadata_;
};

// Copies a floating-point tensor (F32/BF16/F16) into dst [numel] as float32; any other dtype is a BadInput
// error naming `source` (the file or directory it came from). Handles data that is not aligned in the file.
void tensor_to_f32(const TensorInfo& t, float* dst, const std::string& source);

// A checkpoint directory: model.safetensors.index.json + shards, or a single model.safetensors.
// Shards are opened lazily and can be released so a loader never maps the whole checkpoint at once.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  bool has(const std::string& name) const;
  const TensorInfo& get(const std::string& name);  // opens the shard on first use
  std::vector<std::string> names() const;
  // Shard files in order, and the tensor names each holds (for shard-by-shard loading).
  std::vector<std::string> shard_files() const;
  std::vector<std::string> names_in_shard(const std::string& shard_file) const;
  void release_shard(const std::string& shard_file);
  // The shard file that holds `name` (fatal BadInput naming it when missing).
  const std::string& shard_of(const std::string& name) const;  // unmaps it: its TensorInfo pointers become invalid
  // Checks, before any loading, that `name` exists with exactly `shape` and a floating dtype (F32, BF16,
  // F16); fatal BadInput naming the tensor and `hint` otherwise. Returns its info.
  const TensorInfo& expect_float(const std::string& name, const std::vector<int64_t>& shape,
                                 const std::string& hint);
  // Checks that `name` exists with exactly `shape` (fatal BadInput naming it otherwise) and copies it,
  // converted to float32, into dst [numel].
  void load_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst);
  // The half-precision dtype of `names` (after expect_float) against `label`, config.json's "dtype" /
  // "torch_dtype" as parsed with the config (Qwen3Config::dtype_label): a checkpoint whose bfloat16 bytes
  // are labelled F16 (or the reverse) would load as garbage that still trains. F32 tensors pass
  // (checkpoints keep some in fp32); an empty label checks only that BF16 and F16 are not mixed. Fatal BadInput naming a disagreeing tensor.
  void check_dtype_label(const std::vector<std::string>& names, const std::string& label);
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::map<std::string, std::string> weight_map_;  // tensor -> shard file name
  std::map<std::string, std::unique_ptr<SafetensorsFile>> open_;
};

// A tensor to write: float32 data converted to `dtype` (F32, BF16 or F16) on write, or raw bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const float* f32 = nullptr;   // source when converting
  const void* raw = nullptr;    // source bytes in `dtype` already (used when f32 is null)
};

// Writes a .safetensors file atomically (temp file in the same directory, fsync, rename, directory fsync).
// Header padded with spaces to a multiple of 8; tensors laid out in the given order.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Atomically writes a text file (used for config.json and index files).
void write_file_atomic(const std::string& path, const std::string& contents);

}  // namespace dflash
