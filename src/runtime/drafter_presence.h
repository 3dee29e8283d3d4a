// Which drafter is lost when a collective among the drafters stalls: before each lockstep round every
// drafter tells every other one (a small point-to-point message) the round it is entering. When an
// allreduce passes its deadline, the peers whose last word is an older round are the ones to name.
#pragma once
#include <deque>
#include <string>
#include <vector>

#include "dflash/mpi_typed.h"
#include "dflash/topology.h"

namespace dflash {

class DrafterPresence {
 public:
  DrafterPresence(const Topology& topo, double timeout_s);
  ~DrafterPresence();
  void announce(int64_t round);  // "I am entering round `round`" to every other drafter
  void poll();                   // takes in the peers' announcements (call it while waiting)
  // "drafter rank(s) 7 (last at round 41; this drafter is at 42)", or "" when every peer is as far.
  std::string laggards(int64_t round) const;
  // Waits until every peer announced `last_round` (all drafters run the same rounds), then cancels the
  // pending receives, so nothing is outstanding at MPI_Finalize.
  void finish(int64_t last_round);

 private:
  struct Peer {
    int rank = -1;
    int64_t incoming = -1;  // receive buffer
    int64_t last = -1;      // newest round announced
    MPI_Request req = MPI_REQUEST_NULL;
  };
  struct Outgoing {
    int64_t round;
    MPI_Request req;
  };
  std::vector<Peer> peers_;
  std::deque<Outgoing> out_;  // deque: buffers stay put while MPI sends them
  double timeout_s_;
};

}  // namespace dflash
