// DFlash2's grouped dynamic causal convolution on CUDA (the twin of src/ops/grouped_conv.cpp).
#pragma once
#include "dflash/drafter_ops.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// Same contracts as ops::grouped_conv_forward / ops::grouped_conv_backward (include/dflash/drafter_ops.h):
// in, out, dyn, dout, din, d_dyn BF16; base F32 [k, H] (the fp32 master weight) and dbase F32 [k, H]
// (accumulated, fp32); every sum in fp32.
decltype(ops::grouped_conv_forward) grouped_conv_forward;
decltype(ops::grouped_conv_backward) grouped_conv_backward;

}  // namespace dflash::cuda
