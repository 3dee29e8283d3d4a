// The seam to the CUDA library (src/core/cuda_entry.h): the table and the floors' CUDA factory slots are
// all there in a CUDA build and all null without one, where a CUDA request is the one fatal BadOptions.
#include <gtest/gtest.h>

#include "core/cuda_entry.h"
#include "dflash/backend.h"
#include "dflash/data_plane.h"
#include "dflash/grad_reducer.h"
#include "drafter/trainer_engine.h"

namespace dflash {
namespace {

TEST(CudaSeam, FloorSlotsFollowTheTable) {
  const bool in = cuda::in_build();
  EXPECT_EQ(make_nccl_data_plane != nullptr, in);
  EXPECT_EQ(make_nccl_pairs != nullptr, in);
  EXPECT_EQ(make_nccl_reducer != nullptr, in);
  EXPECT_EQ(train::make_cuda_trainer_engine != nullptr, in);
}

TEST(CudaSeam, CudaContextWithoutTheLibraryIsOneOptionsError) {
  if (cuda::in_build()) GTEST_SKIP() << "a CUDA build";
  EXPECT_EXIT(make_ctx(Device::CUDA, 0), testing::ExitedWithCode(2),
              "a CUDA context was requested: this build has no CUDA backend");
  EXPECT_FALSE(deterministic_kernels());
  set_deterministic_kernels(true);  // recorded without the library, so the switch reads back
  EXPECT_TRUE(deterministic_kernels());
  set_deterministic_kernels(false);
  EXPECT_EQ(cuda_device_count(), 0);
}

}  // namespace
}  // namespace dflash
