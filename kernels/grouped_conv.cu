// DFlash2's grouped dynamic causal convolution on CUDA: not built yet (the CUDA drafter step refuses DFlash2
// drafters, src/drafter/trainer.cpp); the entry points fail clearly until the kernels land.
#include "grouped_conv.cuh"
#include "dflash/error.h"

namespace dflash::cuda {

void grouped_conv_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, int, const Tensor&,
                          const ops::GroupedConvSpec&) {
  DF_FAIL(BadOptions, "grouped_conv_forward: the CUDA kernel is not built yet", "use --backend cpu for DFlash2");
}
void grouped_conv_backward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, int, const Tensor&, const ops::GroupedConvSpec&) {
  DF_FAIL(BadOptions, "grouped_conv_backward: the CUDA kernel is not built yet", "use --backend cpu for DFlash2");
}

}  // namespace dflash::cuda
