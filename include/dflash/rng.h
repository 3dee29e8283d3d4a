// The seeded generator behind anchor sampling (dflash/anchors.h), feature noise and speculative decoding's
// sampling; defined in src/drafter/rng.cpp.
#pragma once
#include <cstdint>
#include <random>
#include <string>

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

}  // namespace dflash
