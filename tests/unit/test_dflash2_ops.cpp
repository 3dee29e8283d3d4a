// DFlash2's CPU reference ops (src/ops/grouped_conv.cpp, src/ops/selector.cpp, lm_loss's LogitSpec) against
// the golden cases' op.* tensors (tests/data/golden/dflash2-tiny-{a,b}: the official GroupedDynamicCausalConv
// and a PyTorch selector objective, float64 autograd), the official serving walk (serve.*), a block-boundary
// property and a finite-difference check of lm_loss's softcap chain rule with the sparse addend.
// Tolerances: relative L2 error 1e-5 for forward values, 1e-4 for gradients (float32 against float64).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/drafter_ops.h"
#include "dflash/ops.h"
#include "dflash/safetensors.h"
#include "test_support.h"

namespace dflash {
namespace {

const std::string kGolden = std::string(DFLASH_TEST_DATA) + "/golden/";

double rel_err(const std::vector<float>& x, const std::vector<float>& ref) {
  EXPECT_EQ(x.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size() && i < x.size(); ++i) {
    num += (static_cast<double>(x[i]) - ref[i]) * (static_cast<double>(x[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

int64_t dim(SafetensorsFile& f, const std::string& name, int i) { return f.get(name).shape.at(static_cast<size_t>(i)); }

class DFlash2Ops : public ::testing::TestWithParam<std::string> {};

// The case's training candidates: case.json "selector_candidates" (cases made before issue 47 have none:
// they inserted the gold).
SelectorCandidates case_candidates(const std::string& name) {
  std::ifstream f(kGolden + name + "/case.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  return j.value("selector_candidates", std::string("insert")) == "strict" ? SelectorCandidates::Strict
                                                                           : SelectorCandidates::Insert;
}

// One GroupedDynamicCausalConv: dyn = x Wp^T; y = prepare(x); z = finish(u) with the same dyn; the gradients
// of <y, gy> + <z, gz> (dx through both the conv and the kernel projection).
TEST_P(DFlash2Ops, GroupedConvMatchesTheOfficialModule) {
  SafetensorsFile g(kGolden + GetParam() + "/golden.safetensors");
  const int64_t nb = dim(g, "op.conv.x", 0), B = dim(g, "op.conv.x", 1), H = dim(g, "op.conv.x", 2);
  const int64_t k = dim(g, "op.conv.base_kernel", 1), G = dim(g, "op.conv.dyn", 4), R = nb * B, D = 2 * k * G;
  const ops::GroupedConvSpec spec{static_cast<int>(B), static_cast<int>(k), static_cast<int>(H / G)};
  std::vector<float> x = test::read_f32(g, "op.conv.x"), u = test::read_f32(g, "op.conv.u");
  std::vector<float> base = test::read_f32(g, "op.conv.base_kernel"), Wp = test::read_f32(g, "op.conv.kernel_projection");
  std::vector<float> gy = test::read_f32(g, "op.conv.gy"), gz = test::read_f32(g, "op.conv.gz");
  const Ctx ctx = cpu_ctx();
  std::vector<float> dyn(static_cast<size_t>(R * D)), y(x.size()), z(x.size());
  ops::matmul_forward(ctx, cpu_view(dyn.data(), {R, D}), cpu_view(x.data(), {R, H}), cpu_view(Wp.data(), {D, H}));
  EXPECT_LT(rel_err(dyn, test::read_f32(g, "op.conv.dyn")), 1e-5);
  const Tensor base0 = cpu_view(base.data(), {k, H}), base1 = cpu_view(base.data() + k * H, {k, H});
  ops::grouped_conv_forward(ctx, cpu_view(y.data(), {R, H}), cpu_view(x.data(), {R, H}), cpu_view(dyn.data(), {R, D}), 0,
                            base0, spec);
  ops::grouped_conv_forward(ctx, cpu_view(z.data(), {R, H}), cpu_view(u.data(), {R, H}), cpu_view(dyn.data(), {R, D}), 1,
                            base1, spec);
  EXPECT_LT(rel_err(y, test::read_f32(g, "op.conv.y")), 1e-5);
  EXPECT_LT(rel_err(z, test::read_f32(g, "op.conv.z")), 1e-5);

  std::vector<float> du(x.size()), dxc(x.size()), dxp(x.size()), d_dyn(dyn.size()), dbase(base.size(), 0.f),
      dWp(Wp.size(), 0.f);
  ops::grouped_conv_backward(ctx, cpu_view(du.data(), {R, H}), cpu_view(d_dyn.data(), {R, D}),
                             cpu_view(dbase.data() + k * H, {k, H}), cpu_view(gz.data(), {R, H}),
                             cpu_view(u.data(), {R, H}), cpu_view(dyn.data(), {R, D}), 1, base1, spec);
  ops::grouped_conv_backward(ctx, cpu_view(dxc.data(), {R, H}), cpu_view(d_dyn.data(), {R, D}),
                             cpu_view(dbase.data(), {k, H}), cpu_view(gy.data(), {R, H}), cpu_view(x.data(), {R, H}),
                             cpu_view(dyn.data(), {R, D}), 0, base0, spec);
  ops::matmul_backward(ctx, cpu_view(dxp.data(), {R, H}), cpu_view(dWp.data(), {D, H}), cpu_view(d_dyn.data(), {R, D}),
                       cpu_view(x.data(), {R, H}), cpu_view(Wp.data(), {D, H}));
  for (size_t i = 0; i < dxc.size(); ++i) dxc[i] += dxp[i];
  EXPECT_LT(rel_err(dxc, test::read_f32(g, "op.conv.dx")), 1e-4);
  EXPECT_LT(rel_err(du, test::read_f32(g, "op.conv.du")), 1e-4);
  EXPECT_LT(rel_err(dbase, test::read_f32(g, "op.conv.dbase_kernel")), 1e-4);
  EXPECT_LT(rel_err(dWp, test::read_f32(g, "op.conv.dkernel_projection")), 1e-4);
}

// The unary top-K of z rows (descending, ties by lower id), as lm_loss_forward computes it.
void top_k_rows(const std::vector<float>& z, int64_t R, int64_t V, int64_t K, std::vector<int32_t>& ids,
                std::vector<float>& vals) {
  ids.resize(static_cast<size_t>(R * K));
  vals.resize(ids.size());
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int64_t r = 0; r < R; ++r) {
    const float* x = z.data() + r * V;
    for (int32_t i = 0; i < V; ++i) order[static_cast<size_t>(i)] = i;
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (int64_t i = 0; i < K; ++i) {
      ids[static_cast<size_t>(r * K + i)] = order[static_cast<size_t>(i)];
      vals[static_cast<size_t>(r * K + i)] = x[order[static_cast<size_t>(i)]];
    }
  }
}

// The selector objective on random rows: candidates (gold inserted), scores, CE, and d(sum w ce) by every input.
TEST_P(DFlash2Ops, SelectorObjectiveMatchesPyTorch) {
  SafetensorsFile g(kGolden + GetParam() + "/golden.safetensors");
  const int64_t R = dim(g, "op.sel.z", 0), V = dim(g, "op.sel.z", 1), K = dim(g, "op.sel.cand", 1);
  const int64_t H = dim(g, "op.sel.h", 1), r = dim(g, "op.sel.P", 1);
  std::vector<float> z = test::read_f32(g, "op.sel.z"), h = test::read_f32(g, "op.sel.h"), w = test::read_f32(g, "op.sel.w");
  std::vector<float> P = test::read_f32(g, "op.sel.P"), S = test::read_f32(g, "op.sel.S"), Wh = test::read_f32(g, "op.sel.Wh");
  std::vector<int32_t> label = test::read_i32(g, "op.sel.label"), pred = test::read_i32(g, "op.sel.pred");
  std::vector<int32_t> ids;
  std::vector<float> vals, label_logit(static_cast<size_t>(R));
  top_k_rows(z, R, V, K, ids, vals);
  for (int64_t i = 0; i < R; ++i) label_logit[static_cast<size_t>(i)] = z[static_cast<size_t>(i * V + label[i])];
  const Ctx ctx = cpu_ctx();
  std::vector<int32_t> cand(ids.size()), gold(static_cast<size_t>(R)), argmax(static_cast<size_t>(R));
  std::vector<uint8_t> covered(static_cast<size_t>(R));
  std::vector<float> unary(vals.size());
  ops::selector_candidates(ctx, cpu_view(cand.data(), {R, K}), cpu_view(unary.data(), {R, K}), cpu_view(gold.data(), {R}),
                           Tensor(covered.data(), DType::U8, Device::CPU, {R}), cpu_view(ids.data(), {R, K}),
                           cpu_view(vals.data(), {R, K}), cpu_view(label.data(), {R}), cpu_view(label_logit.data(), {R}),
                           case_candidates(GetParam()));
  EXPECT_EQ(cand, test::read_i32(g, "op.sel.cand"));
  EXPECT_EQ(gold, test::read_i32(g, "op.sel.gold_index"));
  const TensorInfo& cov = g.get("op.sel.covered");
  EXPECT_EQ(covered, std::vector<uint8_t>(static_cast<const uint8_t*>(cov.data), static_cast<const uint8_t*>(cov.data) + R));
  EXPECT_GT(std::count(covered.begin(), covered.end(), 1), 0) << "the case should have covered rows";
  EXPECT_LT(std::count(covered.begin(), covered.end(), 1), R) << "and rows whose gold is not in the top-K";

  std::vector<float> u(static_cast<size_t>(R * r)), scores(cand.size()), ce(static_cast<size_t>(R));
  ops::matmul_forward(ctx, cpu_view(u.data(), {R, r}), cpu_view(h.data(), {R, H}), cpu_view(Wh.data(), {r, H}));
  ops::selector_forward(ctx, cpu_view(scores.data(), {R, K}), cpu_view(ce.data(), {R}), cpu_view(argmax.data(), {R}),
                        cpu_view(u.data(), {R, r}), cpu_view(unary.data(), {R, K}), cpu_view(cand.data(), {R, K}),
                        cpu_view(pred.data(), {R}), cpu_view(gold.data(), {R}), cpu_view(P.data(), {V, r}),
                        cpu_view(S.data(), {V, r}));
  EXPECT_LT(rel_err(scores, test::read_f32(g, "op.sel.scores")), 1e-5);
  EXPECT_LT(rel_err(ce, test::read_f32(g, "op.sel.ce")), 1e-5);
  for (int64_t i = 0; i < R; ++i)
    EXPECT_EQ(scores[static_cast<size_t>(i * K + argmax[i])],
              *std::max_element(scores.begin() + i * K, scores.begin() + (i + 1) * K));

  std::vector<float> d_unary(cand.size()), du(u.size()), dP(P.size(), 0.f), dS(S.size(), 0.f), dWh(Wh.size(), 0.f),
      dh(h.size()), dz(z.size(), 0.f);
  ops::selector_backward(ctx, cpu_view(d_unary.data(), {R, K}), cpu_view(du.data(), {R, r}), cpu_view(dP.data(), {V, r}),
                         cpu_view(dS.data(), {V, r}), cpu_view(scores.data(), {R, K}), cpu_view(w.data(), {R}),
                         cpu_view(u.data(), {R, r}), cpu_view(cand.data(), {R, K}), cpu_view(pred.data(), {R}),
                         cpu_view(gold.data(), {R}), cpu_view(P.data(), {V, r}), cpu_view(S.data(), {V, r}));
  ops::matmul_backward(ctx, cpu_view(dh.data(), {R, H}), cpu_view(dWh.data(), {r, H}), cpu_view(du.data(), {R, r}),
                       cpu_view(h.data(), {R, H}), cpu_view(Wh.data(), {r, H}));
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < K; ++j) dz[static_cast<size_t>(i * V + cand[i * K + j])] += d_unary[i * K + j];
  EXPECT_LT(rel_err(dz, test::read_f32(g, "op.sel.dz")), 1e-4);
  EXPECT_LT(rel_err(dh, test::read_f32(g, "op.sel.dh")), 1e-4);
  EXPECT_LT(rel_err(dP, test::read_f32(g, "op.sel.dP")), 1e-4);
  EXPECT_LT(rel_err(dS, test::read_f32(g, "op.sel.dS")), 1e-4);
  EXPECT_LT(rel_err(dWh, test::read_f32(g, "op.sel.dWh")), 1e-4);
}

// The official propose(): the greedy walk from the anchor over rows 1..B-1 gives serve.path exactly; at
// temperature T its q over the official candidates, given the golden sampled path, is serve.sample_q.
TEST_P(DFlash2Ops, ServingWalkMatchesTheOfficialPropose) {
  const std::string dir = kGolden + GetParam();
  SafetensorsFile g(dir + "/golden.safetensors");
  SafetensorsFile d(dir + "/drafter_init/model.safetensors");
  const int64_t N = dim(g, "fwd.logits", 0), B = dim(g, "fwd.logits", 1), V = dim(g, "fwd.logits", 2);
  const int64_t H = dim(g, "fwd.hidden", 2), K = dim(g, "serve.sample_cand", 2);
  const int64_t r = dim(d, "candidate_selector.predecessor_codebook", 1), n = B - 1;
  std::vector<float> logits = test::read_f32(g, "fwd.logits"), hidden = test::read_f32(g, "fwd.hidden");
  std::vector<float> P = test::read_f32(d, "candidate_selector.predecessor_codebook");
  std::vector<float> S = test::read_f32(d, "candidate_selector.successor_codebook");
  std::vector<float> Wh = test::read_f32(d, "candidate_selector.hidden_projection.weight");
  std::vector<int32_t> label = test::read_i32(g, "rows.label");
  // rows 1..B-1 of every block: their logits, hidden and u = h Wh^T
  std::vector<float> z, hs;
  for (int64_t b = 0; b < N; ++b) {
    z.insert(z.end(), logits.begin() + (b * B + 1) * V, logits.begin() + (b + 1) * B * V);
    hs.insert(hs.end(), hidden.begin() + (b * B + 1) * H, hidden.begin() + (b + 1) * B * H);
  }
  const Ctx ctx = cpu_ctx();
  std::vector<float> u(static_cast<size_t>(N * n * r));
  ops::matmul_forward(ctx, cpu_view(u.data(), {N * n, r}), cpu_view(hs.data(), {N * n, H}), cpu_view(Wh.data(), {r, H}));
  std::vector<int32_t> ids, anchor(static_cast<size_t>(N)), path(static_cast<size_t>(N * n));
  std::vector<float> vals;
  top_k_rows(z, N * n, V, K, ids, vals);
  for (int64_t b = 0; b < N; ++b) anchor[static_cast<size_t>(b)] = label[static_cast<size_t>(b * B)];
  ops::selector_walk(ctx, cpu_view(path.data(), {N, n}), Tensor(), cpu_view(ids.data(), {N, n, K}),
                     cpu_view(vals.data(), {N, n, K}), cpu_view(u.data(), {N, n, r}), cpu_view(anchor.data(), {N}),
                     cpu_view(P.data(), {V, r}), cpu_view(S.data(), {V, r}), 0.0f);
  EXPECT_EQ(path, test::read_i32(g, "serve.path"));

  // q at T given the sampled path: the scores of each row with the previous golden draw as predecessor.
  std::vector<int32_t> scand = test::read_i32(g, "serve.sample_cand"), spath = test::read_i32(g, "serve.sample_path");
  const std::vector<float> sq_ref = test::read_f32(g, "serve.sample_q");
  std::vector<float> sunary(scand.size()), scores(scand.size());
  std::vector<int32_t> pred(static_cast<size_t>(N * n)), am(static_cast<size_t>(N * n));
  for (int64_t row = 0; row < N * n; ++row) {
    for (int64_t i = 0; i < K; ++i) sunary[row * K + i] = z[row * V + scand[row * K + i]];
    pred[row] = row % n == 0 ? anchor[row / n] : spath[row - 1];
  }
  ops::selector_forward(ctx, cpu_view(scores.data(), {N * n, K}), Tensor(), cpu_view(am.data(), {N * n}),
                        cpu_view(u.data(), {N * n, r}), cpu_view(sunary.data(), {N * n, K}), cpu_view(scand.data(), {N * n, K}),
                        cpu_view(pred.data(), {N * n}), Tensor(), cpu_view(P.data(), {V, r}), cpu_view(S.data(), {V, r}));
  std::ifstream cf(dir + "/case.json");
  const double temp = nlohmann::json::parse(cf).at("sample_temperature").get<double>();
  std::vector<float> sq(scores.size());
  for (int64_t row = 0; row < N * n; ++row) {
    const float* s = scores.data() + row * K;
    const float m = *std::max_element(s, s + K);
    double zsum = 0;
    for (int64_t i = 0; i < K; ++i) zsum += std::exp((s[i] - m) / temp);
    for (int64_t i = 0; i < K; ++i) sq[row * K + i] = static_cast<float>(std::exp((s[i] - m) / temp) / zsum);
  }
  EXPECT_LT(rel_err(sq, sq_ref), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Golden, DFlash2Ops, ::testing::Values("dflash2-tiny-a", "dflash2-tiny-b", "dflash2-tiny-strict"));

std::vector<float> random_vec(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// No tap crosses a block: changing the rows of block 0 leaves every output row of block 1 unchanged, and the
// first row of a block sees only itself (base tap 0 + its dynamic kernel).
TEST(DFlash2OpsProperty, GroupedConvTapsStayInTheirBlock) {
  std::mt19937 rng(3);
  const int64_t B = 4, R = 2 * B, H = 8, k = 3, gs = 4, G = H / gs, D = 2 * k * G;
  const ops::GroupedConvSpec spec{static_cast<int>(B), static_cast<int>(k), static_cast<int>(gs)};
  std::vector<float> in = random_vec(R * H, rng), dyn = random_vec(R * D, rng), base = random_vec(k * H, rng);
  std::vector<float> a(R * H), b(R * H);
  const Ctx ctx = cpu_ctx();
  ops::grouped_conv_forward(ctx, cpu_view(a.data(), {R, H}), cpu_view(in.data(), {R, H}), cpu_view(dyn.data(), {R, D}), 1,
                            cpu_view(base.data(), {k, H}), spec);
  for (int64_t i = 0; i < B * H; ++i) in[i] += 1.f;
  ops::grouped_conv_forward(ctx, cpu_view(b.data(), {R, H}), cpu_view(in.data(), {R, H}), cpu_view(dyn.data(), {R, D}), 1,
                            cpu_view(base.data(), {k, H}), spec);
  for (int64_t i = B * H; i < R * H; ++i) EXPECT_EQ(a[i], b[i]) << "row " << i / H;
  for (int64_t c = 0; c < H; ++c)  // row B (offset 0): tap 0 only, side 1's dynamic kernel
    EXPECT_FLOAT_EQ(b[B * H + c], (base[c] + dyn[B * D + k * G + c / gs]) * in[B * H + c]);
}

// lm_loss_backward with a softcap and the sparse addend against central differences of
// sum_r w_r ce_r + sum_{r,i} extra_dz[r,i] z[r, extra_ids[r,i]] (z the transformed logits), in double-checked
// float32: relative error below 2e-3.
TEST(DFlash2OpsProperty, LmLossSoftcapAndSparseAddendMatchFiniteDifferences) {
  std::mt19937 rng(11);
  const int64_t R = 3, H = 6, V = 20, E = 4;
  const ops::LogitSpec spec{1.7f, 3.0f};
  std::vector<float> h = random_vec(R * H, rng), W = random_vec(V * H, rng, 0.7f), w = {0.5f, 0.3f, 0.2f};
  std::vector<int32_t> labels = {3, 7, 19}, ids = {1, 3, 3, 8, 0, 5, 7, 19, 2, 4, 6, 19};
  std::vector<float> edz = random_vec(R * E, rng, 0.3f);
  const Ctx ctx = cpu_ctx();
  std::vector<float> ws(ops::lm_loss_workspace_floats(R, V, false));
  auto objective = [&](const std::vector<float>& hh) {
    std::vector<float> ce(R), z(R * V);
    std::vector<int32_t> am(R);
    ops::LmLossRowsOut lo;
    lo.ce = cpu_view(ce.data(), {R});
    lo.argmax_q = cpu_view(am.data(), {R});
    ops::lm_loss_forward(ctx, lo, cpu_view(hh.data(), {R, H}), cpu_view(W.data(), {V, H}), cpu_view(labels.data(), {R}),
                         Tensor(), cpu_view(ws.data(), {static_cast<int64_t>(ws.size())}), R, Tensor(), Tensor(),
                         ops::LossObjective::CE, spec);
    ops::matmul_forward(ctx, cpu_view(z.data(), {R, V}), cpu_view(hh.data(), {R, H}), cpu_view(W.data(), {V, H}));
    double f = 0;
    for (int64_t r = 0; r < R; ++r) {
      f += w[r] * ce[r];
      for (int64_t e = 0; e < E; ++e) f += edz[r * E + e] * spec.softcap * std::tanh(spec.multiplier * z[r * V + ids[r * E + e]] / spec.softcap);
    }
    return f;
  };
  std::vector<float> dh(R * H);
  ops::lm_loss_backward(ctx, cpu_view(dh.data(), {R, H}), cpu_view(w.data(), {R}), ops::LossObjective::CE,
                        cpu_view(h.data(), {R, H}), cpu_view(W.data(), {V, H}), cpu_view(labels.data(), {R}), Tensor(),
                        cpu_view(ws.data(), {static_cast<int64_t>(ws.size())}), R, spec, cpu_view(ids.data(), {R, E}),
                        cpu_view(edz.data(), {R, E}));
  std::vector<float> fd(R * H);
  for (int64_t i = 0; i < R * H; ++i) {
    std::vector<float> hp = h, hm = h;
    hp[i] += 1e-2f;
    hm[i] -= 1e-2f;
    fd[i] = static_cast<float>((objective(hp) - objective(hm)) / 2e-2);
  }
  EXPECT_LT(rel_err(dh, fd), 2e-3);
  // The forward's fused gradient (no sparse addend) equals the backward's.
  std::vector<float> dh_f(R * H), dh_b(R * H), ce(R);
  std::vector<int32_t> am(R);
  ops::LmLossRowsOut lo;
  lo.ce = cpu_view(ce.data(), {R});
  lo.argmax_q = cpu_view(am.data(), {R});
  ops::lm_loss_forward(ctx, lo, cpu_view(h.data(), {R, H}), cpu_view(W.data(), {V, H}), cpu_view(labels.data(), {R}),
                       Tensor(), cpu_view(ws.data(), {static_cast<int64_t>(ws.size())}), 2, cpu_view(dh_f.data(), {R, H}),
                       cpu_view(w.data(), {R}), ops::LossObjective::CE, spec);
  ops::lm_loss_backward(ctx, cpu_view(dh_b.data(), {R, H}), cpu_view(w.data(), {R}), ops::LossObjective::CE,
                        cpu_view(h.data(), {R, H}), cpu_view(W.data(), {V, H}), cpu_view(labels.data(), {R}), Tensor(),
                        cpu_view(ws.data(), {static_cast<int64_t>(ws.size())}), 2, spec);
  EXPECT_LT(rel_err(dh_f, dh_b), 1e-6);
}

// The sampled walk draws from its q: over many draws of one row the frequencies follow q (chi-square-free
// check: every candidate within 4 standard errors).
TEST(DFlash2OpsProperty, SampledWalkDrawsFromItsQ) {
  std::mt19937 rng(5);
  const int64_t V = 10, K = 4, r = 3, n = 1;
  std::vector<float> P = random_vec(V * r, rng), S = random_vec(V * r, rng), u = random_vec(r, rng);
  std::vector<int32_t> cand = {2, 5, 7, 9}, anchor = {1}, path(1);
  std::vector<float> unary = {0.5f, 0.2f, -0.3f, 0.1f}, q(K);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  std::mt19937_64 draws(9);
  std::vector<int> count(K, 0);
  const int trials = 20000;
  for (int t = 0; t < trials; ++t) {
    ops::selector_walk(cpu_ctx(), cpu_view(path.data(), {1, n}), cpu_view(q.data(), {1, n, K}), cpu_view(cand.data(), {1, n, K}),
                       cpu_view(unary.data(), {1, n, K}), cpu_view(u.data(), {1, n, r}), cpu_view(anchor.data(), {1}),
                       cpu_view(P.data(), {V, r}), cpu_view(S.data(), {V, r}), 0.8f, [&] { return U(draws); });
    count[std::find(cand.begin(), cand.end(), path[0]) - cand.begin()]++;
  }
  for (int64_t i = 0; i < K; ++i) {
    const double se = std::sqrt(q[i] * (1 - q[i]) / trials);
    EXPECT_NEAR(count[i] / double(trials), q[i], 4 * se + 1e-9) << "slot " << i;
  }
}

}  // namespace
}  // namespace dflash

namespace dflash {
namespace {

// lm_loss_sparse_backward is the sparse addend of lm_loss_backward alone: backward(with addend) -
// backward(without) = sparse_backward onto zeros (softcap 3, multiplier 1.7, a repeated id), to 1e-5 relative.
TEST(DFlash2OpsProperty, SparseBackwardIsTheAddendOfTheFullBackward) {
  std::mt19937 rng(21);
  const int64_t R = 3, H = 6, V = 20, E = 4;
  const ops::LogitSpec spec{1.7f, 3.0f};
  std::normal_distribution<float> nd(0.f, 0.7f);
  std::vector<float> h(R * H), W(V * H), w = {0.5f, 0.3f, 0.2f}, edz(R * E);
  for (float& x : h) x = nd(rng);
  for (float& x : W) x = nd(rng);
  for (float& x : edz) x = nd(rng);
  std::vector<int32_t> labels = {3, 7, 19}, ids = {1, 3, 3, 8, 0, 5, 7, 19, 2, 4, 6, 19};
  const Ctx ctx = cpu_ctx();
  std::vector<float> ws(ops::lm_loss_workspace_floats(R, V, false)), with(R * H), without(R * H), sparse(R * H, 0.f);
  auto backward = [&](std::vector<float>& dh, bool extra) {
    ops::lm_loss_backward(ctx, cpu_view(dh.data(), {R, H}), cpu_view(w.data(), {R}), ops::LossObjective::CE,
                          cpu_view(h.data(), {R, H}), cpu_view(W.data(), {V, H}), cpu_view(labels.data(), {R}), Tensor(),
                          cpu_view(ws.data(), {static_cast<int64_t>(ws.size())}), R, spec,
                          extra ? cpu_view(ids.data(), {R, E}) : Tensor(), extra ? cpu_view(edz.data(), {R, E}) : Tensor());
  };
  backward(with, true);
  backward(without, false);
  // z at the ids: the transformed logits
  std::vector<float> logits(R * V), z(R * E);
  ops::matmul_forward(ctx, cpu_view(logits.data(), {R, V}), cpu_view(h.data(), {R, H}), cpu_view(W.data(), {V, H}));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t e = 0; e < E; ++e)
      z[r * E + e] = spec.softcap * std::tanh(spec.multiplier * logits[r * V + ids[r * E + e]] / spec.softcap);
  ops::lm_loss_sparse_backward(ctx, cpu_view(sparse.data(), {R, H}), cpu_view(ids.data(), {R, E}), cpu_view(z.data(), {R, E}),
                               cpu_view(edz.data(), {R, E}), cpu_view(W.data(), {V, H}), spec);
  std::vector<float> diff(R * H);
  for (int64_t i = 0; i < R * H; ++i) diff[i] = with[i] - without[i];
  EXPECT_LT(rel_err(sparse, diff), 1e-5);
}


// --selector-candidates on hand-made rows (K 3, V 8, rank 2): row 0's label is in its top-K (slot 1), row 1's
// is not. Strict keeps the top-K as it is and gives row 1 no selector term (gold -1, ce 0, no gradient, no
// codebook row touched); Insert puts the label into slot 2 with its own logit (the behaviour before issue 47).
TEST(DFlash2OpsProperty, StrictCandidatesLeaveAMissingLabelOut) {
  const Ctx ctx = cpu_ctx();
  const int64_t R = 2, K = 3, V = 8, r = 2;
  const std::vector<int32_t> ids = {4, 2, 6, 1, 5, 3}, labels = {2, 7}, pred = {0, 4};
  const std::vector<float> vals = {3.f, 2.5f, 1.f, 2.f, 1.5f, 0.5f}, label_logit = {2.5f, -1.f};
  std::vector<float> P(V * r), S(V * r), u = {0.3f, -0.7f, 0.9f, 0.4f};
  for (int64_t i = 0; i < V * r; ++i) P[i] = 0.1f * static_cast<float>(i % 5) - 0.2f, S[i] = 0.05f * static_cast<float>(i % 7);
  for (SelectorCandidates mode : {SelectorCandidates::Strict, SelectorCandidates::Insert}) {
    SCOPED_TRACE(selector_candidates_name(mode));
    const bool strict = mode == SelectorCandidates::Strict;
    std::vector<int32_t> cand(R * K), gold(R), am(R);
    std::vector<float> unary(R * K), scores(R * K), ce(R), d_unary(R * K), du(R * r), dP(V * r, 0.f), dS(V * r, 0.f);
    std::vector<uint8_t> covered(R);
    ops::selector_candidates(ctx, cpu_view(cand.data(), {R, K}), cpu_view(unary.data(), {R, K}), cpu_view(gold.data(), {R}),
                             Tensor(covered.data(), DType::U8, Device::CPU, {R}), cpu_view(ids.data(), {R, K}),
                             cpu_view(vals.data(), {R, K}), cpu_view(labels.data(), {R}), cpu_view(label_logit.data(), {R}),
                             mode);
    EXPECT_EQ(covered, (std::vector<uint8_t>{1, 0}));
    EXPECT_EQ(gold, (std::vector<int32_t>{1, strict ? -1 : 2}));
    EXPECT_EQ(cand, (std::vector<int32_t>{4, 2, 6, 1, 5, strict ? 3 : 7}));
    EXPECT_EQ(unary, (std::vector<float>{3.f, 2.5f, 1.f, 2.f, 1.5f, strict ? 0.5f : -1.f}));
    ops::selector_forward(ctx, cpu_view(scores.data(), {R, K}), cpu_view(ce.data(), {R}), cpu_view(am.data(), {R}),
                          cpu_view(u.data(), {R, r}), cpu_view(unary.data(), {R, K}), cpu_view(cand.data(), {R, K}),
                          cpu_view(pred.data(), {R}), cpu_view(gold.data(), {R}), cpu_view(P.data(), {V, r}),
                          cpu_view(S.data(), {V, r}));
    EXPECT_GT(ce[0], 0.f);
    if (strict) EXPECT_EQ(ce[1], 0.f) << "no selector term for a label outside the strict top-K";
    else EXPECT_GT(ce[1], 0.f);
    const std::vector<float> w = {0.6f, 0.4f};
    ops::selector_backward(ctx, cpu_view(d_unary.data(), {R, K}), cpu_view(du.data(), {R, r}), cpu_view(dP.data(), {V, r}),
                           cpu_view(dS.data(), {V, r}), cpu_view(scores.data(), {R, K}), cpu_view(w.data(), {R}),
                           cpu_view(u.data(), {R, r}), cpu_view(cand.data(), {R, K}), cpu_view(pred.data(), {R}),
                           cpu_view(gold.data(), {R}), cpu_view(P.data(), {V, r}), cpu_view(S.data(), {V, r}));
    const double row1 = std::fabs(d_unary[3]) + std::fabs(d_unary[4]) + std::fabs(d_unary[5]) + std::fabs(du[2]) + std::fabs(du[3]);
    const double pred1_row = std::fabs(dP[4 * r]) + std::fabs(dP[4 * r + 1]);  // P[pred 4]: row 1's predecessor only
    const double cand1_rows = std::fabs(dS[1 * r]) + std::fabs(dS[5 * r]) + std::fabs(dS[3 * r]);  // row 1's candidates only
    if (strict) {
      EXPECT_EQ(row1, 0.0);
      EXPECT_EQ(pred1_row, 0.0);
      EXPECT_EQ(cand1_rows, 0.0);
    } else {
      EXPECT_GT(row1, 0.0);
      EXPECT_GT(pred1_row + cand1_rows, 0.0);
    }
    // row 0 is trained alike in both modes: d_unary = w (softmax - onehot(slot 1)), sums to 0
    EXPECT_NEAR(d_unary[0] + d_unary[1] + d_unary[2], 0.0, 1e-6);
    EXPECT_LT(d_unary[1], 0.f);
  }
}

}  // namespace
}  // namespace dflash
