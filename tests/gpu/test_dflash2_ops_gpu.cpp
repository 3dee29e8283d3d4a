// DFlash2's new ops on CUDA against their float32 CPU twins (docs/dflash2.md 4.3): the grouped dynamic
// causal conv (forward, din, d_dyn of one side with the other half untouched, dbase accumulated), the
// candidate selector (candidates exactly; scores, CE, argmax; d_unary, du, dP/dS accumulated with rows
// repeating across the batch) and lm_loss with a LogitSpec (multiplier, softcap) and top-K outputs, and the
// backward's sparse addend. Each at a tiny shape and a realistic one (Qwen3.8-27B: H 5120, V 248320).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include "dflash/drafter_ops.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::gpu;
using test::random_bf16;
using test::rel_err;
using test::to_device;
using test::to_host;

std::vector<int32_t> to_host_i32(const Ctx& g, const Tensor& t) {
  std::vector<int32_t> h(t.numel());
  copy_tensor(g, cpu_view(h.data(), {static_cast<int64_t>(h.size())}), t);
  return h;
}
std::vector<uint8_t> to_host_u8(const Ctx& g, const Tensor& t) {
  std::vector<uint8_t> h(t.numel());
  copy_tensor(g, Tensor(h.data(), DType::U8, Device::CPU, {static_cast<int64_t>(h.size())}), t);
  return h;
}
// An F32 device buffer holding `host` (NaN everywhere when host is empty: an output to be written).
Buffer to_device_f32(const Ctx& g, const std::vector<float>& host, std::initializer_list<int64_t> dims) {
  Buffer b(Device::CUDA, DType::F32, dims);
  if (host.empty())
    cudaMemset(b.t().data, 0xff, b.t().nbytes());  // 0xffffffff is a float NaN
  else
    copy_tensor(g, b, cpu_view(host.data(), dims));
  return b;
}
Buffer to_device_i32_2d(const Ctx& g, const std::vector<int32_t>& host, std::initializer_list<int64_t> dims) {
  Buffer b(Device::CUDA, DType::I32, dims);
  copy_tensor(g, b, cpu_view(host.data(), dims));
  return b;
}
std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}
int mismatches(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// ---- grouped dynamic causal conv ------------------------------------------------------------------------

void run_conv(int64_t N, int B, int64_t H, int gs, int k, int side, uint32_t seed) {
  SCOPED_TRACE("conv N=" + std::to_string(N) + " B=" + std::to_string(B) + " H=" + std::to_string(H) +
               " group=" + std::to_string(gs) + " k=" + std::to_string(k) + " side=" + std::to_string(side));
  Ctx g = gpu();
  const Ctx cpu = cpu_ctx();
  const int64_t R = N * B, G = H / gs, D = 2 * int64_t(k) * G;
  const ops::GroupedConvSpec spec{B, k, gs};
  auto in = random_bf16(R * H, seed), dyn = random_bf16(R * D, seed + 1, 0.3f), dout = random_bf16(R * H, seed + 2);
  auto base = random_bf16(int64_t(k) * H, seed + 3, 0.5f);  // fp32 master weights (bf16-exact values)
  // d_dyn starts at 7 (exact in bf16): the other side's half must keep it; dbase starts at a prior.
  std::vector<float> d_dyn0(R * D, 7.f), dbase0(int64_t(k) * H, 0.25f);

  std::vector<float> out(R * H), din(R * H), d_dyn = d_dyn0, dbase = dbase0;
  ops::grouped_conv_forward(cpu, cpu_view(out.data(), {R, H}), cpu_view(in.data(), {R, H}), cpu_view(dyn.data(), {R, D}),
                            side, cpu_view(base.data(), {int64_t(k), H}), spec);
  ops::grouped_conv_backward(cpu, cpu_view(din.data(), {R, H}), cpu_view(d_dyn.data(), {R, D}),
                             cpu_view(dbase.data(), {int64_t(k), H}), cpu_view(dout.data(), {R, H}),
                             cpu_view(in.data(), {R, H}), cpu_view(dyn.data(), {R, D}), side,
                             cpu_view(base.data(), {int64_t(k), H}), spec);

  Buffer d_in = to_device(g, in, {R, H}), d_dyn_in = to_device(g, dyn, {R, D}), d_dout = to_device(g, dout, {R, H});
  Buffer d_base = to_device_f32(g, base, {int64_t(k), H});
  Buffer d_out = to_device(g, {}, {R, H}), d_din = to_device(g, {}, {R, H});
  Buffer d_ddyn = to_device(g, d_dyn0, {R, D});
  Buffer d_dbase = to_device_f32(g, dbase0, {int64_t(k), H});
  ops::grouped_conv_forward(g, d_out, d_in, d_dyn_in, side, d_base, spec);
  ops::grouped_conv_backward(g, d_din, d_ddyn, d_dbase, d_dout, d_in, d_dyn_in, side, d_base, spec);

  EXPECT_LT(rel_err(to_host(g, d_out), out), test::tol::kOp) << "out";
  EXPECT_LT(rel_err(to_host(g, d_din), din), test::tol::kOp) << "din";
  // d_dyn: this side's half against the CPU; the other half exactly as it was.
  const auto got_ddyn = to_host(g, d_ddyn);
  std::vector<float> got_half, want_half;
  int64_t other_changed = 0;
  for (int64_t t = 0; t < R; ++t)
    for (int64_t c = 0; c < D; ++c) {
      const bool mine = (c / (int64_t(k) * G)) == side;
      if (mine) {
        got_half.push_back(got_ddyn[t * D + c]);
        want_half.push_back(d_dyn[t * D + c]);
      } else {
        other_changed += got_ddyn[t * D + c] != 7.f;
      }
    }
  EXPECT_LT(rel_err(got_half, want_half), test::tol::kOp) << "d_dyn (this side)";
  EXPECT_EQ(other_changed, 0) << "d_dyn: the other side's half was written";
  // dbase accumulates: compare what was added to the prior.
  EXPECT_LT(rel_err(minus(to_host(g, d_dbase), dbase0), minus(dbase, dbase0)), test::tol::kF32Output) << "dbase";
}

TEST(GpuDFlash2Ops, GroupedConvTiny) {
  SKIP_WITHOUT_GPU();
  run_conv(3, 4, 64, 16, 3, 0, 101);  // vector path, 3 taps
  run_conv(3, 4, 64, 16, 3, 1, 102);
  run_conv(2, 8, 48, 8, 2, 1, 103);   // groups of one lane
}
TEST(GpuDFlash2Ops, GroupedConvScalarPath) {
  SKIP_WITHOUT_GPU();
  run_conv(3, 3, 24, 6, 2, 0, 111);  // group 6, H % 8 != 0: the scalar kernels
  run_conv(2, 5, 20, 4, 5, 1, 112);  // k == B
}
TEST(GpuDFlash2Ops, GroupedConvQwen38Shape) {
  SKIP_WITHOUT_GPU();
  run_conv(64, 8, 5120, 16, 2, 0, 121);  // R 512, G 320
  run_conv(64, 8, 5120, 16, 2, 1, 122);
}

// ---- candidate selector -----------------------------------------------------------------------------------

void run_selector(int64_t R, int64_t V, int r, int K, int pred_pool, uint32_t seed,
                  SelectorCandidates mode = SelectorCandidates::Insert) {
  SCOPED_TRACE("selector R=" + std::to_string(R) + " V=" + std::to_string(V) + " r=" + std::to_string(r) +
               " K=" + std::to_string(K) + " " + selector_candidates_name(mode));
  Ctx g = gpu();
  const Ctx cpu = cpu_ctx();
  std::mt19937 rng(seed);
  // top-K lists: K distinct ids a row, values descending; the label inside the list in about half the rows.
  std::vector<int32_t> topk_ids(R * K), labels(R), pred(R);
  std::vector<float> topk_vals(R * K), label_logit(R), weight(R);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t row = 0; row < R; ++row) {
    std::set<int32_t> used;
    float v = 3.f + nd(rng);
    for (int i = 0; i < K; ++i) {
      int32_t id;
      do id = static_cast<int32_t>(rng() % V);
      while (!used.insert(id).second);
      topk_ids[row * K + i] = id;
      topk_vals[row * K + i] = v;
      v -= 0.05f + std::abs(nd(rng)) * 0.3f;
    }
    if (row % 2 == 0) {
      labels[row] = topk_ids[row * K + rng() % K];
    } else {
      int32_t y;
      do y = static_cast<int32_t>(rng() % V);
      while (used.count(y));
      labels[row] = y;
    }
    label_logit[row] = v - 1.f;
    pred[row] = static_cast<int32_t>(rng() % std::min<int64_t>(pred_pool, V));  // predecessors repeat
    weight[row] = row % 5 == 4 ? 0.f : static_cast<float>(rng() % 1000 + 1) / 1000.f / R;
  }
  auto u = random_bf16(R * r, seed + 1), P = random_bf16(V * r, seed + 2, 0.3f), S = random_bf16(V * r, seed + 3, 0.3f);

  // CPU
  std::vector<int32_t> cand(R * K), gold(R), am(R), am2(R);
  std::vector<float> unary(R * K), scores(R * K), ce(R), scores2(R * K), d_unary(R * K), du(R * r), du_sg(R * r);
  std::vector<uint8_t> covered(R);
  // dP/dS accumulate onto this; small (2^-10), so its rounding does not blur the ~1e-3 gradients added to it.
  const std::vector<float> prior(V * r, 1.f / 1024);
  std::vector<float> dP = prior, dS = prior;
  const Tensor covered_c(covered.data(), DType::U8, Device::CPU, {R});
  ops::selector_candidates(cpu, cpu_view(cand.data(), {R, K}), cpu_view(unary.data(), {R, K}), cpu_view(gold.data(), {R}),
                           covered_c, cpu_view(topk_ids.data(), {R, K}), cpu_view(topk_vals.data(), {R, K}),
                           cpu_view(labels.data(), {R}), cpu_view(label_logit.data(), {R}), mode);
  const Tensor u_c = cpu_view(u.data(), {R, int64_t(r)}), P_c = cpu_view(P.data(), {V, int64_t(r)}),
               S_c = cpu_view(S.data(), {V, int64_t(r)});
  const Tensor cand_c = cpu_view(cand.data(), {R, K}), pred_c = cpu_view(pred.data(), {R}),
               gold_c = cpu_view(gold.data(), {R});
  ops::selector_forward(cpu, cpu_view(scores.data(), {R, K}), cpu_view(ce.data(), {R}), cpu_view(am.data(), {R}), u_c,
                        cpu_view(unary.data(), {R, K}), cand_c, pred_c, gold_c, P_c, S_c);
  ops::selector_forward(cpu, cpu_view(scores2.data(), {R, K}), Tensor(), cpu_view(am2.data(), {R}), u_c,
                        cpu_view(unary.data(), {R, K}), cand_c, pred_c, Tensor(), P_c, S_c);
  ops::selector_backward(cpu, cpu_view(d_unary.data(), {R, K}), cpu_view(du.data(), {R, int64_t(r)}),
                         cpu_view(dP.data(), {V, int64_t(r)}), cpu_view(dS.data(), {V, int64_t(r)}),
                         cpu_view(scores.data(), {R, K}), cpu_view(weight.data(), {R}), u_c, cand_c, pred_c, gold_c, P_c,
                         S_c);

  // CUDA
  Buffer g_topk_ids = to_device_i32_2d(g, topk_ids, {R, K}), g_labels = test::to_device_i32(g, labels);
  Buffer g_pred = test::to_device_i32(g, pred);
  Buffer g_topk_vals = to_device_f32(g, topk_vals, {R, K}), g_label_logit = to_device_f32(g, label_logit, {R});
  Buffer g_cand(Device::CUDA, DType::I32, {R, K}), g_gold(Device::CUDA, DType::I32, {R}), g_am(Device::CUDA, DType::I32, {R});
  Buffer g_covered(Device::CUDA, DType::U8, {R});
  Buffer g_unary = to_device_f32(g, {}, {R, K}), g_scores = to_device_f32(g, {}, {R, K}), g_ce = to_device_f32(g, {}, {R});
  ops::selector_candidates(g, g_cand, g_unary, g_gold, g_covered, g_topk_ids, g_topk_vals, g_labels, g_label_logit, mode);
  if (mode == SelectorCandidates::Strict)  // half the rows' labels are outside their top-K: gold -1 there
    EXPECT_EQ(std::count(gold.begin(), gold.end(), -1), std::count(covered.begin(), covered.end(), uint8_t{0}));
  EXPECT_EQ(to_host_i32(g, g_cand), cand) << "cand";
  EXPECT_EQ(to_host_i32(g, g_gold), gold) << "gold";
  EXPECT_EQ(to_host_u8(g, g_covered), covered) << "covered";
  EXPECT_EQ(to_host(g, g_unary), unary) << "unary (copied values: exact)";

  Buffer g_u = to_device_f32(g, u, {R, int64_t(r)}), g_P = to_device_f32(g, P, {V, int64_t(r)}),
         g_S = to_device_f32(g, S, {V, int64_t(r)});
  ops::selector_forward(g, g_scores, g_ce, g_am, g_u, g_unary, g_cand, g_pred, g_gold, g_P, g_S);
  EXPECT_LT(rel_err(to_host(g, g_scores), scores), test::tol::kSelectorF32) << "scores";
  EXPECT_LT(rel_err(to_host(g, g_ce), ce), test::tol::kSelectorF32) << "ce";
  EXPECT_LE(mismatches(to_host_i32(g, g_am), am), test::tol::kArgmaxMismatches) << "argmax";
  Buffer g_scores2 = to_device_f32(g, {}, {R, K});
  ops::selector_forward(g, g_scores2, Tensor(), g_am, g_u, g_unary, g_cand, g_pred, Tensor(), g_P, g_S);
  EXPECT_LT(rel_err(to_host(g, g_scores2), scores2), test::tol::kSelectorF32) << "scores (no gold)";
  EXPECT_LE(mismatches(to_host_i32(g, g_am), am2), test::tol::kArgmaxMismatches) << "argmax (no gold)";

  Buffer g_w = to_device_f32(g, weight, {R});
  Buffer g_dunary = to_device_f32(g, {}, {R, K}), g_du = to_device_f32(g, {}, {R, int64_t(r)});
  Buffer g_dP = to_device_f32(g, prior, {V, int64_t(r)}), g_dS = to_device_f32(g, prior, {V, int64_t(r)});
  // The CPU's scores go in, so the backward is compared on the same inputs.
  Buffer g_scores_c = to_device_f32(g, scores, {R, K});
  ops::selector_backward(g, g_dunary, g_du, g_dP, g_dS, g_scores_c, g_w, g_u, g_cand, g_pred, g_gold, g_P, g_S);
  EXPECT_LT(rel_err(to_host(g, g_dunary), d_unary), test::tol::kSelectorF32) << "d_unary";
  EXPECT_LT(rel_err(to_host(g, g_du), du), test::tol::kSelectorF32) << "du";
  EXPECT_LT(rel_err(minus(to_host(g, g_dP), prior), minus(dP, prior)), test::tol::kSelectorF32) << "dP (accumulated)";
  EXPECT_LT(rel_err(minus(to_host(g, g_dS), prior), minus(dS, prior)), test::tol::kSelectorF32) << "dS (accumulated)";
  // Stop-gradient: d_unary skipped, du the same.
  Buffer g_du2 = to_device_f32(g, {}, {R, int64_t(r)});
  ops::selector_backward(g, Tensor(), g_du2, g_dP, g_dS, g_scores_c, g_w, g_u, g_cand, g_pred, g_gold, g_P, g_S);
  EXPECT_LT(rel_err(to_host(g, g_du2), du), test::tol::kSelectorF32) << "du (no d_unary)";
}

TEST(GpuDFlash2Ops, SelectorTiny) {
  SKIP_WITHOUT_GPU();
  run_selector(24, 50, 16, 8, 6, 201);   // ids and predecessors repeat across rows (atomics)
  run_selector(9, 300, 40, 64, 300, 202);  // K = 64 (two scores a lane), r not a multiple of 32
}
TEST(GpuDFlash2Ops, SelectorQwen38Shape) {
  SKIP_WITHOUT_GPU();
  run_selector(256, 248320, 256, 16, 1000, 211);
}
// --selector-candidates strict (issue 47): a missing label leaves the top-K as it is, gold -1, ce 0 and no
// gradient for its row, on CUDA as on the CPU.
TEST(GpuDFlash2Ops, SelectorStrictCandidates) {
  SKIP_WITHOUT_GPU();
  run_selector(24, 50, 16, 8, 6, 203, SelectorCandidates::Strict);
  run_selector(9, 300, 40, 64, 300, 204, SelectorCandidates::Strict);
  run_selector(256, 248320, 256, 16, 1000, 212, SelectorCandidates::Strict);
}

// ---- lm_loss with a LogitSpec and top-K ---------------------------------------------------------------------

// The reference transformed logit of row `row`, token `id` in double from the same bf16 inputs.
double ref_logit(const std::vector<float>& h, const std::vector<float>& W, int64_t H, int64_t row, int32_t id,
                 const ops::LogitSpec& spec) {
  double z = 0;
  for (int64_t c = 0; c < H; ++c) z += double(h[row * H + c]) * double(W[int64_t(id) * H + c]);
  z *= spec.multiplier;
  return spec.softcap > 0 ? spec.softcap * std::tanh(z / spec.softcap) : z;
}

// The top-K rule of tolerances.h (kTopKValue): GPU values descending with ties by lower id; each slot's value
// within eps of the CPU's; each GPU value within eps of the reference logit of its id; an id in only one of
// the two lists within eps of the CPU's K-th value.
void check_topk(const std::vector<int32_t>& gid, const std::vector<float>& gval, const std::vector<int32_t>& cid,
                const std::vector<float>& cval, const std::vector<float>& h, const std::vector<float>& W, int64_t R,
                int64_t H, int K, const ops::LogitSpec& spec) {
  auto eps = [](double v) { return test::tol::kTopKValue * std::max(1.0, std::abs(v)); };
  int bad_rows = 0;
  for (int64_t row = 0; row < R && bad_rows < 5; ++row) {
    bool bad = false;
    std::string why;
    for (int i = 0; i < K; ++i) {
      const int64_t s = row * K + i;
      if (i > 0 && !(gval[s] < gval[s - 1] || (gval[s] == gval[s - 1] && gid[s] > gid[s - 1])))
        bad = true, why += " order@" + std::to_string(i);
      if (std::abs(double(gval[s]) - cval[s]) > eps(cval[s])) bad = true, why += " value@" + std::to_string(i);
      const double ref = ref_logit(h, W, H, row, gid[s], spec);
      if (std::abs(double(gval[s]) - ref) > eps(ref)) bad = true, why += " ref@" + std::to_string(i);
    }
    const std::set<int32_t> gs(gid.begin() + row * K, gid.begin() + (row + 1) * K),
        cs(cid.begin() + row * K, cid.begin() + (row + 1) * K);
    const double kth = cval[row * K + K - 1];
    for (int32_t id : gs)
      if (!cs.count(id) && std::abs(ref_logit(h, W, H, row, id, spec) - kth) > eps(kth))
        bad = true, why += " extra id " + std::to_string(id);
    for (int32_t id : cs)
      if (!gs.count(id) && std::abs(ref_logit(h, W, H, row, id, spec) - kth) > eps(kth))
        bad = true, why += " missing id " + std::to_string(id);
    if (bad) {
      ++bad_rows;
      ADD_FAILURE() << "top-K row " << row << ":" << why;
    }
  }
}

void run_lm_loss(int64_t R, int64_t H, int64_t V, int64_t chunk, int K, ops::LogitSpec spec, uint32_t seed) {
  SCOPED_TRACE("lm_loss R=" + std::to_string(R) + " H=" + std::to_string(H) + " V=" + std::to_string(V) +
               " chunk=" + std::to_string(chunk) + " K=" + std::to_string(K) + " m=" + std::to_string(spec.multiplier) +
               " softcap=" + std::to_string(spec.softcap));
  Ctx g = gpu();
  const Ctx cpu = cpu_ctx();
  auto h = random_bf16(R * H, seed), teacher = random_bf16(R * H, seed + 1);
  auto W = random_bf16(V * H, seed + 2, 1.5f / std::sqrt(float(H)));  // logits ~ N(0, 1.5^2) before the transform
  std::mt19937 rng(seed + 3);
  std::vector<int32_t> labels(R);
  std::vector<float> weight(R);
  for (int64_t r = 0; r < R; ++r) {
    labels[r] = static_cast<int32_t>(rng() % V);
    weight[r] = r % 7 == 3 ? 0.f : static_cast<float>(rng() % 1000 + 1) / 1000.f / R;
  }
  const Tensor h_c = cpu_view(h.data(), {R, H}), t_c = cpu_view(teacher.data(), {R, H}), W_c = cpu_view(W.data(), {V, H});
  const Tensor lab_c = cpu_view(labels.data(), {R}), w_c = cpu_view(weight.data(), {R});
  std::vector<float> ws(ops::lm_loss_workspace_floats(chunk, V, true));
  const Tensor ws_c = cpu_view(ws.data(), {int64_t(ws.size())});

  // CPU: fused forward (CE gradient) with every output, then backward with the sparse addend (CE and KL).
  std::vector<float> ce(R), kl(R), topk_vals(R * K), label_logit(R), dh(R * H), dh_ce(R * H), dh_kl(R * H), dh_plain(R * H);
  std::vector<int32_t> amq(R), amp(R), topk_ids(R * K);
  const ops::LmLossRowsOut out_c{cpu_view(ce.data(), {R}),          cpu_view(kl.data(), {R}),
                                 cpu_view(amq.data(), {R}),         cpu_view(amp.data(), {R}),
                                 cpu_view(topk_ids.data(), {R, K}), cpu_view(topk_vals.data(), {R, K}),
                                 cpu_view(label_logit.data(), {R})};
  ops::lm_loss_forward(cpu, out_c, h_c, W_c, lab_c, t_c, ws_c, chunk, cpu_view(dh.data(), {R, H}), w_c,
                       ops::LossObjective::CE, spec);
  // The addend: the row's top-K ids (slot 1 repeated in slot 0's place of every third row: a repeated id adds
  // up) with weighted dz of the size of the CE gradient.
  std::vector<int32_t> extra_ids = topk_ids;
  std::vector<float> extra_dz(R * K);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t r = 0; r < R; ++r) {
    if (r % 3 == 0 && K > 1) extra_ids[r * K] = extra_ids[r * K + 1];
    for (int i = 0; i < K; ++i) extra_dz[r * K + i] = weight[r] * nd(rng);
  }
  const Tensor xid_c = cpu_view(extra_ids.data(), {R, K}), xdz_c = cpu_view(extra_dz.data(), {R, K});
  ops::lm_loss_backward(cpu, cpu_view(dh_ce.data(), {R, H}), w_c, ops::LossObjective::CE, h_c, W_c, lab_c, Tensor(), ws_c,
                        chunk, spec, xid_c, xdz_c);
  ops::lm_loss_backward(cpu, cpu_view(dh_kl.data(), {R, H}), w_c, ops::LossObjective::KL, h_c, W_c, lab_c, t_c, ws_c,
                        chunk, spec, xid_c, xdz_c);
  ops::lm_loss_backward(cpu, cpu_view(dh_plain.data(), {R, H}), w_c, ops::LossObjective::CE, h_c, W_c, lab_c, Tensor(),
                        ws_c, chunk, spec);
  // Not vacuous: the addend moves dh well beyond the bf16 tolerance.
  ASSERT_GT(rel_err(dh_ce, dh_plain), 10 * test::tol::kOp) << "the sparse addend barely changes dh";

  // CUDA
  Buffer d_h = to_device(g, h, {R, H}), d_t = to_device(g, teacher, {R, H}), d_W = to_device(g, W, {V, H});
  Buffer d_lab = test::to_device_i32(g, labels), d_w = to_device_f32(g, weight, {R});
  Buffer d_ws(Device::CUDA, DType::F32, {int64_t(ws.size())});
  Buffer d_ce = to_device_f32(g, {}, {R}), d_kl = to_device_f32(g, {}, {R}), d_tv = to_device_f32(g, {}, {R, K}),
         d_ll = to_device_f32(g, {}, {R});
  Buffer d_amq(Device::CUDA, DType::I32, {R}), d_amp(Device::CUDA, DType::I32, {R}), d_tid(Device::CUDA, DType::I32, {R, K});
  const ops::LmLossRowsOut out_g{d_ce, d_kl, d_amq, d_amp, d_tid, d_tv, d_ll};
  Buffer d_dh = to_device(g, {}, {R, H});
  ops::lm_loss_forward(g, out_g, d_h, d_W, d_lab, d_t, d_ws, chunk, d_dh, d_w, ops::LossObjective::CE, spec);
  EXPECT_LT(rel_err(to_host(g, d_ce), ce), test::tol::kF32Output) << "ce";
  EXPECT_LT(rel_err(to_host(g, d_kl), kl), test::tol::kKlRows) << "kl";
  EXPECT_LE(mismatches(to_host_i32(g, d_amq), amq), test::tol::kArgmaxMismatches) << "argmax q";
  EXPECT_LE(mismatches(to_host_i32(g, d_amp), amp), test::tol::kArgmaxMismatches) << "argmax p";
  EXPECT_LT(rel_err(to_host(g, d_ll), label_logit), test::tol::kF32Output) << "label_logit";
  EXPECT_LT(rel_err(to_host(g, d_dh), dh), test::tol::kOp) << "dh (fused CE)";
  check_topk(to_host_i32(g, d_tid), to_host(g, d_tv), topk_ids, topk_vals, h, W, R, H, K, spec);

  // Top-K without a gradient or teacher (the evaluation path): the same lists.
  const ops::LmLossRowsOut out_eval{d_ce, Tensor(), d_amq, Tensor(), d_tid, d_tv, d_ll};
  ops::lm_loss_forward(g, out_eval, d_h, d_W, d_lab, Tensor(), d_ws, chunk, Tensor(), Tensor(), ops::LossObjective::CE,
                       spec);
  EXPECT_LT(rel_err(to_host(g, d_ce), ce), test::tol::kF32Output) << "ce (no teacher)";
  check_topk(to_host_i32(g, d_tid), to_host(g, d_tv), topk_ids, topk_vals, h, W, R, H, K, spec);

  // Backward with the sparse addend; the CPU's ids, so both sides add at the same logits.
  Buffer d_xid = to_device_i32_2d(g, extra_ids, {R, K}), d_xdz = to_device_f32(g, extra_dz, {R, K});
  Buffer d_dh2 = to_device(g, {}, {R, H});
  ops::lm_loss_backward(g, d_dh2, d_w, ops::LossObjective::CE, d_h, d_W, d_lab, Tensor(), d_ws, chunk, spec, d_xid, d_xdz);
  EXPECT_LT(rel_err(to_host(g, d_dh2), dh_ce), test::tol::kOp) << "dh (backward CE + addend)";
  ops::lm_loss_backward(g, d_dh2, d_w, ops::LossObjective::KL, d_h, d_W, d_lab, d_t, d_ws, chunk, spec, d_xid, d_xdz);
  EXPECT_LT(rel_err(to_host(g, d_dh2), dh_kl), test::tol::kOp) << "dh (backward KL + addend)";
  ops::lm_loss_backward(g, d_dh2, d_w, ops::LossObjective::CE, d_h, d_W, d_lab, Tensor(), d_ws, chunk, spec);
  EXPECT_LT(rel_err(to_host(g, d_dh2), dh_plain), test::tol::kOp) << "dh (backward CE)";
}

TEST(GpuDFlash2Ops, LmLossSoftcapTopKTiny) {
  SKIP_WITHOUT_GPU();
  run_lm_loss(37, 64, 1000, 8, 16, ops::LogitSpec{0.7f, 4.f}, 301);  // several chunks, a partial last one
  run_lm_loss(19, 96, 3001, 32, 64, ops::LogitSpec{2.5f, 4.f}, 302);  // K = 64, saturating softcap
  run_lm_loss(11, 64, 777, 4, 5, ops::LogitSpec{0.19611614f, 0.f}, 303);  // multiplier only
  run_lm_loss(13, 64, 500, 8, 16, ops::LogitSpec{}, 304);  // identity with top-K and the addend (DFlash2, m 1)
}
TEST(GpuDFlash2Ops, LmLossSoftcapTopKQwen38Vocab) {
  SKIP_WITHOUT_GPU();
  // The real vocabulary (each warp scans ~7800 logits a row); H small so the CPU twin stays quick.
  run_lm_loss(24, 128, 248320, 16, 16, ops::LogitSpec{0.19611614f, 20.f}, 311);
}

}  // namespace
}  // namespace dflash

namespace dflash {
namespace {

// The CUDA sparse addend against the CPU op on random data (bf16-rounded inputs, dh accumulated onto a
// small random start): R 300 rows, H 1024, K 16, V 5000, softcap 20, multiplier 0.2; relative error within tol::kOp.
TEST(GpuDFlash2Ops, LmLossSparseBackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t R = 300, H = 1024, K = 16, V = 5000;
  const ops::LogitSpec spec{0.2f, 20.f};
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto bf = [](float x) { return bf16_to_f32(f32_to_bf16(x)); };
  std::vector<float> dh(R * H), W(V * H), z(R * K), dz(R * K);
  for (float& x : dh) x = bf(0.002f * nd(rng));  // small: the bf16 rounding of start + addend stays small against the addend
  for (float& x : W) x = bf(0.05f * nd(rng));
  for (float& x : z) x = 15.f * std::tanh(nd(rng));
  for (float& x : dz) x = 0.1f * nd(rng);
  std::vector<int32_t> ids(R * K);
  for (int32_t& v : ids) v = static_cast<int32_t>(rng() % V);
  std::vector<float> cpu_dh = dh;
  ops::lm_loss_sparse_backward(cpu_ctx(), cpu_view(cpu_dh.data(), {R, H}), cpu_view(ids.data(), {R, K}),
                               cpu_view(z.data(), {R, K}), cpu_view(dz.data(), {R, K}), cpu_view(W.data(), {V, H}), spec);
  const Ctx ctx = test::gpu();
  Buffer g_dh(Device::CUDA, DType::BF16, {R, H}), g_W(Device::CUDA, DType::BF16, {V, H});
  Buffer g_ids(Device::CUDA, DType::I32, {R, K}), g_z(Device::CUDA, DType::F32, {R, K}), g_dz(Device::CUDA, DType::F32, {R, K});
  copy_tensor(ctx, g_dh, cpu_view(dh.data(), {R, H}));
  copy_tensor(ctx, g_W, cpu_view(W.data(), {V, H}));
  copy_tensor(ctx, g_ids, cpu_view(ids.data(), {R, K}));
  copy_tensor(ctx, g_z, cpu_view(z.data(), {R, K}));
  copy_tensor(ctx, g_dz, cpu_view(dz.data(), {R, K}));
  ops::lm_loss_sparse_backward(ctx, g_dh, g_ids, g_z, g_dz, g_W, spec, Tensor());
  std::vector<float> got(R * H);
  copy_tensor(ctx, cpu_view(got.data(), {R, H}), g_dh);
  std::vector<float> added(R * H), want(R * H);  // compare what was added (dh's start is the same on both)
  for (int64_t i = 0; i < R * H; ++i) {
    added[i] = got[i] - dh[i];
    want[i] = cpu_dh[i] - dh[i];
  }
  EXPECT_LT(test::rel_err(added, want), 1e-2) << "bf16 dh: one rounding of (start + addend)";
}

}  // namespace
}  // namespace dflash
