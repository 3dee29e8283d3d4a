// lm_head + softmax + CE/KL loss over chunks of rows, CPU float32 reference.
//
// The vocabulary is large (150k+) and the loss rows many (anchors x block), so full [R, V] logits would
// dominate memory: logits live for `chunk_rows` rows at a time in a caller-owned workspace, and the
// backward recomputes them (or the forward produces the gradient in the same pass when the row weights
// are known up front).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

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

// dz/dx of the transform, from z itself: m (1 - (z / c)^2), or m.
inline float transform_slope(float z, const LogitSpec& spec) {
  return spec.softcap > 0.f ? spec.multiplier * (1.f - (z / spec.softcap) * (z / spec.softcap)) : spec.multiplier;
}

// Turns the drafter's (transformed) logits row z (in place) into the gradient of w * loss at the raw logits:
//   CE: w (q - onehot(label));  KL: w (q - p)  with p from the teacher logits row t;
// plus the sparse addend extra_dz at extra_ids (n entries), then the transform's chain rule.
void logits_grad_in_place(float* x, const float* t, int64_t V, float w, int32_t label, float lse_q, float lse_p,
                          LossObjective objective, const LogitSpec& spec = LogitSpec(), const int32_t* extra_ids = nullptr,
                          const float* extra_dz = nullptr, int64_t n_extra = 0) {
  float zx[64];  // z at the extra ids, kept for their chain rule (n_extra <= 64: the selector's top-K)
  for (int64_t e = 0; e < n_extra; ++e) zx[e] = x[extra_ids[e]];
  const float z_label = x[label];
  const bool id = spec.identity();
  if (objective == LossObjective::CE) {
    for (int64_t i = 0; i < V; ++i) {
      const float z = x[i];
      x[i] = w * std::exp(z - lse_q) * (id ? 1.f : transform_slope(z, spec));
    }
    x[label] -= w * (id ? 1.f : transform_slope(z_label, spec));
  } else {
    for (int64_t i = 0; i < V; ++i) {
      const float z = x[i];
      x[i] = w * (std::exp(z - lse_q) - std::exp(t[i] - lse_p)) * (id ? 1.f : transform_slope(z, spec));
    }
  }
  for (int64_t e = 0; e < n_extra; ++e) x[extra_ids[e]] += extra_dz[e] * (id ? 1.f : transform_slope(zx[e], spec));
}

// The K largest of x [V], descending, ties by the lower id (the selector's candidates).
void top_k(const float* x, int64_t V, int64_t K, int32_t* ids, float* vals) {
  auto better = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  std::vector<int32_t> heap;  // a min-heap of the best K so far under `better`
  heap.reserve(static_cast<size_t>(K) + 1);
  for (int32_t i = 0; i < static_cast<int32_t>(V); ++i) {
    if (static_cast<int64_t>(heap.size()) < K) {
      heap.push_back(i);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(i, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = i;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  for (int64_t k = 0; k < K; ++k) {
    ids[k] = heap[static_cast<size_t>(k)];
    vals[k] = x[heap[static_cast<size_t>(k)]];
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
  const bool topk = !out.topk_ids.empty();
  DF_CHECK(topk == !out.topk_vals.empty() && topk == !out.label_logit.empty(), Internal,
           op << ": topk_ids, topk_vals and label_logit go together");
  const int64_t K = topk ? out.topk_ids.shape[1] : 0;
  if (topk) {
    detail::check_shape(op, "topk_ids", out.topk_ids, {R, -1});
    detail::check_shape(op, "topk_vals", out.topk_vals, {R, K});
    detail::check_shape(op, "label_logit", out.label_logit, {R});
    DF_CHECK(K >= 1 && K <= 64 && K <= V, Internal, op << ": top-" << K << " of " << V);
  }
  if (fused) {
    detail::check_shape(op, "dh", dh, {R, H});
    detail::check_shape(op, "row_weight", row_weight, {R});
  }
  if (ctx.device == Device::CUDA)
    return cuda::library_for("lm_loss_forward")
        .lm_loss_forward(ctx, out, h, lm_head, labels, teacher, workspace, chunk_rows, dh, row_weight, objective,
                         logit);
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
      transform_logits_in_place(x, V, logit);
      const RowSoftmax sq = row_softmax_stats(x, V);
      ce[r] = sq.lse - x[lab[r]];
      am_q[r] = sq.argmax;
      if (topk) {
        top_k(x, V, K, out.topk_ids.ptr<int32_t>() + r * K, out.topk_vals.ptr<float>() + r * K);
        out.label_logit.ptr<float>()[r] = x[lab[r]];
      }
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
      if (fused) logits_grad_in_place(x, t, V, w[r], lab[r], sq.lse, lse_p, objective, logit);
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
  DF_CHECK(extra_ids.empty() == extra_dz.empty(), Internal, op << ": extra_ids and extra_dz go together");
  const int64_t E = extra_ids.empty() ? 0 : extra_ids.shape[1];
  if (E) {
    detail::check_shape(op, "extra_ids", extra_ids, {R, E});
    detail::check_shape(op, "extra_dz", extra_dz, {R, E});
    DF_CHECK(E <= 64, Internal, op << ": " << E << " sparse entries per row (at most 64)");
  }
  if (ctx.device == Device::CUDA)
    return cuda::library_for("lm_loss_backward")
        .lm_loss_backward(ctx, dh, row_weight, objective, h, lm_head, labels, teacher, workspace, chunk_rows, logit,
                          extra_ids, extra_dz);
  for (int64_t i = 0; i < R * E; ++i)
    DF_CHECK(extra_ids.ptr<int32_t>()[i] >= 0 && extra_ids.ptr<int32_t>()[i] < V, Internal,
             op << ": extra id " << extra_ids.ptr<int32_t>()[i] << " outside [0, " << V << ")");
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
      transform_logits_in_place(x, V, logit);
      const float lse_q = row_softmax_stats(x, V).lse;
      const float lse_p = t ? row_softmax_stats(t, V).lse : 0.f;
      const int64_t r = r0 + c;
      logits_grad_in_place(x, t, V, w[r], lab[r], lse_q, lse_p, objective, logit,
                           E ? extra_ids.ptr<int32_t>() + r * E : nullptr, E ? extra_dz.ptr<float>() + r * E : nullptr, E);
    }
    matmul_backward(ctx, dh.slice_rows(r0, r1), Tensor(), logits, h.slice_rows(r0, r1), lm_head);
  }
}

void lm_loss_sparse_backward(const Ctx& ctx, const Tensor& dh, const Tensor& ids, const Tensor& z, const Tensor& dz,
                             const Tensor& lm_head, const LogitSpec& logit, const Tensor& extra) {
  const char* op = "lm_loss_sparse_backward";
  using namespace detail;
  check_tensor(op, "dh", dh, ctx, 2);
  check_tensor(op, "ids", ids, ctx, 2);
  check_tensor(op, "lm_head", lm_head, ctx, 2);
  const int64_t R = dh.shape[0], H = dh.shape[1], K = ids.shape[1], V = lm_head.shape[0];
  check_shape(op, "ids", ids, {R, K});
  check_shape(op, "z", z, {R, K});
  check_shape(op, "dz", dz, {R, K});
  check_shape(op, "lm_head", lm_head, {V, H});
  DF_CHECK(K >= 1 && K <= 64, Internal, op << ": " << K << " entries per row (1 .. 64)");
  if (!extra.empty()) check_shape(op, "extra", extra, {R, H});
  if (ctx.device == Device::CUDA)
    return cuda::library_for("lm_loss_sparse_backward")
        .lm_loss_sparse_backward(ctx, dh, ids, z, dz, lm_head, logit, extra);
  if (!extra.empty())
    for (size_t i = 0, n = dh.numel(); i < n; ++i) dh.ptr<float>()[i] += extra.ptr<float>()[i];
  const int32_t* id = ids.ptr<int32_t>();
  const float *pz = z.ptr<float>(), *pdz = dz.ptr<float>(), *W = lm_head.ptr<float>();
  float* out = dh.ptr<float>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < K; ++i) {
      const int32_t v = id[r * K + i];
      DF_CHECK(v >= 0 && v < V, Internal, op << ": id " << v << " outside [0, " << V << ")");
      const float c = pdz[r * K + i] * transform_slope(pz[r * K + i], logit);
      const float* w = W + static_cast<int64_t>(v) * H;
      for (int64_t h = 0; h < H; ++h) out[r * H + h] += c * w[h];
    }
}

}  // namespace dflash::ops
