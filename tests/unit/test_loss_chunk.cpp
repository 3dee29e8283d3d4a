// train::loss_chunk_rows: the rows of logits a loss chunk holds, one rule for the trainer and drafter_bench.
#include <gtest/gtest.h>

#include "drafter/loss_chunk.h"

namespace {

using dflash::Device;
using dflash::train::loss_chunk_rows;

TEST(LossChunk, CpuKeeps16MLogitsAChunk) {
  EXPECT_EQ(loss_chunk_rows(Device::CPU, 151936, 7680), (int64_t{1} << 24) / 151936);  // 110 rows
  EXPECT_EQ(loss_chunk_rows(Device::CPU, 248320, 7680), 67);
}

// The GPU chunk must be big enough for the lm_head GEMM (which reads the whole [V, H] table per chunk) to
// run near its compute rate: 1766 rows at Qwen3's vocabulary, 1081 at Qwen3.5's.
TEST(LossChunk, CudaTakes256MLogitsAChunk) {
  EXPECT_EQ(loss_chunk_rows(Device::CUDA, 151936, 7680), 1766);
  EXPECT_EQ(loss_chunk_rows(Device::CUDA, 248320, 7680), 1081);
}

TEST(LossChunk, CappedByTheBatchAndAtLeastOneRow) {
  EXPECT_EQ(loss_chunk_rows(Device::CUDA, 151936, 300), 300);  // a small batch: one chunk
  EXPECT_EQ(loss_chunk_rows(Device::CPU, 64, 10), 10);
  EXPECT_EQ(loss_chunk_rows(Device::CPU, int64_t{1} << 30, 7680), 1);  // a vocabulary wider than a chunk
}

}  // namespace
