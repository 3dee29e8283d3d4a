// The comm floor in a build without the CUDA library (CMakeLists.txt links each floor's no_cuda.cpp in its
// place): no NCCL data plane, pairs or gradient reducer (dflash/data_plane.h, dflash/grad_reducer.h; their
// callers answer fatal_no_cuda or "this build has no NCCL").
#include "dflash/data_plane.h"
#include "dflash/grad_reducer.h"

namespace dflash {
MakeNcclDataPlane* const make_nccl_data_plane = nullptr;
MakeNcclPairs* const make_nccl_pairs = nullptr;
MakeNcclReducer* const make_nccl_reducer = nullptr;
}  // namespace dflash
