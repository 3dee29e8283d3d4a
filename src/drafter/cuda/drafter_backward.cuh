// Backward passes of the ops.h element/row ops that the drafter's training step needs on CUDA: RMSNorm,
// per-head QK-norm + RoPE, SwiGLU. Same contracts as the ops:: functions in include/dflash/ops.h (the CPU
// twins in src/ops/*.cpp carry "CUDA twin: return cuda::<op>(...)" dispatch comments naming these):
// activations and weights BF16, rstd F32, pos I32 in device memory; weight gradients F32, ACCUMULATED;
// input gradients OVERWRITTEN.
#pragma once
#include "dflash/ops.h"

namespace dflash::cuda {

// din [N, C] (BF16), dw [C] (F32, +=), dout/in [N, C] (BF16), w [C] (BF16), rstd [N] (F32).
// C % 8 == 0 and C <= 8192.
void rmsnorm_backward(const Ctx& ctx, const Tensor& din, const Tensor& dw, const Tensor& dout, const Tensor& in,
                      const Tensor& w, const Tensor& rstd);
// din/dout/in [N, nh, hd] (BF16; din may alias dout), dw [hd] (F32, +=), w [hd] (BF16), rstd [N, nh] (F32),
// pos [N] (I32). hd <= 256, even rotary_dim (0 = hd).
void head_norm_rope_backward(const Ctx& ctx, const Tensor& din, const Tensor& dw, const Tensor& dout,
                             const Tensor& in, const Tensor& w, const Tensor& rstd, const Tensor& pos,
                             ops::RopeSpec rope, float eps);
// dgate, dup, dout, gate, up [N, I] (BF16).
void swiglu_backward(const Ctx& ctx, const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up);

}  // namespace dflash::cuda
