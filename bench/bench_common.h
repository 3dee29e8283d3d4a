// What the two target-forward benchmarks (bench_target_forward.cpp: dense Qwen3, bench_hybrid_forward.cpp:
// the Qwen3.5/3.6 hybrid) share: their common options, the packed batch upload and the timing loop, so
// the two report numbers taken the same way.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/tensor.h"

#define BENCH_CUDA(call)                                                                        \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) DF_FAIL(DeviceFailure, #call << ": " << cudaGetErrorString(e_), ""); \
  } while (0)

namespace dflash::bench {

inline std::vector<int32_t> parse_ints(const std::string& s) {
  std::vector<int32_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The options both forward benchmarks take; the caller sets the defaults of model and seqlens.
struct ForwardOptions {
  std::string model, seqlens, capture;  // --model, --seqlens a,b,..., --capture l,m,...
  int iters = 5, warmup = 2;
  bool no_final_norm = false;
};

// Reads argv[i] into o when it is one of ForwardOptions' (i then moves past its value) and returns true;
// false for any other argument, which the caller reads.
inline bool parse_forward_option(int argc, char** argv, int& i, ForwardOptions& o) {
  const std::string a = argv[i];
  auto next = [&]() -> std::string {
    DF_CHECK(i + 1 < argc, BadOptions, a << " needs a value");
    return argv[++i];
  };
  if (a == "--model") o.model = next();
  else if (a == "--seqlens") o.seqlens = next();
  // A mixed-length packing of 16384 tokens: long and short documents together, down to 33 tokens.
  else if (a == "--mixed") o.seqlens = "3011,517,1290,4096,87,2203,740,1650,33,998,1402,357";
  else if (a == "--capture") o.capture = next();
  else if (a == "--iters") o.iters = std::atoi(next().c_str());
  else if (a == "--warmup") o.warmup = std::atoi(next().c_str());
  // A CE job's target forward: no final norm, so the layers after the last capture are not run.
  else if (a == "--no-final-norm") o.no_final_norm = true;
  else return false;
  return true;
}

// Uploads a packed batch as a target forward reads it: tokens, positions (restarting per sequence) and
// cu_seqlens into the first rows of the I32 buffers. Returns the cu_seqlens rows written.
inline int64_t upload_packed_batch(const Ctx& ctx, const Tensor& tokens, const Tensor& pos, const Tensor& cu,
                                   const std::vector<int32_t>& tok, const std::vector<int32_t>& cu_seqlens) {
  const int64_t T = static_cast<int64_t>(tok.size()), ncu = static_cast<int64_t>(cu_seqlens.size());
  std::vector<int32_t> p(T);
  for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i)
    for (int32_t t = cu_seqlens[i]; t < cu_seqlens[i + 1]; ++t) p[t] = t - cu_seqlens[i];
  copy_tensor(ctx, tokens.slice_rows(0, T), cpu_view(tok.data(), {T}));
  copy_tensor(ctx, pos.slice_rows(0, T), cpu_view(p.data(), {T}));
  copy_tensor(ctx, cu.slice_rows(0, ncu), cpu_view(cu_seqlens.data(), {ncu}));
  return ncu;
}

// `warmup` untimed calls, then `iters` calls each between two CUDA events on ctx's stream: the
// milliseconds of each timed call. after_sync runs once the device is idle: after the warm-up and after
// each timed call (the hybrid bench samples free memory there).
template <class Call, class AfterSync>
std::vector<double> time_calls(const Ctx& ctx, int warmup, int iters, Call&& call, AfterSync&& after_sync) {
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < warmup; ++i) call();
  synchronize(ctx);
  after_sync();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(e0, stream));
    call();
    BENCH_CUDA(cudaEventRecord(e1, stream));
    synchronize(ctx);
    after_sync();
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  BENCH_CUDA(cudaEventDestroy(e0));
  BENCH_CUDA(cudaEventDestroy(e1));
  return ms;
}

}  // namespace dflash::bench
