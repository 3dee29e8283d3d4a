// A colocated rank (--topology colocated, docs/pipeline.md "The colocated layout"): one process, two
// threads, a target and a drafter. Where the two meet: every rank passes the world's barriers (all models
// loaded; the eval features in place) once, so on a colocated rank the drafter thread passes them for the
// process once its target thread has arrived, and the target thread waits for that, keeping its endpoint
// moving (only one thread of a process may run a collective on a communicator at a time).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>

namespace dflash {

class ColocatedMeet {
 public:
  enum class Point : uint8_t { Loaded = 0, EvalFeatures = 1 };
  // Target thread: says it arrived at p, then waits (poll between looks) until the drafter thread passed
  // the world's barrier. Bounded by timeout_s: fatal LostPeer.
  void target_arrives(Point p, double timeout_s, const std::function<void()>& poll);
  // Drafter thread: waits (poll between looks) for the target thread at p, runs barrier (the world's),
  // then lets the target thread go on. Bounded by timeout_s: fatal LostPeer.
  void drafter_passes(Point p, double timeout_s, const std::function<void()>& poll, const std::function<void()>& barrier);

 private:
  std::atomic<bool> arrived_[2] = {false, false};
  std::atomic<bool> passed_[2] = {false, false};
};

}  // namespace dflash
