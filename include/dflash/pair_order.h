// Receives from one sender, issued in the order it sent them. NCCL matches the operations of a pair in
// the order each side issues them, so a drafter must issue its receives from a target in that target's
// send order (BatchHeader::seq), though it may notice the slots' headers in any order. Pure bookkeeping,
// tested alone (tests/unit/test_pair_order.cpp); the nccl plane keeps one per sender.
#pragma once
#include <cstdint>
#include <map>

#include "dflash/error.h"

namespace dflash {

class PairOrder {
 public:
  // The header of the sender's seq-th batch (0-based) arrived in `slot`.
  void arrived(int64_t seq, int slot) {
    DF_CHECK(seq >= next_ && waiting_.count(seq) == 0, Internal,
             "batch " << seq << " arrived twice or after its turn (next expected " << next_ << ")");
    waiting_[seq] = slot;
  }
  // The slot whose receive is next in the sender's order, when its header has arrived; else -1. Each
  // call that returns a slot moves the order on by one.
  int take_next() {
    auto it = waiting_.find(next_);
    if (it == waiting_.end()) return -1;
    const int slot = it->second;
    waiting_.erase(it);
    ++next_;
    return slot;
  }
  int64_t next_seq() const { return next_; }
  size_t waiting() const { return waiting_.size(); }

 private:
  int64_t next_ = 0;
  std::map<int64_t, int> waiting_;  // seq -> slot, headers noticed ahead of their turn
};

}  // namespace dflash
