// lm_head + softmax + CE/KL loss over chunks of rows, CPU float32 reference.
//
// The vocabulary is large (150k+) and the loss rows many (anchors x block), so full [R, V] logits would
// dominate memory: logits live for `chunk_rows` rows at a time in a caller-owned workspace, and the
// backward recomputes them (or the forward produces the gradient in the same pass when the row weights
// are known up front).
#include <algorithm>
#include <cmath>
#include <limits>

#include "dflash/drafter_ops.h"
#include "dflash/ops.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

struct RowSoftmax {
  float max;
  float lse;  // log sum exp(logits)
  int32_t argmax;
};

RowSoftmax row_softmax_stats(const float* x, int64_t V) {
  RowSoftmax r{-std::numeric_limits<float>::infinity(), 0.f, 0};
  for (int64_t i = 0; i < V; ++i)
    if (x[i] > r.max) {
      r.max = x[i];
      r.argmax = static_cast<int32_t>(i);
    }
  double sum = 0.0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(x[i] - r.max));
  r.lse = r.max + static_cast<float>(std::log(sum));
  return r;
}

void check_common(const char* op, const Ctx& ctx, const Tensor& h, const Tensor& lm_head, const Tensor& labels,
                  const Tensor& teacher, const Tensor& workspace, int64_t chunk_rows, bool need_teacher) {
  using namespace detail;
  check_tensor(op, "h", h, ctx, 2);
  check_tensor(op, "lm_head", lm_head, ctx, 2);
  check_tensor(op, "labels", labels, ctx, 1);
  const int64_t R = h.shape[0], H = h.shape[1], V = lm_head.shape[0];
  check_shape(op, "lm_head", lm_head, {V, H});
  check_shape(op, "labels", labels, {R});
  DF_CHECK(chunk_rows > 0, Internal, op << ": chunk_rows " << chunk_rows);
  DF_CHECK(!need_teacher || !teacher.empty(), Internal, op << ": the KL objective needs teacher rows");
  if (!teacher.empty()) {
    check_tensor(op, "teacher", teacher, ctx, 2);
    check_shape(op, "teacher", teacher, {R, H});
  }
  check_tensor(op, "workspace", workspace, ctx, 1);
  DF_CHECK(workspace.numel() >= lm_loss_workspace_floats(chunk_rows, V, !teacher.empty()), Internal,
           op << ": workspace of " << workspace.numel() << " floats, needs "
              << lm_loss_workspace_floats(chunk_rows, V, !teacher.empty()));
  if (ctx.device == Device::CUDA) return;  // the CUDA twin checks dtypes; labels live in device memory
  check_cpu_dtype(op, "labels", labels, DType::I32);
  const int32_t* lab = labels.ptr<int32_t>();
  for (int64_t r = 0; r < R; ++r)
    DF_CHECK(lab[r] >= 0 && lab[r] < V, BadInput, op << ": label " << lab[r] << " outside the vocabulary of " << V);
}

// Turns the drafter logits row x (in place) into the gradient of w * loss:
//   CE: w (q - onehot(label));  KL: w (q - p)  with p from the teacher logits row t.
void logits_grad_in_place(float* x, const float* t, int64_t V, float w, int32_t label, float lse_q, float lse_p,
                          LossObjective objective) {
  if (objective == LossObjective::CE) {
    for (int64_t i = 0; i < V; ++i) x[i] = w * std::exp(x[i] - lse_q);
    x[label] -= w;
  } else {
    for (int64_t i = 0; i < V; ++i) x[i] = w * (std::exp(x[i] - lse_q) - std::exp(t[i] - lse_p));
  }
}

}  // namespace

void lm_loss_forward(const Ctx& ctx, const LmLossRowsOut& out, const Tensor& h, const Tensor& lm_head,
                     const Tensor& labels, const Tensor& teacher, const Tensor& workspace, int64_t chunk_rows,
                     const Tensor& dh, const Tensor& row_weight, LossObjective objective, const LogitSpec& logit) {
  const char* op = "lm_loss_forward";
  const bool fused = !dh.empty();
  check_common(op, ctx, h, lm_head, labels, teacher, workspace, chunk_rows,
               (fused && objective == LossObjective::KL) || !out.kl.empty() || !out.argmax_p.empty());
  const int64_t R = h.shape[0], H = h.shape[1], V = lm_head.shape[0];
  detail::check_shape(op, "ce", out.ce, {R});
  detail::check_shape(op, "argmax_q", out.argmax_q, {R});
  if (!out.kl.empty()) detail::check_shape(op, "kl", out.kl, {R});
  if (!out.argmax_p.empty()) detail::check_shape(op, "argmax_p", out.argmax_p, {R});
  if (fused) {
    detail::check_shape(op, "dh", dh, {R, H});
    detail::check_shape(op, "row_weight", row_weight, {R});
  }
  if (ctx.device == Device::CUDA) return cuda::lm_loss_forward(ctx, out, h, lm_head, labels, teacher, workspace,
                                                               chunk_rows, dh, row_weight, objective, logit);
  const bool with_teacher = !teacher.empty();
  float* ws = workspace.ptr<float>();
  float* ws_t = with_teacher ? ws + static_cast<size_t>(chunk_rows) * V : nullptr;
  const int32_t* lab = labels.ptr<int32_t>();
  float* ce = out.ce.ptr<float>();
  float* kl = out.kl.empty() ? nullptr : out.kl.ptr<float>();
  int32_t* am_q = out.argmax_q.ptr<int32_t>();
  int32_t* am_p = out.argmax_p.empty() ? nullptr : out.argmax_p.ptr<int32_t>();
  const float* w = fused ? row_weight.ptr<float>() : nullptr;
  for (int64_t r0 = 0; r0 < R; r0 += chunk_rows) {
    const int64_t r1 = std::min(R, r0 + chunk_rows), C = r1 - r0;
    Tensor logits = cpu_view(ws, {C, V});
    matmul_forward(ctx, logits, h.slice_rows(r0, r1), lm_head);
    if (with_teacher) matmul_forward(ctx, cpu_view(ws_t, {C, V}), teacher.slice_rows(r0, r1), lm_head);
    for (int64_t c = 0; c < C; ++c) {
      const int64_t r = r0 + c;
      float* x = ws + static_cast<size_t>(c) * V;
      const RowSoftmax sq = row_softmax_stats(x, V);
      ce[r] = sq.lse - x[lab[r]];
      am_q[r] = sq.argmax;
      float lse_p = 0.f;
      const float* t = with_teacher ? ws_t + static_cast<size_t>(c) * V : nullptr;
      if (t) {
        const RowSoftmax sp = row_softmax_stats(t, V);
        lse_p = sp.lse;
        if (am_p) am_p[r] = sp.argmax;
        if (kl) {
          double acc = 0.0;  // sum_i p_i (log p_i - log q_i)
          for (int64_t i = 0; i < V; ++i) {
            const double logp = static_cast<double>(t[i]) - sp.lse;
            acc += std::exp(logp) * (logp - (static_cast<double>(x[i]) - sq.lse));
          }
          kl[r] = static_cast<float>(acc);
        }
      }
      if (fused) logits_grad_in_place(x, t, V, w[r], lab[r], sq.lse, lse_p, objective);
    }
    if (fused) matmul_backward(ctx, dh.slice_rows(r0, r1), Tensor(), logits, h.slice_rows(r0, r1), lm_head);
  }
}

void lm_loss_backward(const Ctx& ctx, const Tensor& dh, const Tensor& row_weight, LossObjective objective,
                      const Tensor& h, const Tensor& lm_head, const Tensor& labels, const Tensor& teacher,
                      const Tensor& workspace, int64_t chunk_rows, const LogitSpec& logit, const Tensor& extra_ids,
                      const Tensor& extra_dz) {
  const char* op = "lm_loss_backward";
  check_common(op, ctx, h, lm_head, labels, teacher, workspace, chunk_rows, objective == LossObjective::KL);
  const int64_t R = h.shape[0], H = h.shape[1], V = lm_head.shape[0];
  detail::check_shape(op, "dh", dh, {R, H});
  detail::check_shape(op, "row_weight", row_weight, {R});
  if (ctx.device == Device::CUDA) return cuda::lm_loss_backward(ctx, dh, row_weight, objective, h, lm_head, labels,
                                                                teacher, workspace, chunk_rows, logit, extra_ids, extra_dz);
  const bool use_teacher = objective == LossObjective::KL;
  float* ws = workspace.ptr<float>();
  float* ws_t = use_teacher ? ws + static_cast<size_t>(chunk_rows) * V : nullptr;
  const int32_t* lab = labels.ptr<int32_t>();
  const float* w = row_weight.ptr<float>();
  for (int64_t r0 = 0; r0 < R; r0 += chunk_rows) {
    const int64_t r1 = std::min(R, r0 + chunk_rows), C = r1 - r0;
    Tensor logits = cpu_view(ws, {C, V});
    matmul_forward(ctx, logits, h.slice_rows(r0, r1), lm_head);
    if (use_teacher) matmul_forward(ctx, cpu_view(ws_t, {C, V}), teacher.slice_rows(r0, r1), lm_head);
    for (int64_t c = 0; c < C; ++c) {
      float* x = ws + static_cast<size_t>(c) * V;
      const float* t = use_teacher ? ws_t + static_cast<size_t>(c) * V : nullptr;
      const float lse_q = row_softmax_stats(x, V).lse;
      const float lse_p = t ? row_softmax_stats(t, V).lse : 0.f;
      logits_grad_in_place(x, t, V, w[r0 + c], lab[r0 + c], lse_q, lse_p, objective);
    }
    matmul_backward(ctx, dh.slice_rows(r0, r1), Tensor(), logits, h.slice_rows(r0, r1), lm_head);
  }
}

}  // namespace dflash::ops
