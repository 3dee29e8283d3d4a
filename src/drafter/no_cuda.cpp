// The drafter floor in a build without the CUDA library (CMakeLists.txt links each floor's no_cuda.cpp in
// its place): no CUDA engine (drafter/trainer_engine.h; the trainer answers fatal_no_cuda).
#include "drafter/trainer_engine.h"

namespace dflash::train {
MakeCudaTrainerEngine* const make_cuda_trainer_engine = nullptr;
}  // namespace dflash::train
