// make_cuda_trainer_engine in a build without the CUDA library (the real one is
// kernels/trainer_engine_cuda.cpp): a CUDA drafter is then an option error with the fix.
#include "dflash/error.h"
#include "train/trainer_engine.h"

namespace dflash::train {

#ifndef DFLASH_HAVE_CUDA
std::unique_ptr<TrainerEngine> make_cuda_trainer_engine(EngineSetup) {
  fatal(ExitCode::BadOptions, "the drafter was asked to train on CUDA but this build has no CUDA backend",
        "rebuild with a CUDA toolkit (DFLASH_CUDA=ON) or run with --backend cpu");
}
#endif

}  // namespace dflash::train
