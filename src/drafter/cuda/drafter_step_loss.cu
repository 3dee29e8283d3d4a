// The drafter step's loss rows on CUDA (drafter_step_common.cuh): the rows of the final hidden states (and
// of the teacher's final_norm) gathered for the fused lm_head + loss, the per-row results downloaded, and the
// rows' gradient scattered back to the block rows for the network backward.
#include <cuda_bf16.h>

#include <vector>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"
#include "drafter_step_common.cuh"
#include "lm_loss.cuh"

namespace dflash::cuda {
using namespace drafter_step;  // the step's internal types and helpers (drafter_step_common.cuh)

namespace {

// dst [R, H] <- src rows idx[r]   (scatter = false)    or    dst rows idx[r] <- src [R, H]   (scatter = true)
__global__ void move_rows_kernel(Bf16x8* __restrict__ dst, const Bf16x8* __restrict__ src,
                                 const int32_t* __restrict__ idx, int64_t R, int H8, bool scatter) {
  const int64_t n = R * H8, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / H8, h = i % H8, j = idx[r];
    if (scatter)
      dst[j * H8 + h] = src[i];
    else
      dst[i] = src[j * H8 + h];
  }
}

}  // namespace

void DrafterStepCuda::Impl::loss_rows(const train::DrafterBatch& b, const Tensor& hf, ops::LossObjective objective,
                                      bool grad) {
  R = static_cast<int64_t>(b.rows->block_row.size());
  DF_CHECK(R <= max_R && b.rows->label.size() == size_t(R) && b.rows->weight.size() == size_t(R) &&
               b.rows->teacher_at.size() == size_t(R),
           Internal, "drafter step (CUDA): " << R << " loss rows (capacity " << max_R << ") or ragged row vectors");
  if (R == 0) return;
  cudaStream_t st = stream_of(ctx);
  mark(Phase::Loss);
  const bool kl = objective == ops::LossObjective::KL;
  DF_CHECK(!kl || !b.fb->final_norm.empty(), Internal, "drafter step (CUDA): the KL objective needs final_norm");
  have_teacher = !b.fb->final_norm.empty();
  upload_i32(row_idx, b.rows->block_row);
  upload_i32(labels, b.rows->label);
  if (grad) {
    double wsum = 0;
    for (float x : b.rows->weight) wsum += x;
    std::vector<float> wn(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) wn[r] = static_cast<float>(b.rows->weight[r] / wsum);
    copy_bytes(ctx, row_w.t().data, wn.data(), sizeof(float) * wn.size());
  }
  const int H8 = static_cast<int>(H / 8);
  move_rows_kernel<<<grid_of(ctx, R * H8), 256, 0, st>>>(static_cast<Bf16x8*>(h_rows.t().data),
                                                    static_cast<const Bf16x8*>(hf.data),
                                                    static_cast<const int32_t*>(row_idx.t().data), R, H8, false);
  DF_CUDA_LAUNCH();
  Tensor teacher;
  if (have_teacher) {
    upload_i32(teacher_idx, b.rows->teacher_at);
    move_rows_kernel<<<grid_of(ctx, R * H8), 256, 0, st>>>(static_cast<Bf16x8*>(t_rows.t().data),
                                                      static_cast<const Bf16x8*>(b.fb->final_norm.data),
                                                      static_cast<const int32_t*>(teacher_idx.t().data), R, H8, false);
    DF_CUDA_LAUNCH();
    teacher = v2(t_rows, R, H);
  }
  ops::LmLossRowsOut lo;
  lo.ce = v1(loss_r, R);
  lo.kl = kl ? v1(kl_r, R) : Tensor();
  lo.argmax_q = v1(am_q, R);
  lo.argmax_p = have_teacher ? v1(am_p, R) : Tensor();
  if (d2) {  // the selector's inputs, from the same pass; its gradient comes later (backward_from_weights)
    lo.topk_ids = v2(topk_ids, R, SK);
    lo.topk_vals = v2(topk_vals, R, SK);
    lo.label_logit = v1(label_logit, R);
  }
  const bool fused = grad;  // DFlash2's selector term joins later through its sparse addend
  cuda::lm_loss_forward(ctx, lo, v2(h_rows, R, H), lm_head, v1(labels, R), teacher,
                        v1(workspace, static_cast<int64_t>(workspace.numel())), chunk_rows,
                        fused ? v2(dh_rows, R, H) : Tensor(), fused ? v1(row_w, R) : Tensor(), objective, logit);
}

void DrafterStepCuda::Impl::selector_into_fused_dh(const GradReady& ready) {
  selector_backward(ready);
  if (sel_stop_gradient) return;
  mark(Phase::Loss);
  cuda::lm_loss_sparse_backward(ctx, v2(dh_rows, R, H), v2(cand, R, SK), v2(unary, R, SK), v2(d_unary, R, SK), lm_head,
                                logit, v2(dh_sel, R, H));  // dh += sparse addend + du W_h, rounded once
}

void DrafterStepCuda::Impl::backward_from_weights(const GradReady& ready, ops::LossObjective objective) {
  if (d2) selector_backward(ready);
  const bool sparse = d2 && !sel_stop_gradient;
  const Tensor teacher = have_teacher ? v2(t_rows, R, H) : Tensor();
  mark(Phase::Loss);
  cuda::lm_loss_backward(ctx, v2(dh_rows, R, H), v1(row_w, R), objective, v2(h_rows, R, H), lm_head, v1(labels, R),
                         teacher, v1(workspace, static_cast<int64_t>(workspace.numel())), chunk_rows, logit,
                         sparse ? v2(cand, R, SK) : Tensor(), sparse ? v2(d_unary, R, SK) : Tensor());
  if (sparse) add(v2(dh_rows, R, H), v2(dh_sel, R, H));  // dh += du W_h
  backward_from_rows(ready);
}

void DrafterStepCuda::Impl::download_rows(const train::DrafterBatch& b, ops::LossObjective objective,
                                          DrafterStepResult& res) {
  if (R == 0) return;
  res.row_loss.resize(static_cast<size_t>(R));
  res.row_ce.resize(static_cast<size_t>(R));
  res.argmax_q.resize(static_cast<size_t>(R));
  res.argmax_p.resize(have_teacher ? static_cast<size_t>(R) : 0);
  copy_bytes(ctx, res.row_ce.data(), loss_r.t().data, sizeof(float) * R);
  if (objective == ops::LossObjective::KL)
    copy_bytes(ctx, res.row_loss.data(), kl_r.t().data, sizeof(float) * R);
  else
    res.row_loss = res.row_ce;
  copy_bytes(ctx, res.argmax_q.data(), am_q.t().data, sizeof(int32_t) * R);
  if (have_teacher) copy_bytes(ctx, res.argmax_p.data(), am_p.t().data, sizeof(int32_t) * R);
  double num = 0, wsum = 0;
  for (int64_t r = 0; r < R; ++r) {
    num += static_cast<double>(b.rows->weight[r]) * res.row_loss[r];
    wsum += b.rows->weight[r];
  }
  res.weight_sum = wsum;
  res.loss = num / wsum;
  if (!d2) return;
  const size_t n = static_cast<size_t>(R), nk = n * static_cast<size_t>(SK);
  res.unary = res.row_loss;
  res.sel_ce.resize(n);
  res.covered.resize(n);
  res.sel_token.resize(n);
  res.topk_ids.resize(nk);
  res.topk_vals.resize(nk);
  res.u.resize(n * static_cast<size_t>(SR));
  std::vector<int32_t> slot(n), cands(nk);
  copy_bytes(ctx, res.sel_ce.data(), sel_ce.t().data, sizeof(float) * n);
  copy_bytes(ctx, res.covered.data(), covered.t().data, n);
  copy_bytes(ctx, slot.data(), sel_slot.t().data, sizeof(int32_t) * n);
  copy_bytes(ctx, cands.data(), cand.t().data, sizeof(int32_t) * nk);
  copy_bytes(ctx, res.topk_ids.data(), topk_ids.t().data, sizeof(int32_t) * nk);
  copy_bytes(ctx, res.topk_vals.data(), topk_vals.t().data, sizeof(float) * nk);
  copy_bytes(ctx, res.u.data(), u.t().data, sizeof(float) * res.u.size());
  num = 0;
  for (size_t r = 0; r < n; ++r) {
    res.sel_token[r] = cands[r * static_cast<size_t>(SK) + static_cast<size_t>(slot[r])];
    res.row_loss[r] = res.unary[r] + sel_alpha * res.sel_ce[r];
    num += static_cast<double>(b.rows->weight[r]) * res.row_loss[r];
  }
  res.loss = num / wsum;
}

void DrafterStepCuda::Impl::backward_from_rows(const GradReady& ready) {
  cudaStream_t st = stream_of(ctx);
  Tensor d_outv = v2(d_out, NB, H);
  DF_CUDA(cudaMemsetAsync(d_outv.data, 0, d_outv.nbytes(), st));
  const int H8 = static_cast<int>(H / 8);
  move_rows_kernel<<<grid_of(ctx, R * H8), 256, 0, st>>>(static_cast<Bf16x8*>(d_outv.data),
                                                    static_cast<const Bf16x8*>(dh_rows.t().data),
                                                    static_cast<const int32_t*>(row_idx.t().data), R, H8, true);
  DF_CUDA_LAUNCH();
  backward(d_outv, ready);
}

}  // namespace dflash::cuda
