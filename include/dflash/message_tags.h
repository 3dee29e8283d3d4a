// Every MPI tag of the job's point-to-point messages on MPI_COMM_WORLD, in one place: two messages that
// share a tag between the same pair of ranks could be matched to each other's receive. The small tags are
// one kind of message each; the data plane's slots use the range from kTagSlotBase up.
#pragma once

namespace dflash {

constexpr int kTagToTarget = 1;   // drafter -> target: a ControlMsg (include/dflash/hs_batch.h)
constexpr int kTagToDrafter = 2;  // target -> drafter: a ControlMsg
constexpr int kTagRound = 3;      // drafter -> drafter: the lockstep round it enters (src/runtime/drafter_presence.cpp)
constexpr int kTagNcclId = 4;     // target -> drafter: the pair communicator's unique id (src/comm/cuda/data_plane_nccl.cpp)
constexpr int kTagStopSignal = 5; // a target or idle rank -> the first drafter: the stop signal it received
                                  // (src/checkpoint/stop_signal.cpp)
constexpr int kTagShutdown = 6;   // working rank -> rank 0: done (its code); rank 0 -> every rank: the job's code;
                                  // idle rank -> rank 0: the answer (src/runtime/shutdown.cpp)

// The host messages of data-plane slot s: kTagSlotBase + s * kSlotTags + part (src/comm/data_plane_mpi.cpp,
// src/comm/cuda/data_plane_nccl.cpp); the top slot is checked against MPI_TAG_UB when the plane is made.
constexpr int kTagSlotBase = 100;
constexpr int kSlotTags = 8;

namespace message_tags {
constexpr int kSingle[] = {kTagToTarget, kTagToDrafter, kTagRound, kTagNcclId, kTagStopSignal, kTagShutdown};
}  // namespace message_tags

// True when tag is a valid tag below the slot range that none of the single-message tags above takes.
constexpr bool message_tag_is_free(int tag) {
  if (tag < 0 || tag >= kTagSlotBase) return false;
  for (int t : message_tags::kSingle)
    if (t == tag) return false;
  return true;
}

// The single-message tags differ from each other and stay below the slots.
constexpr bool message_tags_distinct() {
  constexpr int n = sizeof(message_tags::kSingle) / sizeof(message_tags::kSingle[0]);
  for (int i = 0; i < n; ++i) {
    if (message_tags::kSingle[i] < 0 || message_tags::kSingle[i] >= kTagSlotBase) return false;
    for (int j = i + 1; j < n; ++j)
      if (message_tags::kSingle[i] == message_tags::kSingle[j]) return false;
  }
  return true;
}
static_assert(message_tags_distinct(), "every single-message tag must be distinct and below kTagSlotBase");
static_assert(kSlotTags > 0, "a slot needs tags of its own");

}  // namespace dflash
