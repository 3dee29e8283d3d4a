// DFlash2's candidate selector inside the drafter step on CUDA (drafter_step_common.cuh; docs/dflash2.md 3):
// the twin of the CPU engine's selector_forward / selector_backward (src/drafter/trainer_engine_cpu.cpp).
// u = h W_h^T is a GEMM with an fp32 output; the selector ops (kernels/selector.cu) read the fp32 master
// codebooks and accumulate their gradients in fp32; du goes back to bf16 for the two GEMMs of W_h.
#include <cuda_bf16.h>

#include <vector>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "drafter_step_common.cuh"
#include "matmul.cuh"
#include "selector.cuh"

namespace dflash::cuda {
using namespace drafter_step;

namespace {

__global__ void f32_to_bf16_rows_kernel(__nv_bfloat16* __restrict__ d, const float* __restrict__ s, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) d[i] = __float2bfloat16_rn(s[i]);
}

__global__ void scale_kernel(float* __restrict__ d, const float* __restrict__ s, float a, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) d[i] = a * s[i];
}

}  // namespace

void DrafterStepCuda::Impl::selector_forward(const train::DrafterBatch& b) {
  mark(Phase::Loss);
  // the teacher-forced predecessor of row r: token a+k-1 (the anchor for k = 1), host-built
  std::vector<int32_t> p(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) p[r] = b.in->tokens[b.rows->teacher_at[r]];
  upload_i32(pred, p);
  cuda::selector_candidates(ctx, v2(cand, R, SK), v2(unary, R, SK), v1(gold, R), v1(covered, R), v2(topk_ids, R, SK),
                            v2(topk_vals, R, SK), v1(labels, R), v1(label_logit, R), sel_candidates);
  cuda::matmul_forward(ctx, v2(u, R, SR), v2(h_rows, R, H), w.sel_hidden_proj, ops::Accumulate::No);
  cuda::selector_forward(ctx, v2(scores, R, SK), v1(sel_ce, R), v1(sel_slot, R), v2(u, R, SR), v2(unary, R, SK),
                         v2(cand, R, SK), v1(pred, R), v1(gold, R), w.sel_pred_codebook, w.sel_succ_codebook);
}

void DrafterStepCuda::Impl::selector_backward(const GradReady& ready) {
  mark(Phase::Loss);
  cudaStream_t st = stream_of(ctx);
  scale_kernel<<<grid_of(ctx, R), 256, 0, st>>>(static_cast<float*>(sel_w.t().data),
                                                static_cast<const float*>(row_w.t().data), sel_alpha, R);
  DF_CUDA_LAUNCH();
  cuda::selector_backward(ctx, sel_stop_gradient ? Tensor() : v2(d_unary, R, SK), v2(sel_du, R, SR), g.sel_pred_codebook,
                          g.sel_succ_codebook, v2(scores, R, SK), v1(sel_w, R), v2(u, R, SR), v2(cand, R, SK),
                          v1(pred, R), v1(gold, R), w.sel_pred_codebook, w.sel_succ_codebook);
  report_ready(ready, g.sel_pred_codebook);
  report_ready(ready, g.sel_succ_codebook);
  f32_to_bf16_rows_kernel<<<grid_of(ctx, R * SR), 256, 0, st>>>(static_cast<__nv_bfloat16*>(du_bf.t().data),
                                                                static_cast<const float*>(sel_du.t().data), R * SR);
  DF_CUDA_LAUNCH();
  linear_dw(g.sel_hidden_proj, v2(du_bf, R, SR), v2(h_rows, R, H), w.sel_hidden_proj);
  report_ready(ready, g.sel_hidden_proj);
  if (!sel_stop_gradient) linear_din(v2(dh_sel, R, H), v2(du_bf, R, SR), w.sel_hidden_proj, false);
}

}  // namespace dflash::cuda
