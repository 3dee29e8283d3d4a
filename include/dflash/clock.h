// The one monotonic clock of the trainer: deadlines (dflash/mpi_typed.h re-exports it as mpi::Clock),
// timers and rate limits all read steady_clock through here, never the wall clock (which NTP may step).
#pragma once
#include <chrono>

namespace dflash {

using Clock = std::chrono::steady_clock;

// Seconds from t to now.
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Seconds since the clock's own origin (unspecified: only differences between two readings mean anything).
inline double monotonic_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

}  // namespace dflash
