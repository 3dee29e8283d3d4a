// A packed batch of whole token sequences: what the loader produces, a target forward consumes and the
// drafter trains on. Plain host data, so the data layer does not depend on any model.
#pragma once
#include <cstdint>
#include <vector>

namespace dflash {

struct PackedBatch {
  std::vector<int32_t> tokens;      // [T]
  std::vector<int32_t> cu_seqlens;  // [nseq + 1], cu_seqlens[0] = 0, cu_seqlens[nseq] = T
  std::vector<uint8_t> loss_mask;   // [T]
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int num_seqs() const { return static_cast<int>(cu_seqlens.size()) - 1; }
};

}  // namespace dflash
