// Block-prefix attention: forward against a dense float64 reference that builds the mask from the rules
// in the golden README, backward against central finite differences of that reference. Blocks shortened
// to their first block_rows rows (BlockAttnSpec::block_rows, forward only) against the same reference, and
// against a call whose block size is block_rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "dflash/drafter_ops.h"
#include "dflash/hf_config.h"

namespace {

using dflash::cpu_ctx;
using dflash::cpu_view;
using dflash::ops::BlockAttnSpec;

struct Case {
  std::vector<int32_t> cu;       // sequence boundaries
  std::vector<int32_t> anchors;  // global
  int B, nh, nkv, hd, window;
  bool full_block = false;  // sliding layers: the whole block visible (a DFlash2 release's is_causal: false)
  int block_rows = 0;       // forward only: block keys at offsets >= block_rows hidden (0 = all B)
};

struct Inputs {
  std::vector<double> q, kc, vc, kb, vb;  // float64 master copies
};

int seq_of(const std::vector<int32_t>& cu, int64_t j) {
  int s = 0;
  while (cu[s + 1] <= j) ++s;
  return s;
}

// Dense reference: returns out [NB, nh, hd] for the inputs.
std::vector<double> reference(const Case& c, const Inputs& in) {
  const int64_t N = static_cast<int64_t>(c.anchors.size()), B = c.B, T = c.cu.back();
  const int64_t NB = N * B, group = c.nh / c.nkv, hd = c.hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> out(static_cast<size_t>(NB * c.nh * hd), 0.0);
  for (int64_t r = 0; r < NB; ++r) {
    const int64_t n = r / B, o = r % B, a = c.anchors[n];
    for (int64_t h = 0; h < c.nh; ++h) {
      const int64_t kvh = h / group;
      const double* q = &in.q[(r * c.nh + h) * hd];
      std::vector<double> s;
      std::vector<const double*> vs;
      for (int64_t kv = 0; kv < T + NB; ++kv) {
        bool vis;
        const double *k, *v;
        if (kv < T) {
          vis = seq_of(c.cu, kv) == seq_of(c.cu, a) && kv < a && (c.window == 0 || kv >= a + o - (c.window - 1));
          k = &in.kc[(kv * c.nkv + kvh) * hd];
          v = &in.vc[(kv * c.nkv + kvh) * hd];
        } else {
          const int64_t m = (kv - T) / B, b = (kv - T) % B;
          vis = m == n && (c.window == 0 || c.full_block || b <= o) && (c.block_rows == 0 || b < c.block_rows);
          k = &in.kb[((kv - T) * c.nkv + kvh) * hd];
          v = &in.vb[((kv - T) * c.nkv + kvh) * hd];
        }
        if (!vis) continue;
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += q[i] * k[i];
        s.push_back(d * scale);
        vs.push_back(v);
      }
      double mx = -1e300, sum = 0;
      for (double x : s) mx = std::max(mx, x);
      for (double& x : s) sum += (x = std::exp(x - mx));
      double* ov = &out[(r * c.nh + h) * hd];
      for (size_t j = 0; j < s.size(); ++j)
        for (int64_t i = 0; i < hd; ++i) ov[i] += s[j] / sum * vs[j][i];
    }
  }
  return out;
}

std::vector<float> to_f(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

double rel_err(const std::vector<float>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

void run_case(const Case& c, uint32_t seed) {
  const int64_t N = static_cast<int64_t>(c.anchors.size()), B = c.B, T = c.cu.back(), NB = N * B;
  std::mt19937 gen(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  Inputs in;
  auto fill = [&](std::vector<double>& v, size_t n) {
    v.resize(n);
    for (double& x : v) x = static_cast<float>(nd(gen));  // representable in float: same inputs for both
  };
  fill(in.q, NB * c.nh * c.hd);
  fill(in.kc, T * c.nkv * c.hd);
  fill(in.vc, T * c.nkv * c.hd);
  fill(in.kb, NB * c.nkv * c.hd);
  fill(in.vb, NB * c.nkv * c.hd);
  std::vector<double> dout;
  fill(dout, NB * c.nh * c.hd);

  std::vector<int32_t> seq_begin;
  for (int32_t a : c.anchors) seq_begin.push_back(c.cu[seq_of(c.cu, a)]);
  std::vector<float> q = to_f(in.q), kc = to_f(in.kc), vc = to_f(in.vc), kb = to_f(in.kb), vb = to_f(in.vb);
  std::vector<float> out(q.size()), lse(static_cast<size_t>(NB * c.nh)), fdout = to_f(dout);
  BlockAttnSpec spec;
  spec.block_size = c.B;
  spec.window = c.window;
  spec.full_block = c.full_block;
  spec.block_rows = c.block_rows;
  spec.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  auto q3 = [&](std::vector<float>& v, int64_t rows, int64_t heads) { return cpu_view(v.data(), {rows, heads, c.hd}); };
  const auto an = cpu_view(c.anchors.data(), {N});
  const auto sb = cpu_view(seq_begin.data(), {N});
  dflash::ops::block_attention_forward(cpu_ctx(), q3(out, NB, c.nh), cpu_view(lse.data(), {NB, c.nh}),
                                       q3(q, NB, c.nh), q3(kc, T, c.nkv), q3(vc, T, c.nkv), q3(kb, NB, c.nkv),
                                       q3(vb, NB, c.nkv), an, sb, spec);
  EXPECT_LT(rel_err(out, reference(c, in)), 1e-5) << "forward";
  if (c.block_rows != 0 && c.block_rows != c.B) return;  // shortened blocks: forward only

  std::vector<float> dq(q.size()), dkc(kc.size()), dvc(vc.size()), dkb(kb.size()), dvb(vb.size());
  dflash::ops::block_attention_backward(cpu_ctx(), q3(dq, NB, c.nh), q3(dkc, T, c.nkv), q3(dvc, T, c.nkv),
                                        q3(dkb, NB, c.nkv), q3(dvb, NB, c.nkv), q3(fdout, NB, c.nh), q3(out, NB, c.nh),
                                        cpu_view(lse.data(), {NB, c.nh}), q3(q, NB, c.nh), q3(kc, T, c.nkv),
                                        q3(vc, T, c.nkv), q3(kb, NB, c.nkv), q3(vb, NB, c.nkv), an, sb, spec);
  // central differences of L = sum(dout * out) on the float64 reference
  auto loss = [&]() {
    const auto o = reference(c, in);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * dout[i];
    return s;
  };
  auto fd = [&](std::vector<double>& x) {
    std::vector<double> g(x.size());
    const double eps = 1e-6;
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + eps;
      const double lp = loss();
      x[i] = keep - eps;
      const double lm = loss();
      x[i] = keep;
      g[i] = (lp - lm) / (2 * eps);
    }
    return g;
  };
  EXPECT_LT(rel_err(dq, fd(in.q)), 1e-4) << "dq";
  EXPECT_LT(rel_err(dkc, fd(in.kc)), 1e-4) << "dk_ctx";
  EXPECT_LT(rel_err(dvc, fd(in.vc)), 1e-4) << "dv_ctx";
  EXPECT_LT(rel_err(dkb, fd(in.kb)), 1e-4) << "dk_blk";
  EXPECT_LT(rel_err(dvb, fd(in.vb)), 1e-4) << "dv_blk";
  // context rows no block sees get exactly zero gradient (here: the tail of the last sequence)
  const int64_t last_anchor_max = *std::max_element(c.anchors.begin(), c.anchors.end());
  for (int64_t j = last_anchor_max; j < T; ++j)
    if (seq_of(c.cu, j) == static_cast<int>(c.cu.size()) - 2)
      for (int64_t i = 0; i < c.nkv * c.hd; ++i) EXPECT_EQ(dkc[j * c.nkv * c.hd + i], 0.f);
}

// Two sequences (11 and 13 tokens); anchors include the first token of a sequence (no context) and the
// second-to-last token of a sequence (the block runs past its end).
Case base_case(int nh, int nkv, int window) {
  Case c;
  c.cu = {0, 11, 24};
  c.anchors = {0, 4, 9, 11, 15, 22};
  c.B = 4;
  c.nh = nh;
  c.nkv = nkv;
  c.hd = 8;
  c.window = window;
  return c;
}

// The per-layer spec both drafter implementations take: block size, head_dim^-0.5, and the window only on
// layers typed "sliding_attention" (a layer past layer_types is full attention).
TEST(BlockAttention, DrafterAttnSpecPerLayer) {
  dflash::DrafterConfig c;
  c.block_size = 12;
  c.layers.head_dim = 256;
  c.layers.sliding_window = 2048;
  c.layers.layer_types = {"sliding_attention", "full_attention"};
  const BlockAttnSpec s0 = dflash::ops::drafter_attn_spec(c, 0), s1 = dflash::ops::drafter_attn_spec(c, 1),
                     s2 = dflash::ops::drafter_attn_spec(c, 2);
  EXPECT_EQ(s0.block_size, 12);
  EXPECT_FLOAT_EQ(s0.scale, 1.0f / 16.0f);
  EXPECT_EQ(s0.window, 2048);
  EXPECT_EQ(s1.window, 0);
  EXPECT_EQ(s2.window, 0);
  EXPECT_EQ(s2.block_size, 12);
}

TEST(BlockAttention, FullAttentionGqa1) { run_case(base_case(2, 2, 0), 1); }
TEST(BlockAttention, FullAttentionGqa2) { run_case(base_case(4, 2, 0), 2); }
TEST(BlockAttention, FullAttentionGqa3) { run_case(base_case(6, 2, 0), 3); }
TEST(BlockAttention, SlidingWindowGqa2) { run_case(base_case(4, 2, 3), 4); }
TEST(BlockAttention, SlidingWindowGqa3Wide) { run_case(base_case(3, 1, 6), 5); }
TEST(BlockAttention, SlidingWindowFullBlockGqa2) {  // is_causal false: the window bounds the context only
  Case c = base_case(4, 2, 3);
  c.full_block = true;
  run_case(c, 6);
}

TEST(BlockAttention, BlocksSeeOnlyTheirOwnSequenceAndBlock) {
  // Changing another sequence's context or another block's keys must not change a block's output.
  Case c = base_case(2, 1, 0);
  const int64_t N = static_cast<int64_t>(c.anchors.size()), B = c.B, T = c.cu.back(), NB = N * B;
  std::vector<float> q(NB * 2 * 8, 0.3f), kc(T * 8), vc(T * 8), kb(NB * 8), vb(NB * 8), out(q.size()),
      out2(q.size()), lse(NB * 2);
  for (size_t i = 0; i < kc.size(); ++i) kc[i] = vc[i] = std::sin(0.37f * i);
  for (size_t i = 0; i < kb.size(); ++i) kb[i] = vb[i] = std::cos(0.11f * i);
  std::vector<int32_t> sb;
  for (int32_t a : c.anchors) sb.push_back(a >= 11 ? 11 : 0);
  BlockAttnSpec spec;
  spec.block_size = 4;
  spec.scale = 0.35f;
  auto run = [&](std::vector<float>& o) {
    dflash::ops::block_attention_forward(cpu_ctx(), cpu_view(o.data(), {NB, 2, 8}), cpu_view(lse.data(), {NB, 2}),
                                         cpu_view(q.data(), {NB, 2, 8}), cpu_view(kc.data(), {T, 1, 8}),
                                         cpu_view(vc.data(), {T, 1, 8}), cpu_view(kb.data(), {NB, 1, 8}),
                                         cpu_view(vb.data(), {NB, 1, 8}), cpu_view(c.anchors.data(), {N}),
                                         cpu_view(sb.data(), {N}), spec);
  };
  run(out);
  for (int64_t j = 0; j < 11; ++j)
    for (int i = 0; i < 8; ++i) vc[j * 8 + i] += 5.f;   // sequence 0's context values
  for (int i = 0; i < 8 * 4; ++i) vb[i] += 5.f;         // block 0's values
  run(out2);
  for (int64_t r = 3 * B * 2 * 8; r < NB * 2 * 8; ++r) EXPECT_EQ(out[r], out2[r]) << "block of sequence 1, row " << r;
  EXPECT_NE(out[0], out2[0]);  // block 0 sees its own values
}

// Shortened blocks (speculative decoding's last block: BlockAttnSpec::block_rows) against the reference.
TEST(BlockAttention, ShortBlocksFullAttentionGqa2) {
  Case c = base_case(4, 2, 0);
  c.block_rows = 3;
  run_case(c, 7);
  c.block_rows = 1;  // the anchor's own key only
  run_case(c, 8);
}
TEST(BlockAttention, ShortBlocksSlidingWindowFullBlock) {
  Case c = base_case(4, 2, 3);
  c.full_block = true;
  c.block_rows = 2;
  run_case(c, 9);
  c.full_block = false;  // causal in the block: a short block changes none of its first rows
  run_case(c, 10);
}

// Rows 0..V-1 of blocks of B rows with block_rows V are those of blocks of V rows (a drafter of block size V):
// the same visible keys in the same order, so the same values up to the vector lanes' rounding.
TEST(BlockAttention, ShortBlockIsABlockOfThatSize) {
  const int B = 6, V = 4, nh = 4, nkv = 2, hd = 16;
  std::vector<int32_t> anchors = {3, 9, 14}, seq_begin = {0, 0, 12};
  const int64_t N = 3, T = 20;
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto rnd = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = nd(gen);
    return v;
  };
  std::vector<float> q = rnd(N * B * nh * hd), kc = rnd(T * nkv * hd), vc = rnd(T * nkv * hd),
                     kb = rnd(N * B * nkv * hd), vb = rnd(N * B * nkv * hd);
  // the first V rows of each block, packed as blocks of V
  auto first_rows = [&](const std::vector<float>& x, int64_t width) {
    std::vector<float> y;
    for (int64_t n = 0; n < N; ++n) y.insert(y.end(), x.begin() + n * B * width, x.begin() + (n * B + V) * width);
    return y;
  };
  std::vector<float> qv = first_rows(q, nh * hd), kbv = first_rows(kb, nkv * hd), vbv = first_rows(vb, nkv * hd);
  auto run = [&](std::vector<float>& q_, std::vector<float>& kb_, std::vector<float>& vb_, int block, int rows) {
    BlockAttnSpec spec;
    spec.block_size = block;
    spec.block_rows = rows;
    spec.scale = 0.25f;
    const int64_t NB = N * block;
    std::vector<float> out(static_cast<size_t>(NB * nh * hd)), lse(static_cast<size_t>(NB * nh));
    dflash::ops::block_attention_forward(
        cpu_ctx(), cpu_view(out.data(), {NB, nh, hd}), cpu_view(lse.data(), {NB, nh}), cpu_view(q_.data(), {NB, nh, hd}),
        cpu_view(kc.data(), {T, nkv, hd}), cpu_view(vc.data(), {T, nkv, hd}), cpu_view(kb_.data(), {NB, nkv, hd}),
        cpu_view(vb_.data(), {NB, nkv, hd}), cpu_view(anchors.data(), {N}),
        cpu_view(seq_begin.data(), {N}), spec);
    return out;
  };
  const std::vector<float> shortened = first_rows(run(q, kb, vb, B, V), nh * hd);
  const std::vector<float> of_size_v = run(qv, kbv, vbv, V, 0);
  const std::vector<float> whole = first_rows(run(q, kb, vb, B, 0), nh * hd);
  double diff = 0, whole_diff = 0;
  for (size_t i = 0; i < shortened.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(shortened[i] - of_size_v[i])));
    whole_diff = std::max(whole_diff, static_cast<double>(std::fabs(whole[i] - of_size_v[i])));
  }
  EXPECT_LT(diff, 1e-6);
  EXPECT_GT(whole_diff, 1e-2);  // the whole block's later keys do change the first rows
}

// block_rows is forward-only: a backward over shortened blocks, or block_rows beyond the block, is a bug.
TEST(BlockAttentionDeathTest, ShortBlocksRefusedByTheBackward) {
  const int64_t N = 1, B = 4, T = 3;
  std::vector<float> x(static_cast<size_t>(N * B * 8), 0.5f), c(static_cast<size_t>(T * 8), 0.5f), lse(N * B);
  std::vector<int32_t> an = {2}, sb = {0};
  BlockAttnSpec spec;
  spec.block_size = 4;
  spec.block_rows = 2;
  auto v = [](std::vector<float>& d, int64_t r) { return cpu_view(d.data(), {r, 1, 8}); };
  std::vector<float> o(x.size()), dq(x.size()), dkb(x.size()), dvb(x.size()), dkc(c.size()), dvc(c.size());
  EXPECT_DEATH(dflash::ops::block_attention_backward(cpu_ctx(), v(dq, 4), v(dkc, T), v(dvc, T), v(dkb, 4), v(dvb, 4),
                                                     v(x, 4), v(o, 4), cpu_view(lse.data(), {4, 1}), v(x, 4), v(c, T),
                                                     v(c, T), v(x, 4), v(x, 4), cpu_view(an.data(), {1}),
                                                     cpu_view(sb.data(), {1}), spec),
               "block_rows is forward-only");
  spec.block_rows = 5;
  EXPECT_DEATH(dflash::ops::block_attention_forward(cpu_ctx(), v(o, 4), cpu_view(lse.data(), {4, 1}), v(x, 4), v(c, T),
                                                    v(c, T), v(x, 4), v(x, 4), cpu_view(an.data(), {1}),
                                                    cpu_view(sb.data(), {1}), spec),
               "block_rows 5 outside 0..4");
}

}  // namespace
