// Anchor sampling for DFlash training and the seeded generator behind it (and behind feature noise).
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dflash/packed_batch.h"

namespace dflash {

// A seeded generator whose whole state round-trips through a string (checkpoints). std::mt19937_64's
// output sequence and its text state are fixed by the C++ standard; the bounded and Gaussian draws
// below are written out here (not std::*_distribution, whose algorithms differ between libraries) so a
// resumed run draws exactly what the original would have.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : gen_(seed) {}
  uint64_t next() { return gen_(); }
  uint64_t below(uint64_t n);  // uniform in [0, n), unbiased; n > 0
  double uniform();            // [0, 1), 53 bits
  double normal();             // standard normal (Box-Muller)
  std::string state() const;
  void set_state(const std::string& s);  // fatal BadInput on a malformed state

 private:
  std::mt19937_64 gen_;
};

// Draws up to max_anchors anchors per packed batch, uniformly without replacement among the valid
// positions p (global token index) of any sequence: loss_mask[p] and loss_mask[p + 1], with p + 1 in
// the same sequence. Returned sorted. Every valid position is taken when there are at most max_anchors.
class AnchorSampler {
 public:
  explicit AnchorSampler(uint64_t seed) : rng_(seed) {}
  std::vector<int64_t> sample(const PackedBatch& batch, int max_anchors);
  std::string state() const { return rng_.state(); }
  void set_state(const std::string& s) { rng_.set_state(s); }

 private:
  Rng rng_;
  std::vector<int64_t> valid_;  // reused between calls
};

// Positions p eligible as anchors (as above), in increasing order.
void valid_anchor_positions(const PackedBatch& batch, std::vector<int64_t>& out);

}  // namespace dflash
