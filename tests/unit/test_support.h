// Helpers shared by several unit-test files: temp directories, golden-case loading, running a target.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dflash/safetensors.h"
#include "dflash/target.h"
#include "dflash/tensor.h"

namespace dflash::test {

// Makes a fresh directory /tmp/<prefix>XXXXXX; every one is removed when the test binary exits normally
// (death-test children end in _Exit, so they remove nothing).
inline std::string make_temp_dir(const std::string& prefix) {
  struct TempDirs {
    std::vector<std::string> dirs;
    ~TempDirs() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static TempDirs made;
  std::string tmpl = "/tmp/" + prefix + "XXXXXX";
  char* d = ::mkdtemp(tmpl.data());
  EXPECT_NE(d, nullptr);
  if (!d) return "/tmp";
  made.dirs.push_back(d);
  return d;
}

// A safetensors tensor of any float dtype, as float.
inline std::vector<float> read_f32(SafetensorsFile& f, const std::string& name) {
  const TensorInfo& t = f.get(name);
  std::vector<float> v(t.numel());
  to_f32(v.data(), t.data, t.dtype, v.size());
  return v;
}

inline std::vector<int32_t> read_i32(SafetensorsFile& f, const std::string& name) {
  const TensorInfo& t = f.get(name);
  EXPECT_EQ(t.dtype, DType::I32);
  std::vector<int32_t> v(t.numel());
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

// The packed batch of a golden case (tokens, cu_seqlens from <case_dir>/golden.safetensors), every token
// in the loss.
inline PackedBatch golden_batch(const std::string& case_dir) {
  SafetensorsFile g(case_dir + "/golden.safetensors");
  PackedBatch b;
  b.tokens = read_i32(g, "tokens");
  b.cu_seqlens = read_i32(g, "cu_seqlens");
  b.loss_mask.assign(b.tokens.size(), 1);
  return b;
}

inline std::vector<int> all_layers(int L) {
  std::vector<int> v(L);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The target at dir built as the roles build it: config read once, then the factory.
inline std::unique_ptr<TargetModel> load_target(const std::string& dir, const Ctx& ctx, std::vector<int> capture_layers,
                                                int64_t max_tokens) {
  return make_target_model(load_target_config(dir), dir, ctx, std::move(capture_layers), max_tokens);
}

// Runs the target over `batch`, capturing its capture layers; returns {features [k, T, H], final_norm [T, H]}
// (NaN-filled first, so an unwritten element shows).
struct RunResult {
  std::vector<float> features, final_norm;
};
inline RunResult run_target(TargetModel& model, const PackedBatch& batch) {
  const int64_t T = batch.num_tokens(), H = model.config().hidden_size;
  const int64_t k = static_cast<int64_t>(model.capture_layers().size());
  RunResult r;
  r.features.assign(k * T * H, NAN);
  r.final_norm.assign(T * H, NAN);
  CaptureOut out;
  out.features = Tensor(r.features.data(), DType::F32, Device::CPU, {k, T, H});
  out.final_norm = cpu_view(r.final_norm.data(), {T, H});
  model.forward(batch, out);
  return r;
}

}  // namespace dflash::test
