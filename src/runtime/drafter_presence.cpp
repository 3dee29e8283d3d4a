#include "drafter_presence.h"

#include "dflash/error.h"
#include "dflash/message_tags.h"

namespace dflash {

DrafterPresence::DrafterPresence(const Topology& topo, double timeout_s) : timeout_s_(timeout_s) {
  if (!topo.runs_drafter()) return;
  for (int r : topo.drafters) {
    if (r == topo.world_rank) continue;
    Peer p;
    p.rank = r;
    peers_.push_back(p);
  }
  for (Peer& p : peers_) p.req = mpi::irecv(&p.incoming, 1, p.rank, kTagRound, MPI_COMM_WORLD);
}

DrafterPresence::~DrafterPresence() {
  for (Peer& p : peers_) mpi::cancel(p.req);
}

void DrafterPresence::announce(int64_t round) {
  while (!out_.empty() && mpi::test(out_.front().req)) out_.pop_front();
  for (Peer& p : peers_) {
    out_.push_back(Outgoing{round, MPI_REQUEST_NULL});
    out_.back().req = mpi::isend(&out_.back().round, 1, p.rank, kTagRound, MPI_COMM_WORLD);
  }
}

void DrafterPresence::poll() {
  for (Peer& p : peers_) {
    while (p.req != MPI_REQUEST_NULL && mpi::test(p.req)) {
      p.last = p.incoming;
      p.req = mpi::irecv(&p.incoming, 1, p.rank, kTagRound, MPI_COMM_WORLD);
    }
  }
}

std::string DrafterPresence::laggards(int64_t round) const {
  std::string names, lasts;
  for (const Peer& p : peers_) {
    if (p.last >= round) continue;
    names += (names.empty() ? "" : ",") + std::to_string(p.rank);
    lasts += (lasts.empty() ? "" : ",") + std::to_string(p.last);
  }
  if (names.empty()) return "";
  return "drafter rank(s) " + names + " (last at round " + lasts + "; this drafter is at round " + std::to_string(round) + ")";
}

void DrafterPresence::finish(int64_t last_round) {
  for (Peer& p : peers_) {
    mpi::Polling polling;
    polling.progress = [&] { poll(); };
    mpi::wait_until([&] { return p.last >= last_round; }, timeout_s_, [&] {
      return "lost peer: drafter rank " + std::to_string(p.rank) + " did not finish round " + std::to_string(last_round) +
             " with the others";
    }, polling, "it died or hangs; see its own error above");
    mpi::cancel(p.req);
  }
  for (Outgoing& o : out_)
    mpi::wait(o.req, timeout_s_, [] { return std::string("a round announcement to a drafter did not complete"); });
  out_.clear();
}

}  // namespace dflash
