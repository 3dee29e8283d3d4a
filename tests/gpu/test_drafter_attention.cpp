// Block-prefix attention on CUDA against its float32 CPU twin (src/ops/block_attention.cpp) on random
// data: several packed sequences, GQA groups of 1 to 12, head dims 16 to 256, full and sliding-window
// layers, a block whose own keys run past its sequence's end, a block with no context; both implementations
// (the fused kernels where they apply, and the chunked cuBLAS path with one chunk and many chunks), relative
// error <= 1e-2 (tol::kOp) on every output and gradient. Blocks shortened to their first block_rows rows
// (BlockAttnSpec::block_rows: speculative decoding's last block; forward only) the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include <cuda_runtime.h>

#include "block_attention.cuh"
#include "device_limits.cuh"
#include "dflash/drafter_ops.h"
#include "gpu_test_util.h"

namespace dflash {
namespace {

using test::gpu;
using test::random_bf16;
using test::rel_err;
using test::to_device;
using test::to_host;

struct AttnCase {
  int64_t nh, nkv, hd, B;
  int window;
  int64_t score_budget;  // 0 = default (one chunk here)
  std::vector<int32_t> lens = {70, 45, 91};
  int per_seq = 4;
  bool full_block = false;  // sliding layers: the whole block visible (BlockAttnSpec::full_block)
  int block_rows = 0;       // forward only: block keys at offsets >= block_rows hidden (0 = all B)
};

// Packed sequences of the given lengths with `per_seq` sorted anchors each (anchor + 1 inside the sequence).
void make_blocks(const std::vector<int32_t>& lens, int per_seq, uint32_t seed, std::vector<int32_t>& anchors,
                 std::vector<int32_t>& seq_begin) {
  std::mt19937 rng(seed);
  int32_t s0 = 0;
  for (int32_t len : lens) {
    std::vector<int32_t> a;
    for (int i = 0; i < per_seq; ++i) a.push_back(s0 + static_cast<int32_t>(rng() % (len - 1)));
    std::sort(a.begin(), a.end());
    for (int32_t x : a) {
      anchors.push_back(x);
      seq_begin.push_back(s0);
    }
    s0 += len;
  }
}

void run_case(const AttnCase& c, uint32_t seed, cuda::BlockAttentionImpl impl) {
  Ctx g = gpu();
  const Ctx cpu = cpu_ctx();
  std::vector<int32_t> anchors, seq_begin;
  make_blocks(c.lens, c.per_seq, seed, anchors, seq_begin);
  int64_t T = 0;
  for (int32_t len : c.lens) T += len;
  anchors.push_back(0);  // a block with no context at all (anchor at its sequence start)
  seq_begin.push_back(0);
  anchors.push_back(static_cast<int32_t>(T - 1));  // the last token: all of the block's own keys lie past the end
  seq_begin.push_back(static_cast<int32_t>(T - c.lens.back()));
  const int64_t N = static_cast<int64_t>(anchors.size()), NB = N * c.B;
  const int64_t nh = c.nh, nkv = c.nkv, hd = c.hd;
  auto q = random_bf16(NB * nh * hd, seed + 1), kc = random_bf16(T * nkv * hd, seed + 2),
       vc = random_bf16(T * nkv * hd, seed + 3), kb = random_bf16(NB * nkv * hd, seed + 4),
       vb = random_bf16(NB * nkv * hd, seed + 5), dout = random_bf16(NB * nh * hd, seed + 6);
  ops::BlockAttnSpec spec;
  spec.block_size = static_cast<int>(c.B);
  spec.window = c.window;
  spec.full_block = c.full_block;
  spec.block_rows = c.block_rows;
  spec.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool backward = c.block_rows == 0 || c.block_rows == c.B;

  // CPU twin
  std::vector<float> out(NB * nh * hd), lse(NB * nh), dq(q.size()), dkc(kc.size()), dvc(vc.size()),
      dkb(kb.size()), dvb(vb.size());
  auto v3 = [](std::vector<float>& x, int64_t a, int64_t b, int64_t d) { return cpu_view(x.data(), {a, b, d}); };
  Tensor an_h = cpu_view(anchors.data(), {N}), sb_h = cpu_view(seq_begin.data(), {N});
  ops::block_attention_forward(cpu, v3(out, NB, nh, hd), cpu_view(lse.data(), {NB, nh}), v3(q, NB, nh, hd),
                               v3(kc, T, nkv, hd), v3(vc, T, nkv, hd), v3(kb, NB, nkv, hd), v3(vb, NB, nkv, hd),
                               an_h, sb_h, spec);
  if (backward)
    ops::block_attention_backward(cpu, v3(dq, NB, nh, hd), v3(dkc, T, nkv, hd), v3(dvc, T, nkv, hd),
                                  v3(dkb, NB, nkv, hd), v3(dvb, NB, nkv, hd), v3(dout, NB, nh, hd),
                                  v3(out, NB, nh, hd), cpu_view(lse.data(), {NB, nh}), v3(q, NB, nh, hd),
                                  v3(kc, T, nkv, hd), v3(vc, T, nkv, hd), v3(kb, NB, nkv, hd), v3(vb, NB, nkv, hd),
                                  an_h, sb_h, spec);

  // CUDA (outputs poisoned with NaN)
  cuda::set_block_attention_score_budget(c.score_budget);
  cuda::set_block_attention_impl(impl);
  Buffer d_q = to_device(g, q, {NB, nh, hd}), d_kc = to_device(g, kc, {T, nkv, hd}),
         d_vc = to_device(g, vc, {T, nkv, hd}), d_kb = to_device(g, kb, {NB, nkv, hd}),
         d_vb = to_device(g, vb, {NB, nkv, hd}), d_dout = to_device(g, dout, {NB, nh, hd});
  Buffer d_out = to_device(g, {}, {NB, nh, hd}), d_dq = to_device(g, {}, {NB, nh, hd}),
         d_dkc = to_device(g, {}, {T, nkv, hd}), d_dvc = to_device(g, {}, {T, nkv, hd}),
         d_dkb = to_device(g, {}, {NB, nkv, hd}), d_dvb = to_device(g, {}, {NB, nkv, hd});
  Buffer d_lse(Device::CUDA, DType::F32, {NB, nh});
  Buffer d_an = test::to_device_i32(g, anchors), d_sb = test::to_device_i32(g, seq_begin);
  ops::block_attention_forward(g, d_out, d_lse, d_q, d_kc, d_vc, d_kb, d_vb, d_an, d_sb, spec);
  if (backward)
    ops::block_attention_backward(g, d_dq, d_dkc, d_dvc, d_dkb, d_dvb, d_dout, d_out, d_lse, d_q, d_kc, d_vc, d_kb,
                                  d_vb, d_an, d_sb, spec);
  synchronize(g);
  cuda::set_block_attention_score_budget(0);
  cuda::set_block_attention_impl(cuda::BlockAttentionImpl::Default);
  const bool fused = impl == cuda::BlockAttentionImpl::Fused && cuda::block_attention_fused_supported(nh, nkv, hd, c.B);
  const std::string what = std::string(fused ? "fused" : "chunked") + " N=" + std::to_string(N) + " nh=" + std::to_string(nh) + " nkv=" + std::to_string(nkv) + " hd=" +
                           std::to_string(hd) + " B=" + std::to_string(c.B) + " window=" + std::to_string(c.window) +
                           " budget=" + std::to_string(c.score_budget) + " block_rows=" + std::to_string(c.block_rows);
  EXPECT_LT(rel_err(to_host(g, d_out), out), test::tol::kOp) << "out " << what;
  EXPECT_LT(rel_err(to_host(g, d_lse), lse), test::tol::kF32Output) << "lse " << what;
  if (!backward) return;
  EXPECT_LT(rel_err(to_host(g, d_dq), dq), test::tol::kOp) << "dq " << what;
  EXPECT_LT(rel_err(to_host(g, d_dkc), dkc), test::tol::kOp) << "dk_ctx " << what;
  EXPECT_LT(rel_err(to_host(g, d_dvc), dvc), test::tol::kOp) << "dv_ctx " << what;
  EXPECT_LT(rel_err(to_host(g, d_dkb), dkb), test::tol::kOp) << "dk_blk " << what;
  EXPECT_LT(rel_err(to_host(g, d_dvb), dvb), test::tol::kOp) << "dv_blk " << what;
}

// Each case runs through both implementations: fused (where the shape allows; else chunked) and chunked.
void run_both(const AttnCase& c, uint32_t seed) {
  run_case(c, seed, cuda::BlockAttentionImpl::Fused);
  run_case(c, seed, cuda::BlockAttentionImpl::Chunked);
}

TEST(GpuDrafterAttention, FullAttentionGqa4) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(cuda::block_attention_fused_supported(8, 2, 64, 16));
  run_both({8, 2, 64, 16, 0, 0}, 11);
}
TEST(GpuDrafterAttention, FullAttentionManyChunks) {
  SKIP_WITHOUT_GPU();
  run_both({8, 2, 128, 16, 0, 8 * 16 * 40}, 12);
}
TEST(GpuDrafterAttention, SlidingWindowGqa3) {  // G·B = 24 rows: the fused CTA pads to 64
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(cuda::block_attention_fused_supported(6, 2, 64, 8));
  run_both({6, 2, 64, 8, 24, 0}, 13);
}
TEST(GpuDrafterAttention, SlidingWindowNoGqaManyChunks) {
  SKIP_WITHOUT_GPU();
  run_both({4, 4, 128, 16, 33, 4 * 16 * 30}, 14);
}
// Whether the device has the shared memory the fused head-dim-256 kernels need (the H100/H200's 227 KB per
// block; sm_120's 99 KB does not, and there the fused path must refuse the shape so the chunked path runs).
// (device_limits: DFLASH_DEVICE_LIMITS=sm_120 lowers it on an H100/H200 as well).
bool big_shared_memory() { return cuda::current_device_limits().smem_per_block_optin >= 200 * 1024; }
// Checks that the fused path takes (or, on a small-shared-memory device, refuses) the case, then runs both.
void run_both_hd256(const AttnCase& c, uint32_t seed) {
  EXPECT_EQ(cuda::block_attention_fused_supported(c.nh, c.nkv, c.hd, c.B), big_shared_memory())
      << c.nh << "/" << c.nkv << " heads of " << c.hd << ", B " << c.B;
  run_both(c, seed);
}

TEST(GpuDrafterAttention, HeadDim256Gqa6) {  // the Qwen3.6-27B head layout (24/4 heads of 256): G·B = 96 rows
  SKIP_WITHOUT_GPU();
  run_both_hd256({6, 1, 256, 16, 0, 0}, 15);
}
// Head dim 256 through the fused kernels (96-row CTAs, the paired dkv kernel) on many blocks and keys:
// G·B = 96 with B 16 (the 27B layout, full and sliding window, two kv heads), B 32 (the whole 32-key own
// tile of the dq kernel) and B 8 (G 12); G·B = 80 (a half-empty 32-row unit, one warp of padding rows) and 64
// (two warps of padding rows); a window shorter than one key tile.
TEST(GpuDrafterAttention, HeadDim256ManyBlocks) {
  SKIP_WITHOUT_GPU();
  const std::vector<AttnCase> cases = {
      {12, 2, 256, 16, 0, 0}, {12, 2, 256, 16, 100, 0}, {3, 1, 256, 32, 0, 0}, {12, 1, 256, 8, 40, 0},
      {10, 2, 256, 16, 0, 0}, {8, 2, 256, 16, 130, 0},  {6, 1, 256, 16, 20, 0},
  };
  uint32_t seed = 40;
  for (AttnCase c : cases) {
    c.lens = {300, 170, 260};
    c.per_seq = 25;
    run_both_hd256(c, seed++);
  }
}
TEST(GpuDrafterAttention, FusedRefusesShapesBeyondItsTiles) {
  SKIP_WITHOUT_GPU();
  EXPECT_FALSE(cuda::block_attention_fused_supported(8, 1, 256, 16));   // G·B = 128 > 96
  EXPECT_FALSE(cuda::block_attention_fused_supported(1, 1, 256, 64));   // B 64 > the 32-key own tile
  EXPECT_FALSE(cuda::block_attention_fused_supported(6, 1, 128, 16));   // G·B = 96 > 64 at head dim 128
  EXPECT_FALSE(cuda::block_attention_fused_supported(4, 1, 96, 16));    // head dim 96: no kernels
  EXPECT_FALSE(cuda::block_attention_fused_supported(6, 4, 256, 16));   // nh not a multiple of nkv
}
// The 8b drafter's head layout (32/8 x 128, B 16) scaled down to 4/1, with GQA ratios 1, 2, 4 and enough
// blocks (> 64 per split of the fused context-key kernel) and keys (several 64-key tiles per block).
TEST(GpuDrafterAttention, Hd128GqaRatios124ManyBlocks) {
  SKIP_WITHOUT_GPU();
  for (int64_t nkv : {4, 2, 1}) {
    AttnCase c{4, nkv, 128, 16, 0, 0};
    c.lens = {300, 170, 260};
    c.per_seq = 30;
    EXPECT_TRUE(cuda::block_attention_fused_supported(c.nh, c.nkv, c.hd, c.B));
    run_both(c, 20 + static_cast<uint32_t>(nkv));
  }
}
// Blocks over 32 keys at head dims 64 and 128 (G 1): the dq kernel's 64-key tiles (105 KB at head dim 128,
// fused only where the device holds them; elsewhere, as under sm_120 limits, the chunked path).
TEST(GpuDrafterAttention, NarrowBlocksOver32Keys) {
  SKIP_WITHOUT_GPU();
  for (AttnCase c : {AttnCase{2, 2, 128, 64, 0, 0}, AttnCase{2, 2, 64, 48, 0, 0}, AttnCase{2, 2, 128, 40, 50, 0}}) {
    c.lens = {300, 170, 260};
    c.per_seq = 10;
    EXPECT_EQ(cuda::block_attention_fused_supported(c.nh, c.nkv, c.hd, c.B), c.hd < 128 || big_shared_memory())
        << "hd " << c.hd << " B " << c.B;
    run_both(c, 60 + static_cast<uint32_t>(c.B));
  }
}
TEST(GpuDrafterAttention, Hd128SlidingWindowManyBlocks) {
  SKIP_WITHOUT_GPU();
  AttnCase c{8, 2, 128, 16, 100, 0};
  c.lens = {300, 170, 260};
  c.per_seq = 25;
  run_both(c, 30);
}
TEST(GpuDrafterAttention, TinyHeadDim16) {  // the golden case's drafter heads (4/2 x 16, B 4)
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(cuda::block_attention_fused_supported(4, 2, 16, 4));
  run_both({4, 2, 16, 4, 0, 0}, 31);
  run_both({4, 2, 32, 4, 7, 0}, 32);
}

}  // namespace
namespace {
// A sliding window with the whole block visible (a DFlash2 release's is_causal: false) on both CUDA paths:
// the chunked one (head dim 64) and the fused ones (head dims 128 and 256), against the CPU twin.
TEST(GpuDrafterAttention, SlidingWindowFullBlock) {
  SKIP_WITHOUT_GPU();
  const std::vector<AttnCase> cases = {{4, 2, 64, 8, 20, 0}, {8, 2, 128, 16, 100, 0}, {12, 2, 256, 8, 40, 0}};
  uint32_t seed = 70;
  for (AttnCase c : cases) {
    c.full_block = true;
    c.lens = {300, 170, 260};
    c.per_seq = 20;
    run_both(c, seed++);
  }
}
}  // namespace
namespace {
// Blocks shortened to their first block_rows rows (speculative decoding's last block), forward, on both CUDA
// paths: the fused narrow kernels (head dims 16 and 128), the fused wide one (head dim 256, G 6, B 16) and
// the chunked path (every case through run_both; one case with many chunks), full attention and a sliding
// window with the whole block visible, down to the anchor's row alone (block_rows 1).
TEST(GpuDrafterAttention, ShortBlocksForward) {
  SKIP_WITHOUT_GPU();
  std::vector<AttnCase> cases = {{4, 2, 16, 4, 0, 0}, {8, 2, 128, 16, 0, 0}, {24, 4, 256, 16, 0, 0},
                                 {4, 2, 64, 8, 0, 4096}, {8, 2, 128, 16, 100, 0}};
  const std::vector<int> rows = {2, 5, 9, 1, 7};
  cases[4].full_block = true;
  cases[4].lens = {300, 170, 260};
  cases[4].per_seq = 20;
  uint32_t seed = 90;
  for (size_t i = 0; i < cases.size(); ++i) {
    cases[i].block_rows = rows[i];
    run_both(cases[i], seed++);
  }
}
}  // namespace
}  // namespace dflash
