// NcclComm: see nccl_comm.h.
#include "nccl_comm.h"

#include "dflash/error.h"
#include "dflash/mpi_typed.h"

namespace dflash {

std::string nccl_error(ncclComm_t comm, ncclResult_t r) {
  std::string s = ncclGetErrorString(r);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) s += std::string(": ") + last;
  return s;
}

NcclComm::~NcclComm() { close(); }

void NcclComm::close() {
  if (!comm_) return;
  // Finalize flushes outstanding work; bounded like every other wait, then freed either way.
  if (ncclCommFinalize(comm_) == ncclInProgress)
    mpi::poll_until([&] {
      ncclResult_t st = ncclInProgress;
      return ncclCommGetAsyncError(comm_, &st) != ncclSuccess || st != ncclInProgress;
    }, timeout_s_);
  ncclCommDestroy(comm_);
  comm_ = nullptr;
}

bool NcclComm::begin(const ncclUniqueId& id, int size, int rank, double timeout_s) {
  timeout_s_ = timeout_s;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
  if (r == ncclSuccess || r == ncclInProgress) return true;
  error_ = nccl_error(comm_, r);
  return false;
}

NcclComm::Setup NcclComm::wait_ready(double timeout_s) {
  if (!comm_) {
    if (error_.empty()) error_ = "no communicator";
    return Setup::Failed;
  }
  ncclResult_t st = ncclInProgress;
  const bool finished = mpi::poll_until([&] {
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &st);
    if (q != ncclSuccess) st = q;
    return st != ncclInProgress;
  }, timeout_s > 0 ? timeout_s : timeout_s_);
  if (!finished) return Setup::TimedOut;
  if (st == ncclSuccess) return Setup::Ready;
  error_ = nccl_error(comm_, st);
  return Setup::Failed;
}

ncclResult_t NcclComm::state() {
  ncclResult_t st = ncclSuccess;
  const ncclResult_t q = ncclCommGetAsyncError(comm_, &st);
  return q != ncclSuccess ? q : st;
}

void NcclComm::abort() {
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
}

void nccl_failed(NcclComm& comm, ncclResult_t r, const std::string& what, const std::string& hint) {
  const std::string why = nccl_error(comm.get(), r);
  comm.abort();
  fatal(ExitCode::DeviceFailure, what + " failed: " + why, hint);
}

}  // namespace dflash
