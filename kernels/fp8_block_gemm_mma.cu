// The block-scaled FP8 GEMM on mma.sync (fp8_block_gemm_mma.cuh says what and why).
//
// One block: a 128 (tokens) x 128 (outputs) tile of out, 16 warps as 4 x 4, each warp 32 x 32 (2 m16 x 4 n8
// mma tiles: 32 accumulators and 32 partial sums per thread, so nothing spills at 128 registers). The K loop walks the scale blocks: stage kb holds act_codes [128 rows, 128 bytes] and w_codes
// [128 rows, 128 bytes] in shared memory (cp.async, two stages: kb + 1 loads while kb computes). Within a
// stage four k32 steps accumulate a partial sum p (fp32, zeroed per stage); then acc += p * sa[row] * sw[col]
// with the two scales of that block. Rows of 128 bytes are 8 chunks of 16; a chunk c of row r is stored at
// c ^ (r & 7), so ldmatrix's 8 row addresses of one matrix fall in 8 different bank groups.
//
// Shared memory: 2 stages x 2 operands x 16 KB = 64 KB (fits sm_120's 99 KB per block; fit_launch raises the
// attribute above 48 KB). Out-of-range rows (N, O not multiples of 128) load zeros (cp.async src-size 0) and
// are not stored; K must be a multiple of 128 (the format's blocks).
#include "fp8_block_gemm_mma.cuh"

#include <cuda_bf16.h>

#include <cstdint>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "device_limits.cuh"
#include "dflash/error.h"
#include "mma_ptx.cuh"

namespace dflash::cuda {
namespace {

using namespace ptx;

constexpr int kBM = 128, kBN = 128, kBK = 128;  // kBK: one scale block
constexpr int kThreads = 512;
constexpr int kMT = 2, kNT = 4;  // a warp's m16 and n8 tiles
constexpr int kTileBytes = kBM * kBK;  // = kBN * kBK: one operand's stage
constexpr int kSmem = 4 * kTileBytes;  // 2 stages x (A, B)
static_assert(kBM == kBN, "the loader shares one row count for both operands");
static_assert(kSmem <= 99 * 1024, "shared memory must fit sm_120's 99 KB per block");

// The byte offset of 16-byte chunk c of row r in a swizzled [128 rows, 128 bytes] tile.
__device__ __forceinline__ uint32_t swz(int r, int c) { return static_cast<uint32_t>(r * kBK + ((c ^ (r & 7)) << 4)); }

// One stage: rows [row0, row0 + 128) x bytes [k0, k0 + 128) of a [rows, K] code matrix into tile (2 chunks per
// thread); rows past `rows` are zero-filled.
__device__ __forceinline__ void load_tile(uint32_t tile, const uint8_t* codes, int64_t rows, int64_t K, int64_t row0,
                                          int64_t k0, int tid) {
#pragma unroll
  for (int i = 0; i < kBM * kBK / 16 / kThreads; ++i) {
    const int idx = tid + i * kThreads, r = idx >> 3, c = idx & 7;
    const bool ok = row0 + r < rows;
    const uint8_t* src = ok ? codes + (row0 + r) * K + k0 + c * 16 : codes;
    cp_async16(tile + swz(r, c), src, ok ? 16 : 0);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    fp8_block_gemm_mma_kernel(__nv_bfloat16* out, const __nv_bfloat16* c_in,  // c_in may be out
                              const uint8_t* __restrict__ a_codes, const float* __restrict__ a_scales,
                              const uint8_t* __restrict__ w_codes, const float* __restrict__ w_scales, int64_t N,
                              int64_t K, int64_t O) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;  // the warp's 32-row, 32-column piece of the tile
  const int g = lane >> 2, tig = lane & 3;   // the mma fragments' group and thread-in-group
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kBM, o0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const uint32_t s0 = smem_addr(smem);
  const uint32_t sa[2] = {s0, s0 + kTileBytes}, sb[2] = {s0 + 2 * kTileBytes, s0 + 3 * kTileBytes};
  const int KB = static_cast<int>(K / kBK);

  float acc[kMT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;

  load_tile(sa[0], a_codes, N, K, n0, 0, tid);
  load_tile(sb[0], w_codes, O, K, o0, 0, tid);
  cp_async_commit();

  for (int kb = 0; kb < KB; ++kb) {
    // This block's scales for the thread's rows (kMT m-tiles x rows g, g + 8) and columns (kNT n-tiles x 2),
    // read before the wait so their latency hides behind it. Out-of-range ones are 0 (never stored anyway).
    float sx[kMT][2], sw[kNT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = n0 + wm * 32 + mt * 16 + g + 8 * h;
        sx[mt][h] = r < N ? __ldg(a_scales + kb * N + r) : 0.f;
      }
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int64_t c = o0 + wn * 32 + nt * 8 + tig * 2 + j;
        sw[nt][j] = c < O ? __ldg(w_scales + kb * O + c) : 0.f;
      }
    if (kb + 1 < KB) {
      load_tile(sa[(kb + 1) & 1], a_codes, N, K, n0, int64_t(kb + 1) * kBK, tid);
      load_tile(sb[(kb + 1) & 1], w_codes, O, K, o0, int64_t(kb + 1) * kBK, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const uint32_t ta = sa[kb & 1], tb = sb[kb & 1];
    float p[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) p[mt][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks) {
      // B: two x4 loads, each two n8 tiles x both 16-byte halves of the k32 step.
      uint32_t b[kNT][2];
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        const int r = wn * 32 + np * 16 + (lane & 7) + 8 * (lane >> 4), c = ks * 2 + ((lane >> 3) & 1);
        uint32_t x[4];
        ldmatrix_x4(x, tb + swz(r, c));
        b[2 * np][0] = x[0];
        b[2 * np][1] = x[1];
        b[2 * np + 1][0] = x[2];
        b[2 * np + 1][1] = x[3];
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const int r = wm * 32 + mt * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), c = ks * 2 + (lane >> 4);
        uint32_t a[4];
        ldmatrix_x4(a, ta + swz(r, c));
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mma_e4m3(p[mt][nt], a, b[nt][0], b[nt][1]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        acc[mt][nt][0] += p[mt][nt][0] * (sx[mt][0] * sw[nt][0]);
        acc[mt][nt][1] += p[mt][nt][1] * (sx[mt][0] * sw[nt][1]);
        acc[mt][nt][2] += p[mt][nt][2] * (sx[mt][1] * sw[nt][0]);
        acc[mt][nt][3] += p[mt][nt][3] * (sx[mt][1] * sw[nt][1]);
      }
    __syncthreads();  // the next iteration loads into the stage just read
  }

  // out = (C) + acc, rounded once to bf16; pairs of columns where O is even (4-byte aligned), else one by one.
  const bool pairs = (O & 1) == 0;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = n0 + wm * 32 + mt * 16 + g + 8 * h;
      if (r >= N) continue;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int64_t c = o0 + wn * 32 + nt * 8 + tig * 2;
        float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
        if (pairs && c + 1 < O) {
          if (c_in) {
            const float2 old = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(c_in + r * O + c));
            v0 += old.x;
            v1 += old.y;
          }
          *reinterpret_cast<__nv_bfloat162*>(out + r * O + c) = __floats2bfloat162_rn(v0, v1);
        } else {
          if (c < O) out[r * O + c] = __float2bfloat16_rn(v0 + (c_in ? __bfloat162float(c_in[r * O + c]) : 0.f));
          if (c + 1 < O)
            out[r * O + c + 1] = __float2bfloat16_rn(v1 + (c_in ? __bfloat162float(c_in[r * O + c + 1]) : 0.f));
        }
      }
    }
}

}  // namespace

size_t fp8_block_gemm_mma_smem_bytes() { return kSmem; }

void fp8_block_gemm_mma(const Ctx& ctx, const Tensor& out, const Tensor& act_codes, const Tensor& act_scales,
                        const Tensor& w_codes, const Tensor& w_scales, ops::Accumulate acc, const Tensor& residual) {
  const int64_t N = act_codes.size(0), K = act_codes.size(1), O = w_codes.size(0);
  DF_CHECK(out.dtype == DType::BF16 && act_codes.dtype == DType::F8E4M3 && w_codes.dtype == DType::F8E4M3 &&
               act_scales.dtype == DType::F32 && w_scales.dtype == DType::F32,
           Internal, "fp8_block_gemm_mma: out BF16, codes F8E4M3, scales F32");
  DF_CHECK(K % kBK == 0 && w_codes.size(1) == K && out.size(0) == N && out.size(1) == O &&
               act_scales.numel() == (K / kBK) * N && w_scales.numel() == (K / kBK) * O,
           Internal,
           "fp8_block_gemm_mma: shapes N " << N << " K " << K << " O " << O << " (K % 128 == 0, scales [K/128, rows])");
  DF_CHECK(reinterpret_cast<uintptr_t>(act_codes.data) % 16 == 0 && reinterpret_cast<uintptr_t>(w_codes.data) % 16 == 0,
           Internal, "fp8_block_gemm_mma: the code matrices must be 16-byte aligned");
  DF_CHECK(residual.empty() || (acc == ops::Accumulate::No && residual.dtype == DType::BF16 && residual.numel() == N * O),
           Internal, "fp8_block_gemm_mma: a residual is [N, O] BF16 and excludes Accumulate::Yes");
  const DeviceLimits& lim = device_limits(backend_of(ctx).device);
  DF_CHECK_HINT(lim.cc_major * 10 + lim.cc_minor >= 89, DeviceFailure,
                "fp8_block_gemm_mma: FP8 mma needs compute capability 8.9 or later",
                "unset DFLASH_FP8_BLOCK_GEMM: FP8 targets run their linears dequantized on this GPU (docs/fp8.md)");
  if (N == 0 || O == 0) return;
  const __nv_bfloat16* c_in = acc == ops::Accumulate::Yes ? static_cast<const __nv_bfloat16*>(out.data)
                              : residual.empty()          ? nullptr
                                                          : static_cast<const __nv_bfloat16*>(residual.data);
  const int device = backend_of(ctx).device;
  fit_launch(fp8_block_gemm_mma_kernel, "fp8_block_gemm_mma_kernel", kThreads, kSmem, device);
  const dim3 grid(static_cast<unsigned>((O + kBN - 1) / kBN), static_cast<unsigned>((N + kBM - 1) / kBM));
  DF_CHECK(grid.y <= 65535u, Internal, "fp8_block_gemm_mma: " << N << " rows exceed the grid");
  fp8_block_gemm_mma_kernel<<<grid, kThreads, kSmem, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(out.data), c_in, static_cast<const uint8_t*>(act_codes.data),
      static_cast<const float*>(act_scales.data), static_cast<const uint8_t*>(w_codes.data),
      static_cast<const float*>(w_scales.data), N, K, O);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
