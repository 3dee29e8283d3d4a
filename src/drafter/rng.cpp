// The seeded generator (see include/dflash/rng.h).
#include "dflash/rng.h"

#include <cmath>
#include <sstream>

#include "dflash/error.h"

namespace dflash {

uint64_t Rng::below(uint64_t n) {
  DF_ASSERT(n > 0);
  // Rejection sampling: accept r >= 2^64 mod n, so every residue is equally likely.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t r = gen_();
    if (r >= threshold) return r % n;
  }
}

double Rng::uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

std::string Rng::state() const {
  std::ostringstream os;
  os << gen_;
  return os.str();
}

void Rng::set_state(const std::string& s) {
  std::istringstream is(s);
  std::mt19937_64 g;
  is >> g;
  DF_CHECK_HINT(!is.fail(), BadInput, "malformed random generator state (" << s.size() << " characters)",
                "the checkpoint's rng state is damaged; resume from another checkpoint");
  gen_ = g;
}

}  // namespace dflash
