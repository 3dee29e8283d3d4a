// Per-layer activation views carved out of one allocation that the phases of a decoder layer share: a
// phase's views are dead before the next phase writes (the token mixer's q/k/v/attn or GDN buffers once
// its output projection has run; then the MLP's gate|up and SwiGLU output), so each phase's views start
// at offset 0 and the allocation is the largest phase, not the sum. Used by the targets' decoder stack
// (src/model/decoder_stack.h: ScratchViews) and by the benches that mirror it.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dflash/error.h"
#include "dflash/tensor.h"

namespace dflash {

class ScratchPlan {
 public:
  explicit ScratchPlan(int64_t rows) : rows_(rows) {}

  // The views reserved from here on overlap those of the earlier phases.
  void new_phase() { end_ = 0; }

  // A [rows, cols] view of dtype in the current phase, on a 256-byte boundary (what the vectorised kernels
  // and cuBLASLt want); the returned id names it for view().
  int reserve(DType dtype, int64_t cols) {
    regions_.push_back({end_, dtype, cols});
    end_ += (static_cast<size_t>(rows_) * cols * dtype_size(dtype) + 255) / 256 * 256;
    bytes_ = std::max(bytes_, end_);
    return static_cast<int>(regions_.size()) - 1;
  }

  // The allocation every phase fits in (the largest phase).
  size_t bytes() const { return bytes_; }
  // The bytes of the current phase so far (for a plan's printout).
  size_t phase_bytes() const { return end_; }

  // Region `id` of `work` (a buffer of at least bytes()), [rows, cols].
  Tensor view(const Buffer& work, int id) const {
    DF_ASSERT(id >= 0 && static_cast<size_t>(id) < regions_.size() && work.t().nbytes() >= bytes_);
    const Region& r = regions_[static_cast<size_t>(id)];
    return Tensor(static_cast<char*>(work.t().data) + r.offset, r.dtype, work.t().device, {rows_, r.cols});
  }

 private:
  struct Region {
    size_t offset;
    DType dtype;
    int64_t cols;
  };
  int64_t rows_;
  size_t end_ = 0, bytes_ = 0;
  std::vector<Region> regions_;
};

}  // namespace dflash
