// How many rows of logits the lm_head loss holds at once: [rows, V] float32 (twice that with a KL
// teacher), in one workspace the engine allocates up front. One rule for the trainer and bench/drafter_bench,
// so the benchmark times the chunking the job runs.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "dflash/tensor.h"

namespace dflash::train {

// CPU: 2^24 floats (64 MB) a chunk, enough to keep its float32 GEMM busy and the job's memory small.
// CUDA: each chunk's lm_head GEMMs (logits, then dh) read the whole [V, H] bf16 table (1.2 GB for Qwen3's
// 151936 x 4096, far past the 50-60 MB L2), so a chunk of a few rows is bound by that read: at the CPU's
// 110 rows an 8B drafter step spends its loss phase streaming the table 70 times. 2^28 floats (1 GiB)
// gives 1766 rows at V = 151936 and 1081 at 248320, where the GEMM runs near its compute rate.
constexpr size_t kLossChunkFloatsCpu = size_t{1} << 24;
constexpr size_t kLossChunkFloatsCuda = size_t{1} << 28;

inline int64_t loss_chunk_rows(Device device, int64_t vocab, int64_t max_rows) {
  const size_t floats = device == Device::CUDA ? kLossChunkFloatsCuda : kLossChunkFloatsCpu;
  const int64_t fit = static_cast<int64_t>(floats / static_cast<size_t>(std::max<int64_t>(vocab, 1)));
  return std::max<int64_t>(1, std::min<int64_t>(max_rows, fit));
}

}  // namespace dflash::train
