// DFlash2's candidate selector, CPU float32 reference (docs/dflash2.md 2.4 and 3; contracts in
// include/dflash/drafter_ops.h). A row's candidates are the unary top-K of its transformed logits; the
// selector scores candidate i given the predecessor p as unary_i + < P[p] * u, S[cand_i] > (u = W_h h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "dflash/drafter_ops.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

using detail::check_cpu_dtype;
using detail::check_shape;
using detail::check_tensor;

// scores[i] = unary[i] + sum_q ctx[q] S[cand[i], q]  with ctx = P[pred] * u  (r = rank)
void row_scores(float* scores, const float* unary, const int32_t* cand, const float* ctx, const float* S, int64_t K,
                int64_t r) {
  for (int64_t i = 0; i < K; ++i) {
    const float* s = S + static_cast<int64_t>(cand[i]) * r;
    double acc = unary[i];
    for (int64_t q = 0; q < r; ++q) acc += static_cast<double>(ctx[q]) * s[q];
    scores[i] = static_cast<float>(acc);
  }
}

double log_sum_exp(const float* x, int64_t K) {
  const float m = *std::max_element(x, x + K);
  double s = 0;
  for (int64_t i = 0; i < K; ++i) s += std::exp(static_cast<double>(x[i]) - m);
  return m + std::log(s);
}

int32_t first_argmax(const float* x, int64_t K) {
  return static_cast<int32_t>(std::max_element(x, x + K) - x);  // the first of equal maxima: the lower slot
}

void check_ids(const char* op, const char* arg, const Tensor& ids, int64_t V) {
  const int32_t* p = ids.ptr<int32_t>();
  for (size_t i = 0; i < ids.numel(); ++i)
    DF_CHECK(p[i] >= 0 && p[i] < V, Internal, op << ": " << arg << " id " << p[i] << " outside [0, " << V << ")");
}

}  // namespace

void selector_candidates(const Ctx& ctx, const Tensor& cand, const Tensor& unary, const Tensor& gold,
                         const Tensor& covered, const Tensor& topk_ids, const Tensor& topk_vals, const Tensor& labels,
                         const Tensor& label_logit, SelectorCandidates mode) {
  constexpr const char* op = "selector_candidates";
  check_tensor(op, "topk_ids", topk_ids, ctx, 2);
  const int64_t R = topk_ids.shape[0], K = topk_ids.shape[1];
  for (const auto& [name, t, shape] :
       {std::tuple<const char*, const Tensor*, std::vector<int64_t>>{"cand", &cand, {R, K}}, {"unary", &unary, {R, K}},
        {"topk_vals", &topk_vals, {R, K}}, {"gold", &gold, {R}}, {"covered", &covered, {R}}, {"labels", &labels, {R}},
        {"label_logit", &label_logit, {R}}}) {
    check_tensor(op, name, *t, ctx, static_cast<int>(shape.size()));
    DF_CHECK(t->shape[0] == shape[0] && (shape.size() == 1 || t->shape[1] == shape[1]), Internal,
             op << ": argument '" << name << "' has shape " << t->shape_str());
  }
  if (ctx.device == Device::CUDA)
    return cuda::library_for("selector_candidates")
        .selector_candidates(ctx, cand, unary, gold, covered, topk_ids, topk_vals, labels, label_logit, mode);
  const int32_t *ids = topk_ids.ptr<int32_t>(), *lab = labels.ptr<int32_t>();
  const float *vals = topk_vals.ptr<float>(), *lab_logit = label_logit.ptr<float>();
  int32_t *c = cand.ptr<int32_t>(), *gd = gold.ptr<int32_t>();
  float* un = unary.ptr<float>();
  uint8_t* cov = covered.ptr<uint8_t>();
  for (int64_t r = 0; r < R; ++r) {
    const int32_t* row = ids + r * K;
    const int64_t at = std::find(row, row + K, lab[r]) - row;
    std::copy(row, row + K, c + r * K);
    std::copy(vals + r * K, vals + (r + 1) * K, un + r * K);
    cov[r] = at < K;
    if (at < K) {
      gd[r] = static_cast<int32_t>(at);
    } else if (mode == SelectorCandidates::Strict) {  // no selector term (SpecForge's strict top-K)
      gd[r] = -1;
    } else {  // the gold replaces the weakest candidate (speculators' selector_training_candidates)
      c[r * K + K - 1] = lab[r];
      un[r * K + K - 1] = lab_logit[r];
      gd[r] = static_cast<int32_t>(K - 1);
    }
  }
}

void selector_forward(const Ctx& ctx, const Tensor& scores, const Tensor& ce, const Tensor& argmax, const Tensor& u,
                      const Tensor& unary, const Tensor& cand, const Tensor& pred, const Tensor& gold, const Tensor& P,
                      const Tensor& S) {
  constexpr const char* op = "selector_forward";
  check_tensor(op, "cand", cand, ctx, 2);
  check_tensor(op, "P", P, ctx, 2);
  const int64_t R = cand.shape[0], K = cand.shape[1], V = P.shape[0], r = P.shape[1];
  check_tensor(op, "scores", scores, ctx, 2);
  check_shape(op, "scores", scores, {R, K});
  check_shape(op, "unary", unary, {R, K});
  check_shape(op, "u", u, {R, r});
  check_shape(op, "S", S, {V, r});
  check_shape(op, "pred", pred, {R});
  check_shape(op, "argmax", argmax, {R});
  DF_CHECK(ce.empty() == gold.empty(), Internal, op << ": ce and gold go together");
  if (!ce.empty()) {
    check_shape(op, "ce", ce, {R});
    check_shape(op, "gold", gold, {R});
  }
  if (ctx.device == Device::CUDA)
    return cuda::library_for("selector_forward")
        .selector_forward(ctx, scores, ce, argmax, u, unary, cand, pred, gold, P, S);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"u", &u}, {"unary", &unary}, {"P", &P}, {"S", &S}})
    check_cpu_dtype(op, name, *t, DType::F32);
  check_ids(op, "cand", cand, V);
  check_ids(op, "pred", pred, V);
  const float *pu = u.ptr<float>(), *pun = unary.ptr<float>(), *pP = P.ptr<float>(), *pS = S.ptr<float>();
  const int32_t *pc = cand.ptr<int32_t>(), *pp = pred.ptr<int32_t>();
  const int32_t* pg = gold.empty() ? nullptr : gold.ptr<int32_t>();
  float* ps = scores.ptr<float>();
  float* pce = ce.empty() ? nullptr : ce.ptr<float>();
  int32_t* pam = argmax.ptr<int32_t>();
  std::vector<float> c(static_cast<size_t>(r));
  for (int64_t i = 0; i < R; ++i) {
    const float* prow = pP + static_cast<int64_t>(pp[i]) * r;
    for (int64_t q = 0; q < r; ++q) c[q] = prow[q] * pu[i * r + q];
    float* s = ps + i * K;
    row_scores(s, pun + i * K, pc + i * K, c.data(), pS, K, r);
    pam[i] = first_argmax(s, K);
    if (pce) pce[i] = pg[i] < 0 ? 0.f : static_cast<float>(log_sum_exp(s, K) - s[pg[i]]);
  }
}

void selector_backward(const Ctx& ctx, const Tensor& d_unary, const Tensor& du, const Tensor& dP, const Tensor& dS,
                       const Tensor& scores, const Tensor& row_weight, const Tensor& u, const Tensor& cand,
                       const Tensor& pred, const Tensor& gold, const Tensor& P, const Tensor& S) {
  constexpr const char* op = "selector_backward";
  check_tensor(op, "cand", cand, ctx, 2);
  check_tensor(op, "P", P, ctx, 2);
  const int64_t R = cand.shape[0], K = cand.shape[1], V = P.shape[0], r = P.shape[1];
  check_shape(op, "scores", scores, {R, K});
  if (!d_unary.empty()) check_shape(op, "d_unary", d_unary, {R, K});
  check_shape(op, "du", du, {R, r});
  check_shape(op, "u", u, {R, r});
  check_shape(op, "dP", dP, {V, r});
  check_shape(op, "dS", dS, {V, r});
  check_shape(op, "S", S, {V, r});
  check_shape(op, "row_weight", row_weight, {R});
  check_shape(op, "pred", pred, {R});
  check_shape(op, "gold", gold, {R});
  if (ctx.device == Device::CUDA)
    return cuda::library_for("selector_backward")
        .selector_backward(ctx, d_unary, du, dP, dS, scores, row_weight, u, cand, pred, gold, P, S);
  const float *ps = scores.ptr<float>(), *pw = row_weight.ptr<float>(), *pu = u.ptr<float>(), *pP = P.ptr<float>(),
              *pS = S.ptr<float>();
  const int32_t *pc = cand.ptr<int32_t>(), *pp = pred.ptr<int32_t>(), *pg = gold.ptr<int32_t>();
  float *pdu = du.ptr<float>(), *pdP = dP.ptr<float>(), *pdS = dS.ptr<float>();
  float* pdun = d_unary.empty() ? nullptr : d_unary.ptr<float>();
  std::vector<float> g(static_cast<size_t>(K)), e(static_cast<size_t>(r));
  for (int64_t i = 0; i < R; ++i) {
    const float* s = ps + i * K;
    const double lse = log_sum_exp(s, K);
    const float wi = pg[i] < 0 ? 0.f : pw[i];  // gold -1: no selector term (selector_candidates, Strict)
    for (int64_t j = 0; j < K; ++j)
      g[j] = wi * static_cast<float>(std::exp(static_cast<double>(s[j]) - lse) - (j == pg[i] ? 1.0 : 0.0));
    if (pdun) std::copy(g.begin(), g.end(), pdun + i * K);
    // e = sum_j g_j S[cand_j]
    std::fill(e.begin(), e.end(), 0.f);
    const int32_t* c = pc + i * K;
    for (int64_t j = 0; j < K; ++j) {
      const float* srow = pS + static_cast<int64_t>(c[j]) * r;
      for (int64_t q = 0; q < r; ++q) e[q] += g[j] * srow[q];
    }
    const float* prow = pP + static_cast<int64_t>(pp[i]) * r;
    const float* ui = pu + i * r;
    float* dprow = pdP + static_cast<int64_t>(pp[i]) * r;
    for (int64_t q = 0; q < r; ++q) {
      pdu[i * r + q] = prow[q] * e[q];
      dprow[q] += ui[q] * e[q];
    }
    for (int64_t j = 0; j < K; ++j) {
      float* dsrow = pdS + static_cast<int64_t>(c[j]) * r;
      for (int64_t q = 0; q < r; ++q) dsrow[q] += g[j] * prow[q] * ui[q];
    }
  }
}

void selector_walk(const Ctx& ctx, const Tensor& path, const Tensor& q, const Tensor& cand, const Tensor& unary,
                   const Tensor& u, const Tensor& anchor, const Tensor& P, const Tensor& S, float temperature,
                   const std::function<double()>& uniform) {
  constexpr const char* op = "selector_walk";
  DF_CHECK(ctx.device == Device::CPU, Internal, op << " runs on the CPU only (a block at a time, at inference)");
  check_tensor(op, "cand", cand, ctx, 3);
  check_tensor(op, "P", P, ctx, 2);
  const int64_t N = cand.shape[0], n = cand.shape[1], K = cand.shape[2], V = P.shape[0], r = P.shape[1];
  check_shape(op, "path", path, {N, n});
  check_shape(op, "unary", unary, {N, n, K});
  check_shape(op, "u", u, {N, n, r});
  check_shape(op, "anchor", anchor, {N});
  check_shape(op, "S", S, {V, r});
  DF_CHECK(temperature >= 0.f && std::isfinite(temperature), Internal, op << ": temperature " << temperature);
  DF_CHECK(temperature == 0.f || (uniform && !q.empty()), Internal, op << ": sampling needs q and a uniform source");
  if (!q.empty()) check_shape(op, "q", q, {N, n, K});
  check_ids(op, "cand", cand, V);
  check_ids(op, "anchor", anchor, V);
  const float *pun = unary.ptr<float>(), *pu = u.ptr<float>(), *pP = P.ptr<float>(), *pS = S.ptr<float>();
  const int32_t *pc = cand.ptr<int32_t>(), *pa = anchor.ptr<int32_t>();
  int32_t* out = path.ptr<int32_t>();
  float* pq = q.empty() ? nullptr : q.ptr<float>();
  std::vector<float> c(static_cast<size_t>(r)), s(static_cast<size_t>(K));
  for (int64_t b = 0; b < N; ++b) {
    int32_t prev = pa[b];
    for (int64_t k = 0; k < n; ++k) {
      const int64_t row = b * n + k;
      const float* prow = pP + static_cast<int64_t>(prev) * r;
      for (int64_t x = 0; x < r; ++x) c[x] = prow[x] * pu[row * r + x];
      row_scores(s.data(), pun + row * K, pc + row * K, c.data(), pS, K, r);
      int64_t pick = first_argmax(s.data(), K);
      if (temperature > 0.f) {  // q = softmax(s / T), one draw by the inverse CDF in slot order
        std::vector<double> p(static_cast<size_t>(K));
        const float m = s[pick];
        double z = 0;
        for (int64_t i = 0; i < K; ++i) z += p[i] = std::exp((static_cast<double>(s[i]) - m) / temperature);
        for (int64_t i = 0; i < K; ++i) pq[row * K + i] = static_cast<float>(p[i] / z);
        const double x = uniform() * z;
        double acc = 0;
        pick = K - 1;
        for (int64_t i = 0; i < K; ++i)
          if ((acc += p[i]) > x) {
            pick = i;
            break;
          }
      } else if (pq) {
        for (int64_t i = 0; i < K; ++i) pq[row * K + i] = i == pick ? 1.f : 0.f;
      }
      prev = pc[row * K + pick];
      out[row] = prev;
    }
  }
}

}  // namespace dflash::ops
