// A GPU's PCI bus id, the part of a rank's place (Topology::places) only the CUDA runtime knows. A file of
// its own: the topology (CPU library) needs it without the NCCL plane's objects.
#include <cuda_runtime.h>

#include <string>

#include "cuda_check.cuh"

namespace dflash {

std::string gpu_bus_id(int device) {
  char id[32] = {0};
  DF_CUDA(cudaDeviceGetPCIBusId(id, sizeof(id), device));
  return id;
}

}  // namespace dflash
