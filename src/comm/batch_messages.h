// The host parts of a hidden-state batch, the same on every data plane: the header and the index arrays
// (tokens, cu_seqlens, loss mask) as four non-blocking MPI messages on tags tag + kHeader .. tag + kLossMask
// (tag = kTagSlotBase + slot * kSlotTags). A plane adds its tensor parts after them.
#pragma once
#include <mpi.h>

#include "dflash/hs_batch.h"
#include "dflash/mpi_typed.h"

namespace dflash {

enum BatchPart : int { kHeader, kTokens, kCuSeqlens, kLossMask, kHostParts };

// Receives into b's header and index arrays (at their full capacity; set_filled trims them).
inline void irecv_host_parts(HsBatch& b, int sender, int tag, MPI_Comm comm, MPI_Request* req) {
  req[kHeader] = mpi::irecv(&b.header, 1, sender, tag + kHeader, comm);
  req[kTokens] = mpi::irecv(b.batch.tokens.data(), b.batch.tokens.size(), sender, tag + kTokens, comm);
  req[kCuSeqlens] = mpi::irecv(b.batch.cu_seqlens.data(), b.batch.cu_seqlens.size(), sender, tag + kCuSeqlens, comm);
  req[kLossMask] = mpi::irecv(b.batch.loss_mask.data(), b.batch.loss_mask.size(), sender, tag + kLossMask, comm);
}

inline void isend_host_parts(const HsBatch& b, int dest, int tag, MPI_Comm comm, MPI_Request* req) {
  req[kHeader] = mpi::isend(&b.header, 1, dest, tag + kHeader, comm);
  req[kTokens] = mpi::isend(b.batch.tokens.data(), b.batch.tokens.size(), dest, tag + kTokens, comm);
  req[kCuSeqlens] = mpi::isend(b.batch.cu_seqlens.data(), b.batch.cu_seqlens.size(), dest, tag + kCuSeqlens, comm);
  req[kLossMask] = mpi::isend(b.batch.loss_mask.data(), b.batch.loss_mask.size(), dest, tag + kLossMask, comm);
}

}  // namespace dflash
