// Values that crashed or overflowed past their checks (issue 48 item 8, the parts outside options
// parsing): --conv-group-size 0 / negative (src/drafter/drafter_io.cpp), --global-batch-tokens near INT64_MAX
// (src/drafter/schedule.cpp), the --max-anchors derived from --anchors-per-record (src/drafter/anchors.cpp),
// mix weights whose sum overflows (src/data/data_mix.cpp), and the startup disk check's metrics reserve.
#include <gtest/gtest.h>

#include <climits>
#include <string>

#include "dflash/anchors.h"
#include "dflash/data_mix.h"
#include "dflash/drafter.h"
#include "dflash/hf_config.h"
#include "dflash/metrics.h"
#include "dflash/schedule.h"

using namespace dflash;
using testing::ExitedWithCode;

TEST(OptionBounds, ConvGroupSizeIsCheckedBeforeItDivides) {
  const Qwen3Config t = load_qwen3_config(std::string(DFLASH_TEST_DATA) + "/golden/dflash2-tiny-a/target/config.json");
  TrainOptions opt;
  opt.block_size = 8;
  opt.draft_arch = DraftArch::DFlash2;
  opt.d2.conv_group_size = 16;
  EXPECT_EQ(fresh_drafter_config(t, 1, opt).d2.conv_group_size, 16);
  for (int bad : {0, -16}) {
    opt.d2.conv_group_size = bad;
    EXPECT_EXIT(fresh_drafter_config(t, 1, opt), ExitedWithCode(2),
                "bad value " + std::to_string(bad) + " for --conv-group-size")
        << bad;
  }
}

TEST(OptionBounds, GlobalBatchTokensNearInt64MaxIsRefusedNotK1) {
  EXPECT_EQ(grad_accum_for(98305, 32768, 1), 4);  // rounded up as before
  EXPECT_EXIT(grad_accum_for(INT64_MAX - 5, 32768, 1), ExitedWithCode(2), "--global-batch-tokens 9223372036854775802 needs");
  EXPECT_EXIT(grad_accum_for(INT64_MAX, 1, 7), ExitedWithCode(2), "micro-batches per step");
}

TEST(OptionBounds, DerivedMaxAnchorsIsBoundedAsTheFlagIs) {
  EXPECT_EQ(default_max_anchors(512, 32768), 512 * 11);
  EXPECT_EQ(default_max_anchors(1 << 20, 3072), 1 << 20);  // the bound itself
  EXPECT_EXIT(default_max_anchors(1 << 20, 3073), ExitedWithCode(2), "--anchors-per-record 1048576 with --token-budget 3073");
  EXPECT_EXIT(default_max_anchors(512, INT64_MAX), ExitedWithCode(2), "above the most a batch may hold, 1048576");
}

TEST(OptionBounds, MixWeightsWhoseSumOverflowsAreRefused) {
  check_data_sources({{"a.h5", 1e300}, {"b.h5", 1e300}});  // large, finite sum: accepted
  EXPECT_EXIT(check_data_sources({{"a.h5", 1e308}, {"b.h5", 1e308}}), ExitedWithCode(2), "--data weights sum to inf");
}

TEST(OptionBounds, MetricsReserveIsWhatTheWriterAllocates) {
  EXPECT_EQ(metrics_reserve_bytes(100000, 0), size_t{64} << 20);  // the cap
  EXPECT_EQ(metrics_reserve_bytes(10, 0), metrics_reserve_bytes(10, 40));  // fewer than 40 series count as 40
  EXPECT_GT(metrics_reserve_bytes(10, 100), metrics_reserve_bytes(10, 0));
}
