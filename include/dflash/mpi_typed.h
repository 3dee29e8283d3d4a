// Typed MPI wrappers: the datatype and count come from the element type and the element count, so a
// call site never spells MPI_INT/MPI_BYTE or multiplies sizes. Every wait has a deadline and polls
// with a backoff sleep (oversubscribed CI machines: a busy-polling rank starves the others).
#pragma once
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "dflash/clock.h"
#include "dflash/error.h"

namespace dflash::mpi {

// ---- datatypes ----------------------------------------------------------------------------------
template <class T> struct Datatype {
  // Plain structs travel as bytes (both ends run the same binary on the same architecture).
  static_assert(std::is_trivially_copyable<T>::value, "only trivially copyable types travel over MPI");
  static MPI_Datatype type() { return MPI_BYTE; }
  static constexpr size_t scale = sizeof(T);
};
#define DFLASH_MPI_DATATYPE(T, M)                       \
  template <> struct Datatype<T> {                      \
    static MPI_Datatype type() { return M; }            \
    static constexpr size_t scale = 1;                  \
  }
DFLASH_MPI_DATATYPE(float, MPI_FLOAT);
DFLASH_MPI_DATATYPE(double, MPI_DOUBLE);
DFLASH_MPI_DATATYPE(int32_t, MPI_INT32_T);
DFLASH_MPI_DATATYPE(int64_t, MPI_INT64_T);
DFLASH_MPI_DATATYPE(uint8_t, MPI_UINT8_T);
DFLASH_MPI_DATATYPE(uint16_t, MPI_UINT16_T);  // bf16 on the wire
DFLASH_MPI_DATATYPE(uint64_t, MPI_UINT64_T);
DFLASH_MPI_DATATYPE(char, MPI_CHAR);
#undef DFLASH_MPI_DATATYPE

// Element count n of T as an MPI count (fatal Internal beyond INT_MAX: split the message).
template <class T> int count_of(size_t n) {
  size_t c = n * Datatype<T>::scale;
  DF_CHECK(c <= static_cast<size_t>(INT_MAX), Internal, "MPI message of " << c << " elements exceeds INT_MAX");
  return static_cast<int>(c);
}

// ---- requests ------------------------------------------------------------------------------------
template <class T> MPI_Request isend(const T* p, size_t n, int dest, int tag, MPI_Comm comm) {
  MPI_Request r;
  DF_MPI(MPI_Isend(p, count_of<T>(n), Datatype<T>::type(), dest, tag, comm, &r));
  return r;
}
// Receives up to n elements (the message may be shorter: see received_count).
template <class T> MPI_Request irecv(T* p, size_t n, int source, int tag, MPI_Comm comm) {
  MPI_Request r;
  DF_MPI(MPI_Irecv(p, count_of<T>(n), Datatype<T>::type(), source, tag, comm, &r));
  return r;
}
template <class T> size_t received_count(const MPI_Status& st) {
  int c = 0;
  DF_MPI(MPI_Get_count(&st, Datatype<T>::type(), &c));
  return static_cast<size_t>(c) / Datatype<T>::scale;
}
template <class T> MPI_Request iallreduce(T* inout, size_t n, MPI_Op op, MPI_Comm comm) {
  static_assert(Datatype<T>::scale == 1, "reductions need a numeric type");
  MPI_Request r;
  DF_MPI(MPI_Iallreduce(MPI_IN_PLACE, inout, count_of<T>(n), Datatype<T>::type(), op, comm, &r));
  return r;
}
template <class T> MPI_Request ibcast(T* p, size_t n, int root, MPI_Comm comm) {
  MPI_Request r;
  DF_MPI(MPI_Ibcast(p, count_of<T>(n), Datatype<T>::type(), root, comm, &r));
  return r;
}
// Gathers n elements of every rank into recv (n * size elements, root only).
template <class T> MPI_Request igather(const T* send, size_t n, T* recv, int root, MPI_Comm comm) {
  MPI_Request r;
  DF_MPI(MPI_Igather(send, count_of<T>(n), Datatype<T>::type(), recv, count_of<T>(n), Datatype<T>::type(), root, comm, &r));
  return r;
}
// Blocking collectives for the startup phase (before any peer can be lost mid-work).
template <class T> void allgather(const T* send, size_t n, T* recv, MPI_Comm comm) {
  DF_MPI(MPI_Allgather(send, count_of<T>(n), Datatype<T>::type(), recv, count_of<T>(n), Datatype<T>::type(), comm));
}
template <class T> void allreduce(T* inout, size_t n, MPI_Op op, MPI_Comm comm) {
  static_assert(Datatype<T>::scale == 1, "reductions need a numeric type");
  DF_MPI(MPI_Allreduce(MPI_IN_PLACE, inout, count_of<T>(n), Datatype<T>::type(), op, comm));
}
template <class T> void bcast(T* p, size_t n, int root, MPI_Comm comm) {
  DF_MPI(MPI_Bcast(p, count_of<T>(n), Datatype<T>::type(), root, comm));
}

// True when r is done (or null); fills *st when given.
bool test(MPI_Request& r, MPI_Status* st = nullptr);
// Cancels a pending receive and completes it (so nothing is outstanding at MPI_Finalize).
void cancel(MPI_Request& r);

// ---- deadlines and polling ----------------------------------------------------------------------
using dflash::Clock;  // the one clock (dflash/clock.h)
using dflash::seconds_since;

class Deadline {
 public:
  explicit Deadline(double seconds) : start_(Clock::now()), seconds_(seconds) {}
  bool expired() const { return elapsed() > seconds_; }
  double elapsed() const { return seconds_since(start_); }
  double seconds() const { return seconds_; }
  void restart() { start_ = Clock::now(); }

 private:
  Clock::time_point start_;
  double seconds_;
};

// Backoff between polls of an idle loop: a few yields, then sleeps growing to max_sleep_us. reset()
// after progress so a busy pipeline reacts within microseconds and an idle rank costs ~nothing.
class Backoff {
 public:
  explicit Backoff(int max_sleep_us = 2000) : max_sleep_us_(max_sleep_us) {}
  void idle();
  void reset() { n_ = 0; }

 private:
  int n_ = 0;
  int max_sleep_us_;
};

// How a wait polls: progress() runs before every test (the caller's other duties: credits, receives);
// busy() true means data is moving, so the next poll comes without a sleep; the backoff's longest sleep.
struct Polling {
  std::function<void()> progress;
  std::function<bool()> busy;
  int max_sleep_us = 2000;
};

// The one deadline wait every wait on a peer goes through (docs/pipeline.md "Deadlines"): polls until
// done() is true (returns true) or timeout_s has passed (returns false; timeout_s <= 0: no deadline).
bool poll_until(const std::function<bool()>& done, double timeout_s, const Polling& polling = {});

extern const char* const kLostPeerHint;  // "a peer rank died or hangs; see its own error above, ..."
// poll_until, then fatal(LostPeer, why() + " (waited N s)", hint) when the deadline passed first.
void wait_until(const std::function<bool()>& done, double timeout_s, const std::function<std::string()>& why,
                const Polling& polling = {}, const std::string& hint = kLostPeerHint);

// Waits for r, calling progress() between polls (the caller's other duties: credits, receives), until
// done or the deadline passes; then fatal(LostPeer, on_timeout()).
void wait(MPI_Request& r, double timeout_s, const std::function<std::string()>& on_timeout,
          const std::function<void()>& progress = {}, MPI_Status* st = nullptr);

}  // namespace dflash::mpi
