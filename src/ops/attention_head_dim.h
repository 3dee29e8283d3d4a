// Which head dims attention_varlen_causal_forward (and the targets' qkv_norm_rope_forward / head_norm_rope_forward) serve on each
// backend: the rule the model loader checks against config.json before any weight is read, so an
// unsupported target stops at startup (BadOptions) instead of deep in the first forward (Internal).
//
//   CPU:  1 ..= 1024 (the float32 reference keeps a head's accumulators on the stack).
//   CUDA: multiples of 8 up to 256. kernels/attention.cu has two native widths: 128 (Qwen3) and 256
//         (Qwen3.5/3.6 full-attention layers); a head dim below one of them runs zero-padded to it
//         (64, 80, 96 on the 128 kernel; 136 .. 248 on the 256 one). Multiples of 8 because tiles move in
//         16-byte chunks; 256 is the widest fp32 output accumulator a warp holds in registers.
#pragma once
#include <cstdint>
#include <string>

#include "dflash/tensor.h"

namespace dflash::ops {

bool attention_head_dim_supported(Device device, int64_t head_dim);
// The rule in words for error messages, e.g. "multiples of 8 from 8 to 256".
std::string attention_head_dims_text(Device device);

}  // namespace dflash::ops
