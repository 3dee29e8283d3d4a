// The gated delta rule, chunked as flash-linear-attention's chunk_gated_delta_rule (WY / UT transform), in
// two kernels on mma.sync (m16n8k16 bf16 -> fp32) with fp32 for the triangular solve and the state.
//
// The math (one sequence, one value head, chunks of C = 64 tokens; rows r, j index tokens of a chunk).
// q and k are never normalised in memory: the raw bf16 rows feed the tensor cores and the l2norm factors
//   rq_r = dk^-1/2 / sqrt(|q_r|^2 + 1e-6),   rk_r = 1 / sqrt(|k_r|^2 + 1e-6)
// are applied in fp32 to the products. With G = the inclusive cumsum of g inside the chunk (padding rows of
// a short last chunk get g = 0 and beta = 0, so G stays flat there and every padded row drops out), and S
// the state [dk, dv] at the chunk start, the recurrence S_t = e^{g_t} S_{t-1} + k_t (beta_t (v_t - e^{g_t}
// S_{t-1}^T k_t))^T unrolls to
//   A[r][j]  = beta_r e^{G_r - G_j} rk_r rk_j (k_r . k_j)   for j < r, else 0     (strictly lower)
//   X        = (I + A)^-1                                                          (unit lower)
//   R[r]     = beta_r (v_r - e^{G_r} rk_r (k_r^T S))                              (64 x dv)
//   v_new    = X R          (= u - w S of FLA, with u = X diag(beta) V, w = X diag(beta e^G) K)
//   out[r]   = e^{G_r} rq_r (q_r^T S) + sum_{j <= r} e^{G_r - G_j} rq_r rk_j (q_r . k_j) v_new[j]
//   S'       = e^{G_last} S + sum_j k_j (rk_j e^{G_last - G_j} v_new[j])^T
// Folding diag(beta) and the e^{G} K S term into R instead of precomputing w and u means the only per-chunk
// product that outlives the chunk-parallel kernel is X: 64 values per token and head (T * nv * 64 bf16 of
// workspace, 201 MB at T = 32768, nv = 48), instead of FLA's w and u (T * nv * (dk + dv), 805 MB), and the
// sequential kernel does one 64 x 64 x dv product (X R) in place of the 64 x dk x dv product w S.
//
// Kernel 1 (gdr_prepare, gated_delta_rule_prepare.cu) computes X of every chunk in parallel; kernel 2
// (gated_delta_rule_scan.cu, gdr_chunk_scan_pipelined or gdr_chunk_scan) runs the chunks of each sequence
// in order. What they share is in gated_delta_rule_common.cuh; this file checks the operands, picks the
// scan and launches the two.
//
// Measured on one H200 (tests/gpu/test_gated_delta_rule_gpu.cpp, GpuGatedDeltaRuleTiming; CUDA events, median
// of 20 after 3 warm-ups), Qwen3.6-27B heads (nk 16, dk 128, nv 48, dv 128), T = 32768, both kernels
// (2026-12-01, one call; bench/results/hybrid/gdr-pipelined/): the kernels before this pipelined scan and
// the 6-blocks-per-SM gdr_prepare -> now:
//   8 x 4096 tokens 3.04 -> 2.33 ms;  32 x 1024 tokens 3.09 -> 2.32 ms;  1 x 32768 tokens 6.09 -> 4.12 ms
//   (96 scan blocks on 132 SMs). Of that, the pipelined scan gave 3.04 -> 2.39 ms at 8 x 4096 and
//   gdr_prepare's occupancy (4 -> 6 blocks per SM) 2.39 -> 2.33. In the 27B forward (bench_hybrid_forward
//   --model 27b, 48 layers, same call): 190.3 -> 150.8 ms.
// 8 x 4096 and 32 x 1024 cost the same although their chunk chains differ 4x: the scan is limited by how
// fast each block gets through a chunk (latency), not by the chain length.
// Where the time goes, and what is next (the 1 x 32768 case, 96 blocks alone on their SMs, still takes
// 6-8 us per chunk, 4.12 ms less kernel 1 over 512 chunks, for ~320 MMAs on the slowest warp: with the
// loads in flight behind the compute, what is left is latency of dependent MMA chains, 3 barriers and
// 4 warps per block):
//   - both slices of a head recompute Q K^T (a fifth of the slowest warp's MMAs) and load Q, K, X:
//     precomputing the masked Q K^T in kernel 1 (another T * nv * 64 bf16) or one block per head with
//     8 warps would remove that;
//   - kernel 1's solve runs on CUDA cores with ~7 block barriers (6 blocks per SM hide some of it); the
//     value heads of one key head share K K^T (nv / nk = 3 of them here), so one block per (chunk, key
//     head) would compute it once (its split of the 2.33 ms is not measured: no profiler on the machine).
#include "gated_delta_rule.cuh"

#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"
#include "gated_delta_rule_common.cuh"

namespace dflash::cuda {

namespace {

// -1: not chosen yet (DFLASH_GDR_SCAN decides at the first call), else a GdrScan.
int g_scan_choice = -1;

GdrScan scan_choice() {
  if (g_scan_choice < 0) {
    const char* e = std::getenv("DFLASH_GDR_SCAN");
    g_scan_choice = static_cast<int>(e && std::strcmp(e, "sync") == 0 ? GdrScan::kSync : GdrScan::kAuto);
  }
  return static_cast<GdrScan>(g_scan_choice);
}

template <int P>
void launch(const Ctx& ctx, int device, const Tensor& out, const Tensor& state, const Tensor& qkv, const Tensor& g,
            const Tensor& beta, const Tensor& cu_seqlens, const Tensor& workspace, const ops::GdnHeads& hd, int nseq) {
  constexpr size_t kScan = gdr::SyncSmem<P>::kBytes, kPipe = gdr::PipeSmem<P>::kBytes;
  const size_t smem = gdr::max_smem_per_block(device);
  DF_CHECK(smem >= kScan, Internal,
           "gated_delta_rule_forward: the device offers " << smem << " B of shared memory per block, " << kScan
                                                          << " needed");
  const bool pipelined = smem >= kPipe && scan_choice() == GdrScan::kAuto;
  gdr::Args a;
  a.out = static_cast<__nv_bfloat16*>(out.data);
  a.state = static_cast<float*>(state.data);
  a.qkv = static_cast<const __nv_bfloat16*>(qkv.data);
  a.xw = static_cast<__nv_bfloat16*>(workspace.data);
  a.g = g.data;
  a.beta = beta.data;
  a.g_bf16 = g.dtype == DType::BF16;
  a.b_bf16 = beta.dtype == DType::BF16;
  a.cu = static_cast<const int32_t*>(cu_seqlens.data);
  a.nseq = nseq;
  a.nk = static_cast<int>(hd.nk);
  a.dk = static_cast<int>(hd.dk);
  a.nv = static_cast<int>(hd.nv);
  a.dv = static_cast<int>(hd.dv);
  a.T = qkv.size(0);
  a.row = qkv.size(1);
  cudaStream_t st = stream_of(ctx);
  gdr::launch_prepare<P>(a, device, st);
  gdr::launch_chunk_scan<P>(a, device, pipelined, st);
}

}  // namespace

void set_gated_delta_rule_scan(GdrScan scan) { g_scan_choice = static_cast<int>(scan); }

bool gated_delta_rule_scan_is_pipelined(const Ctx& ctx, ops::GdnHeads hd) {
  const int device = backend_of(ctx).device;
  const size_t need = hd.dk <= 64 && hd.dv <= 64 ? gdr::PipeSmem<64>::kBytes : gdr::PipeSmem<128>::kBytes;
  return scan_choice() == GdrScan::kAuto && gdr::max_smem_per_block(device) >= need;
}

void gated_delta_rule_forward(const Ctx& ctx, const Tensor& out, const Tensor& state, const Tensor& qkv,
                              const Tensor& g, const Tensor& beta, const Tensor& cu_seqlens, ops::GdnHeads hd,
                              const Tensor& workspace) {
  constexpr const char* op = "gated_delta_rule_forward";
  const int device = backend_of(ctx).device;
  DF_CHECK(qkv.dtype == DType::BF16 && out.dtype == DType::BF16 && state.dtype == DType::F32, Internal,
           op << ": CUDA needs qkv and out BF16 and state F32, got " << dtype_name(qkv.dtype) << ", "
              << dtype_name(out.dtype) << ", " << dtype_name(state.dtype));
  DF_CHECK((g.dtype == DType::F32 || g.dtype == DType::BF16) && (beta.dtype == DType::F32 || beta.dtype == DType::BF16),
           Internal, op << ": g and beta must be F32 or BF16 on CUDA, got " << dtype_name(g.dtype) << ", "
                        << dtype_name(beta.dtype));
  DF_CHECK(hd.dk % 8 == 0 && hd.dv % 8 == 0 && hd.dk <= 128 && hd.dv <= 128, Internal,
           op << ": the CUDA kernels take head dims that are multiples of 8 up to 128, got dk=" << hd.dk
              << " dv=" << hd.dv);
  DF_CHECK(cu_seqlens.dtype == DType::I32 && cu_seqlens.device == Device::CUDA && cu_seqlens.ndim == 1 &&
               cu_seqlens.shape[0] >= 1,
           Internal, op << ": cu_seqlens must be an I32 vector in device memory on CUDA, got " << cu_seqlens.shape_str());
  const int64_t T = qkv.size(0);
  const int64_t need = ops::gated_delta_rule_workspace_elems(T, hd);
  DF_CHECK(!workspace.empty() && workspace.device == Device::CUDA && workspace.dtype == DType::BF16 &&
               static_cast<int64_t>(workspace.numel()) >= need,
           Internal, op << ": CUDA needs a BF16 device workspace of at least " << need << " elements (T=" << T << ", nv="
                        << hd.nv << "; ops::gated_delta_rule_workspace_elems), got " << workspace.shape_str() << " "
                        << dtype_name(workspace.dtype));
  DF_CHECK(aligned16(qkv.data) && aligned16(out.data) && aligned16(workspace.data), Internal,
           op << ": qkv, out and workspace must be 16-byte aligned");
  DF_CHECK(T < (int64_t(1) << 31) && hd.nv * 2 < 65536, Internal, op << ": T=" << T << " nv=" << hd.nv << " too large");
  const int nseq = static_cast<int>(cu_seqlens.shape[0]) - 1;
  if (nseq <= 0) return;  // nothing to run and no last sequence (T = 0)
  if (hd.dk <= 64 && hd.dv <= 64) {
    launch<64>(ctx, device, out, state, qkv, g, beta, cu_seqlens, workspace, hd, nseq);
  } else {
    launch<128>(ctx, device, out, state, qkv, g, beta, cu_seqlens, workspace, hd, nseq);
  }
}

}  // namespace dflash::cuda
