// What the NCCL users of src/comm/cuda share: an error text that carries NCCL's own last message.
#pragma once
#include <nccl.h>

#include <string>

namespace dflash {

inline std::string nccl_error(ncclComm_t comm, ncclResult_t r) {
  std::string s = ncclGetErrorString(r);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) s += std::string(": ") + last;
  return s;
}

}  // namespace dflash
