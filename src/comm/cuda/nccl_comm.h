// One NCCL communicator's life, for every NCCL user of src/comm/cuda (the nccl data plane's pairs, the
// gradient reducer): created non-blocking (config.blocking = 0, so no NCCL call can hang the host, which
// keeps driving MPI and its deadlines), its setup waited for under a deadline, aborted when a peer is lost
// or a call failed, finalized (bounded by the same deadline) and destroyed otherwise; and DF_NCCL, the
// check every NCCL call goes through.
#pragma once
#include <nccl.h>

#include <string>

namespace dflash {

// NCCL's error text, with the communicator's last message when it has one.
std::string nccl_error(ncclComm_t comm, ncclResult_t r);

class NcclComm {
 public:
  NcclComm() = default;
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Joins communicator `id` as `rank` of `size`; the setup runs in the background. timeout_s bounds
  // wait_ready and the finalize at destruction. False (error() says why) when NCCL refused at once.
  bool begin(const ncclUniqueId& id, int size, int rank, double timeout_s);
  enum class Setup { Ready, Failed, TimedOut };
  // Polls the setup until it is done, failed (error()) or `timeout_s` passed (the caller's share of the
  // deadline begin() was given; <= 0: that deadline).
  Setup wait_ready(double timeout_s = 0);
  // ncclSuccess (the last call is enqueued), ncclInProgress (still enqueuing), or the failure.
  ncclResult_t state();
  // Abandons the communicator (a lost peer, a failed call): nothing more is waited for.
  void abort();
  // Finalizes (bounded by begin()'s deadline) and destroys it; the destructor does this too. For owners
  // that must free it before something it uses (its stream).
  void close();

  ncclComm_t get() const { return comm_; }
  explicit operator bool() const { return comm_ != nullptr; }
  const std::string& error() const { return error_; }

 private:
  ncclComm_t comm_ = nullptr;
  double timeout_s_ = 0;
  std::string error_;
};

// Ends the job for a failed NCCL call: the communicator is abandoned, then fatal(DeviceFailure,
// "<what> failed: <NCCL's error>", hint).
[[noreturn]] void nccl_failed(NcclComm& comm, ncclResult_t r, const std::string& what, const std::string& hint);

}  // namespace dflash

// Checks an NCCL call on `comm` (an NcclComm): ncclSuccess, and ncclInProgress (a non-blocking
// communicator still enqueuing; NcclComm::state() says when it is done), pass; anything else is
// nccl_failed(comm, result, what, hint).
#define DF_NCCL(comm, call, what, hint)                                                     \
  do {                                                                                      \
    const ncclResult_t df_nccl_r_ = (call);                                                 \
    if (df_nccl_r_ != ncclSuccess && df_nccl_r_ != ncclInProgress)                          \
      ::dflash::nccl_failed((comm), df_nccl_r_, (what), (hint));                            \
  } while (0)
