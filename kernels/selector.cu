// DFlash2's candidate selector on CUDA: not built yet (the CUDA drafter step refuses DFlash2 drafters,
// src/drafter/trainer.cpp); the entry points fail clearly until the kernels land.
#include "selector.cuh"
#include "dflash/error.h"

namespace dflash::cuda {

void selector_candidates(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&) {
  DF_FAIL(BadOptions, "selector_candidates: the CUDA kernel is not built yet", "use --backend cpu for DFlash2");
}
void selector_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  DF_FAIL(BadOptions, "selector_forward: the CUDA kernel is not built yet", "use --backend cpu for DFlash2");
}
void selector_backward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&) {
  DF_FAIL(BadOptions, "selector_backward: the CUDA kernel is not built yet", "use --backend cpu for DFlash2");
}

}  // namespace dflash::cuda
