// DFlash2's grouped dynamic causal convolution on CUDA (the twin of src/ops/grouped_conv.cpp).
#pragma once
#include "dflash/drafter_ops.h"

namespace dflash::cuda {

// Same contracts as ops::grouped_conv_forward / ops::grouped_conv_backward (include/dflash/drafter_ops.h):
// in, out, dyn, dout, din, d_dyn BF16; base F32 [k, H] (the fp32 master weight) and dbase F32 [k, H]
// (accumulated, fp32); every sum in fp32.
void grouped_conv_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& dyn, int side,
                          const Tensor& base, const ops::GroupedConvSpec& spec);
void grouped_conv_backward(const Ctx& ctx, const Tensor& din, const Tensor& d_dyn, const Tensor& dbase,
                           const Tensor& dout, const Tensor& in, const Tensor& dyn, int side, const Tensor& base,
                           const ops::GroupedConvSpec& spec);

}  // namespace dflash::cuda
