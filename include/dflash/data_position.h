// The loader's resume point (the loader is dflash/data.h; src/data/loader.cpp defines its text form). Its
// own header because it travels in every batch header (dflash/hs_batch.h) and checkpoints.
#pragma once
#include <cstdint>
#include <string>

namespace dflash {

// Where the next batch starts: enough to restart the loader so it produces exactly the batches a
// run that never stopped would have produced. The shuffle of epoch e is a pure function of
// (seed, e), so (epoch, cursor) is the whole RNG state; seed and sharding are kept to refuse a
// position from a different setup.
struct DataPosition {
  int64_t epoch = 0;     // 0-based
  int64_t cursor = 0;    // index into this shard's record order of the epoch
  int64_t batches = 0;   // batches produced before this position (LoadedBatch::index continues from it)
  uint64_t seed = 0;
  int shard_index = 0;
  int num_shards = 1;
  std::string to_string() const;                        // "dflash-data-pos v1 epoch=.. cursor=.. ..."
  static DataPosition parse(const std::string& text);   // fatal BadInput on a malformed string
  bool operator==(const DataPosition& o) const;
};

}  // namespace dflash
