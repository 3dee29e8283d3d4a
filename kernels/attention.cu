// FlashAttention-2 forward on mma.sync (m16n8k16 bf16 -> fp32), for packed varlen causal GQA.
//
// One kernel, templated on the tiling (see attention.cuh for the variants). A block holds the query tile
// of one head of one sequence; each warp owns 16 * kMI query rows, so every K/V fragment it reads from
// shared memory feeds 2 * kMI MMAs. K/V tiles are double-buffered with cp.async. Shared memory rows are
// kD bf16 (the padded head dim: 128 or 256) with 16-byte chunks XOR-swizzled by (row & 7), so ldmatrix
// reads of 8 rows hit 8 different bank groups. Smaller head dims are zero-padded in shared memory (the
// golden tiny model has hd = 24); Qwen3 models use 128, the Qwen3.5/3.6 full-attention layers 256.
//
// Why kMI = 1 at hd 256: the output accumulator of a warp is 16 * kMI rows x kD fp32, i.e. 64 * kMI * kD / 128
// registers per thread: 128 at (kMI 2, kD 128) and at (kMI 1, kD 256), 256 (a spill) at (2, 256). With one
// m16 tile per warp a K/V fragment feeds 2 MMAs instead of 4, so the hd-256 kernels are bounded by shared
// memory reads sooner; 8 warps per block share each K/V tile to halve the global traffic per query row.
#include "attention.cuh"

#include "attention_cudnn.cuh"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "device_limits.cuh"
#include "mma_ptx.cuh"

namespace dflash::cuda {
namespace {
using namespace ptx;  // the shared PTX wrappers (mma_ptx.cuh)

// The tiling: kD is the padded head dim held in shared memory and registers; each of kWarps warps owns kMI
// m16 tiles of query rows (kBlockQ = kWarps x 16 kMI rows) and K/V stream through shared memory kKV rows
// at a time, double-buffered.
//   hd 128: <128, 4, 2, 64>: 128 x 64, 255 registers, 2 blocks (8 warps) per SM; every K/V fragment feeds
//           2 MMAs. Measured on an H200 against <128, 4, 1, 32> (64 x 32, 4 blocks = 16 warps per SM,
//           twice the shared-memory reads per MMA): 84 ms vs 108 ms of attention per Qwen3-8B forward
//           (bench/results/h200-run4-bench.txt), so the narrow variant was dropped.
//   hd 256: <256, 8, 1, 64> where the device holds 193 KB per block (sm_90, sm_100: 8 warps per SM, each
//           K/V tile shared by 8 warps), else <256, 4, 1, 32> (97 KB, two blocks per SM). Measured on an H200
//           at 8 x 4096 tokens, 24/4 heads: 6.28 ms vs 7.23 ms; <256, 8, 1, 32> (129 KB, one block per SM)
//           took 7.48 ms and was dropped (bench/results/h200-attention-hd256.txt).
template <int kD_, int kWarps_, int kMI_, int kKV_, int kBlocksPerSM_> struct Tiling {
  static constexpr int kD = kD_, kWarps = kWarps_, kMI = kMI_, kKV = kKV_, kBlocksPerSM = kBlocksPerSM_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunks = kD / 8;     // 16-byte chunks per row
  static constexpr int kRowBytes = kD * 2;   // a tile row
  static constexpr int kBlockQ = kWarps * 16 * kMI, kWarpRows = 16 * kMI;
  static constexpr uint32_t kKVTileBytes = kKV * kRowBytes;
  // Q tile + double-buffered K and V tiles, plus slack to align the base to 1 KiB: the swizzled
  // addresses below are formed with XOR on their low bits, which needs every tile on such a boundary.
  static constexpr size_t kSmemBytes = size_t(kRowBytes) * (kBlockQ + 4 * kKV) + 1024;
  // The lane addresses XOR chunk-pair offsets (< kRowBytes) into row addresses: rows must be 256 or 512 B.
  static_assert(kD == 128 || kD == 256, "padded head dim");
  static_assert(kKV % 16 == 0 && kThreads % 32 == 0, "tile shape");
};
using Hd128Tiling = Tiling<128, 4, 2, 64, 2>;
using Hd256Tiling = Tiling<256, 8, 1, 64, 1>;       // 193 KB
using Hd256SmallTiling = Tiling<256, 4, 1, 32, 2>;  // 97 KB
static_assert(Hd128Tiling::kSmemBytes <= 99 * 1024 && Hd256SmallTiling::kSmemBytes <= 99 * 1024,
              "the fallbacks must fit sm_120's 99 KB per block");

// Element offset of 16-byte chunk c of row r in a swizzled [rows][kD] tile.
template <int kD> __device__ __forceinline__ int swz(int r, int c) { return r * kD + ((c ^ (r & 7)) << 3); }

// 2^x in one MUFU.EX2 (flushing denormal results, which a softmax weight can lose); 2^-inf = +0.
// exp2f / non-ftz ex2 add a range fix-up of ~4 instructions per call; the ftz form makes ptxas spill a
// few bytes here but measured 2-3% faster on the whole attention (bench/results/h200-run4-bench.txt).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Copies rows [0, kRows) of a [rows][hd] slice (global row stride `stride` elements) into the swizzled
// tile at shared address `tile`; rows >= valid_rows and chunks beyond hd are zero-filled. A step of the
// threads covers kThreads / kChunks whole rows (8 at hd 128 and at hd 256 with 8 warps), so a thread's
// chunk never changes.
template <class Tl, int kRows>
__device__ __forceinline__ void load_tile(uint32_t tile, const __nv_bfloat16* src, int64_t stride, int valid_rows,
                                          int hd) {
  constexpr int kChunks = Tl::kChunks;
  for (int i = threadIdx.x; i < kRows * kChunks; i += Tl::kThreads) {
    int r = i / kChunks, c = i % kChunks;
    bool ok = r < valid_rows && c * 8 < hd;
    const __nv_bfloat16* g = ok ? src + r * stride + c * 8 : src;
    cp_async16(tile + 2 * swz<Tl::kD>(r, c), g, ok ? 16 : 0);
  }
}

// Finds which (sequence, query tile) block `tile_id` works on. Tiles of a sequence are numbered heaviest
// (last) first so long causal rows start early. Returns false when tile_id is past the last tile.
// Warp 0 scans cu_seqlens 32 sequences at a time with a warp prefix sum.
template <int kBlockQ>
__device__ bool find_tile(const int32_t* cu_seqlens, int nseq, int tile_id, int& seq_begin, int& seq_len,
                          int& q_tile) {
  __shared__ int found[3];
  if (threadIdx.x < 32) {
    int lane = threadIdx.x;
    int base = 0;  // tiles before this chunk of sequences
    if (lane == 0) found[0] = -1;
    for (int s0 = 0; s0 < nseq; s0 += 32) {
      int s = s0 + lane;
      int b = 0, len = 0;
      if (s < nseq) {
        b = cu_seqlens[s];
        len = cu_seqlens[s + 1] - b;
      }
      int tiles = (len + kBlockQ - 1) / kBlockQ;
      int incl = tiles;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        int n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
      }
      int excl = incl - tiles;
      if (tile_id >= base + excl && tile_id < base + incl) {
        found[0] = b;
        found[1] = len;
        found[2] = tiles - 1 - (tile_id - base - excl);
      }
      base += __shfl_sync(0xffffffffu, incl, 31);
      if (__any_sync(0xffffffffu, tile_id < base)) break;
    }
  }
  __syncthreads();
  seq_begin = found[0];
  seq_len = found[1];
  q_tile = found[2];
  return seq_begin >= 0;
}

template <class Tl>
__global__ void __launch_bounds__(Tl::kThreads, Tl::kBlocksPerSM)
    flash_attention_kernel(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ q,
                           const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                           const int32_t* __restrict__ cu_seqlens, int nseq, int nh, int nkv, int hd,
                           float scale_log2) {
  constexpr int kMI = Tl::kMI, kBlockKV = Tl::kKV, kBlockQ = Tl::kBlockQ, kWarpRows = Tl::kWarpRows;
  constexpr int kHeadDim = Tl::kD, kChunks = Tl::kChunks, kRowBytes = Tl::kRowBytes;
  constexpr uint32_t kKVTileBytes = Tl::kKVTileBytes;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw + (base - raw));  // [kBlockQ][kHeadDim]
  const uint32_t sQ_addr = base;
  const uint32_t sK_addr = sQ_addr + kBlockQ * kRowBytes;  // [2][kBlockKV][kHeadDim]
  const uint32_t sV_addr = sK_addr + 2 * kKVTileBytes;     // [2][kBlockKV][kHeadDim]

  int seq_begin, seq_len, q_tile;
  if (!find_tile<kBlockQ>(cu_seqlens, nseq, blockIdx.y, seq_begin, seq_len, q_tile)) return;
  const int head = blockIdx.x, kv_head = head / (nh / nkv);
  const int q0 = q_tile * kBlockQ;  // first query row of the block, within the sequence
  const int64_t q_stride = int64_t(nh) * hd, kv_stride = int64_t(nkv) * hd;
  const __nv_bfloat16* q_src = q + (int64_t(seq_begin) + q0) * q_stride + int64_t(head) * hd;
  const __nv_bfloat16* k_src = k + int64_t(seq_begin) * kv_stride + int64_t(kv_head) * hd;
  const __nv_bfloat16* v_src = v + int64_t(seq_begin) * kv_stride + int64_t(kv_head) * hd;

  const int q_rows = min(kBlockQ, seq_len - q0);
  const int kv_end = q0 + q_rows;  // causal: keys [0, kv_end) are enough for every row of the block
  const int n_tiles = (kv_end + kBlockKV - 1) / kBlockKV;

  load_tile<Tl, kBlockQ>(sQ_addr, q_src, q_stride, q_rows, hd);
  load_tile<Tl, kBlockKV>(sK_addr, k_src, kv_stride, min(kBlockKV, kv_end), hd);
  load_tile<Tl, kBlockKV>(sV_addr, v_src, kv_stride, min(kBlockKV, kv_end), hd);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int warp_row0 = q0 + warp * kWarpRows;  // first row (within the sequence) of this warp
  // Each lane's ldmatrix row address at k-chunk 0; chunk pair kk (or n-tile pair np) is then `^ 32 * kk`
  // (the swizzle key, row & 7, is lane & 7 for every fragment) and 16-row steps are `+ 16 * kRowBytes`.
  const uint32_t q_lane = sQ_addr + (warp * kWarpRows + (lane & 15)) * kRowBytes + (((lane >> 4) ^ (lane & 7)) << 4);
  const uint32_t k_lane = ((lane & 7) + ((lane >> 4) << 3)) * kRowBytes + ((((lane >> 3) & 1) ^ (lane & 7)) << 4);
  const uint32_t v_lane = ((lane & 7) + (((lane >> 3) & 1) << 3)) * kRowBytes + (((lane >> 4) ^ (lane & 7)) << 4);

  float o[kMI][kHeadDim / 8][4];
  float m[kMI][2], l[kMI][2];
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) {
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][n][e] = 0.f;
    m[mi][0] = m[mi][1] = -INFINITY;
    l[mi][0] = l[mi][1] = 0.f;
  }

  for (int j = 0; j < n_tiles; ++j) {
    const int buf = j & 1;
    if (j + 1 < n_tiles) {
      int kv0 = (j + 1) * kBlockKV;
      load_tile<Tl, kBlockKV>(sK_addr + (buf ^ 1) * kKVTileBytes, k_src + kv0 * kv_stride, kv_stride,
                          min(kBlockKV, kv_end - kv0), hd);
      load_tile<Tl, kBlockKV>(sV_addr + (buf ^ 1) * kKVTileBytes, v_src + kv0 * kv_stride, kv_stride,
                          min(kBlockKV, kv_end - kv0), hd);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const int kv0 = j * kBlockKV;
    // Tiles entirely right of this warp's last row are fully masked for it: skip the math.
    if (kv0 <= warp_row0 + kWarpRows - 1) {
      const uint32_t tK = sK_addr + buf * kKVTileBytes + k_lane, tV = sV_addr + buf * kKVTileBytes + v_lane;

      // S = Q K^T for kWarpRows rows x kBlockKV keys.
      float s[kMI][kBlockKV / 8][4];
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int n = 0; n < kBlockKV / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mi][n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t a[kMI][4];
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi) ldmatrix_x4(a[mi], (q_lane ^ (kk * 32)) + mi * 16 * kRowBytes);
#pragma unroll
        for (int np = 0; np < kBlockKV / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, (tK ^ (kk * 32)) + np * 16 * kRowBytes);
#pragma unroll
          for (int mi = 0; mi < kMI; ++mi) {
            mma_bf16(s[mi][2 * np], a[mi], b[0], b[1]);
            mma_bf16(s[mi][2 * np + 1], a[mi], b[2], b[3]);
          }
        }
      }

      // Online softmax in the log2 domain; the causal mask only where the tile crosses the diagonal.
      // Instruction count is what limits this loop next to the MMAs, hence the max over raw scores (scale
      // > 0 keeps the order), the scale folded into one FFMA per score, ex2.approx, and an O rescale
      // only when some row's max moved.
      const bool needs_mask = kv0 + kBlockKV - 1 > warp_row0;
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = warp_row0 + mi * 16 + g + h * 8;
          float mx = -INFINITY;
#pragma unroll
          for (int n = 0; n < kBlockKV / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              if (needs_mask && kv0 + n * 8 + 2 * t + e > row) s[mi][n][h * 2 + e] = -INFINITY;
              mx = fmaxf(mx, s[mi][n][h * 2 + e]);
            }
          }
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m[mi][h], mx * scale_log2);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;
          const float alpha = fast_exp2(m[mi][h] - m_use);
          m[mi][h] = m_new;
          float sum = 0.f;
#pragma unroll
          for (int n = 0; n < kBlockKV / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float p = fast_exp2(fmaf(s[mi][n][h * 2 + e], scale_log2, -m_use));
              s[mi][n][h * 2 + e] = p;
              sum += p;
            }
          }
          l[mi][h] = l[mi][h] * alpha + sum;
          if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
            for (int n = 0; n < kHeadDim / 8; ++n) {
              o[mi][n][h * 2] *= alpha;
              o[mi][n][h * 2 + 1] *= alpha;
            }
          }
        }
      }

      // O += P V: P's accumulator layout is the A-operand layout of the next MMA.
#pragma unroll
      for (int kc = 0; kc < kBlockKV / 16; ++kc) {
        uint32_t a[kMI][4];
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi) {
          a[mi][0] = pack_bf16(s[mi][2 * kc][0], s[mi][2 * kc][1]);
          a[mi][1] = pack_bf16(s[mi][2 * kc][2], s[mi][2 * kc][3]);
          a[mi][2] = pack_bf16(s[mi][2 * kc + 1][0], s[mi][2 * kc + 1][1]);
          a[mi][3] = pack_bf16(s[mi][2 * kc + 1][2], s[mi][2 * kc + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < kHeadDim / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, (tV ^ (np * 32)) + kc * 16 * kRowBytes);
#pragma unroll
          for (int mi = 0; mi < kMI; ++mi) {
            mma_bf16(o[mi][2 * np], a[mi], b[0], b[1]);
            mma_bf16(o[mi][2 * np + 1], a[mi], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // the buffer read here is refilled by the next iteration's prefetch
  }

  // Normalize, stage this warp's rows in its own slice of sQ, then write 16-byte chunks.
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[mi][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const int r = warp * kWarpRows + mi * 16 + g + h * 8;
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
        __nv_bfloat162 val = __floats2bfloat162_rn(o[mi][n][h * 2] * inv, o[mi][n][h * 2 + 1] * inv);
        *reinterpret_cast<__nv_bfloat162*>(sQ + swz<kHeadDim>(r, n) + 2 * t) = val;
      }
    }
  }
  __syncwarp();
  __nv_bfloat16* o_dst = out + (int64_t(seq_begin) + q0) * q_stride + int64_t(head) * hd;
  for (int i = lane; i < kWarpRows * kChunks; i += 32) {
    int r = warp * kWarpRows + i / kChunks, c = i % kChunks;
    if (r < q_rows && c * 8 < hd)
      *reinterpret_cast<uint4*>(o_dst + r * q_stride + c * 8) = *reinterpret_cast<const uint4*>(sQ + swz<kHeadDim>(r, c));
  }
}

// The device's opt-in shared memory per block (227 KB on sm_90 and sm_100, 99 KB on sm_120).
size_t max_smem_per_block(int device) { return device_limits(device).smem_per_block_optin; }

size_t smem_bytes(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::Hd128: return Hd128Tiling::kSmemBytes;
    case AttentionKernel::Hd256: return Hd256Tiling::kSmemBytes;
    case AttentionKernel::Hd256Small: return Hd256SmallTiling::kSmemBytes;
    case AttentionKernel::Cudnn: return 0;  // cuDNN checks its own limits
    case AttentionKernel::Auto: break;
  }
  DF_FAIL(Internal, "attention: no tiling for kernel " << static_cast<int>(kernel), "");
}

int padded_head_dim(AttentionKernel kernel) { return kernel == AttentionKernel::Hd128 ? 128 : 256; }

// DFLASH_ATTENTION: "own" (Auto never tries cuDNN), "cudnn" (a shape cuDNN refuses is fatal), else auto.
enum class CudnnPolicy { Prefer, Never, Require };
CudnnPolicy cudnn_policy() {
  static const CudnnPolicy policy = [] {
    const char* e = std::getenv("DFLASH_ATTENTION");
    const std::string v = e ? e : "";
    if (v == "own") return CudnnPolicy::Never;
    if (v == "cudnn") return CudnnPolicy::Require;
    DF_CHECK_HINT(v.empty() || v == "auto", BadOptions, "DFLASH_ATTENTION=" << v << " is not auto, own or cudnn",
                  "unset it, or set auto|own|cudnn");
    return CudnnPolicy::Prefer;
  }();
  return policy;
}

template <class Tl>
void launch(const Ctx& ctx, int device, const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
            const Tensor& cu_seqlens, int nseq, int nh, int nkv, int hd, float scale) {
  const int64_t T = q.size(0);
  // Every sequence adds at most one partial tile to the T / kBlockQ full ones.
  const int64_t max_tiles = T / Tl::kBlockQ + nseq;
  DF_CHECK(max_tiles < 65536 && nh < 65536, Internal, "attention: grid too large (T=" << T << ", nseq=" << nseq << ")");
  fit_launch(flash_attention_kernel<Tl>, "flash_attention_kernel", Tl::kThreads, Tl::kSmemBytes, device);
  dim3 grid(static_cast<unsigned>(nh), static_cast<unsigned>(max_tiles));
  flash_attention_kernel<Tl><<<grid, Tl::kThreads, Tl::kSmemBytes, stream_of(ctx)>>>(
      static_cast<__nv_bfloat16*>(out.data), static_cast<const __nv_bfloat16*>(q.data),
      static_cast<const __nv_bfloat16*>(k.data), static_cast<const __nv_bfloat16*>(v.data),
      static_cast<const int32_t*>(cu_seqlens.data), nseq, nh, nkv, hd, scale * 1.4426950408889634f);
  DF_CUDA_LAUNCH();
}

}  // namespace

const char* attention_kernel_name(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::Auto: return "auto";
    case AttentionKernel::Hd128: return "hd128";
    case AttentionKernel::Hd256: return "hd256";
    case AttentionKernel::Hd256Small: return "hd256-small";
    case AttentionKernel::Cudnn: return "cudnn";
  }
  return "?";
}

bool attention_kernel_fits(const Ctx& ctx, AttentionKernel kernel) {
  if (kernel == AttentionKernel::Auto) return true;
  if (kernel == AttentionKernel::Cudnn) return attention_cudnn_compiled();
  const int device = backend_of(ctx).device;
  switch (kernel) {  // the kernel's static shared memory (find_tile's) counts against the same limit
    case AttentionKernel::Hd128:
      return launch_fits(flash_attention_kernel<Hd128Tiling>, Hd128Tiling::kThreads, Hd128Tiling::kSmemBytes, device);
    case AttentionKernel::Hd256:
      return launch_fits(flash_attention_kernel<Hd256Tiling>, Hd256Tiling::kThreads, Hd256Tiling::kSmemBytes, device);
    case AttentionKernel::Hd256Small:
      return launch_fits(flash_attention_kernel<Hd256SmallTiling>, Hd256SmallTiling::kThreads,
                         Hd256SmallTiling::kSmemBytes, device);
    default: return false;
  }
}

AttentionKernel attention_kernel_for(const Ctx& ctx, int hd) {
  if (hd <= 128) return AttentionKernel::Hd128;
  // The wide tiling where the device holds it; Hd256Small fits every architecture this builds for.
  return attention_kernel_fits(ctx, AttentionKernel::Hd256) ? AttentionKernel::Hd256 : AttentionKernel::Hd256Small;
}

AttentionKernel attention_varlen_causal_forward(const Ctx& ctx, const Tensor& out, const Tensor& q, const Tensor& k,
                                                const Tensor& v, const Tensor& cu_seqlens, float scale,
                                                AttentionKernel kernel, int64_t max_seqlen) {
  const int device = backend_of(ctx).device;
  DF_CHECK(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && out.numel() == q.numel(), Internal,
           "attention: q " << q.shape_str() << ", k " << k.shape_str() << ", v " << v.shape_str() << ", out "
                           << out.shape_str() << " must be [T, heads, hd]");
  const int64_t T = q.size(0);
  const int nh = static_cast<int>(q.size(1)), nkv = static_cast<int>(k.size(1)), hd = static_cast<int>(q.size(2));
  DF_CHECK(q.dtype == DType::BF16 && k.dtype == DType::BF16 && v.dtype == DType::BF16 && out.dtype == DType::BF16 &&
               cu_seqlens.dtype == DType::I32 && cu_seqlens.device == Device::CUDA,
           Internal, "attention: q/k/v/out must be BF16 and cu_seqlens I32 in device memory");
  DF_CHECK(k.size(0) == T && v.size(0) == T && v.size(1) == nkv && k.size(2) == hd && v.size(2) == hd &&
               nkv > 0 && nh % nkv == 0,
           Internal, "attention: q " << q.shape_str() << ", k " << k.shape_str() << ", v " << v.shape_str());
  DF_CHECK(scale > 0.f, Internal, "attention: scale must be positive, got " << scale);
  DF_CHECK(hd > 0 && hd <= kAttentionMaxHeadDim && hd % 8 == 0, Internal,
           "attention: head_dim " << hd << " unsupported (a multiple of 8, at most " << kAttentionMaxHeadDim << ")");
  DF_CHECK(((reinterpret_cast<uintptr_t>(q.data) | reinterpret_cast<uintptr_t>(k.data) |
             reinterpret_cast<uintptr_t>(v.data) | reinterpret_cast<uintptr_t>(out.data)) & 15) == 0,
           Internal, "attention: tensors must be 16-byte aligned");
  const int nseq = static_cast<int>(cu_seqlens.numel()) - 1;
  if (T == 0 || nseq <= 0) return kernel;
  const CudnnPolicy policy = cudnn_policy();
  if (kernel == AttentionKernel::Cudnn || (kernel == AttentionKernel::Auto && policy != CudnnPolicy::Never)) {
    if (attention_cudnn_forward(ctx, out, q, k, v, cu_seqlens, scale, max_seqlen)) return AttentionKernel::Cudnn;
    DF_CHECK_HINT(kernel == AttentionKernel::Auto && policy != CudnnPolicy::Require, BadOptions,
                  "attention: cuDNN cannot serve " << nh << "/" << nkv << " heads x head_dim " << hd
                                                   << (attention_cudnn_compiled() ? " on this device" : " (this build has no cuDNN path)"),
                  "unset DFLASH_ATTENTION (the project's kernel then serves it)");
  }
  if (kernel == AttentionKernel::Auto) kernel = attention_kernel_for(ctx, hd);
  DF_CHECK(hd <= padded_head_dim(kernel) && attention_kernel_fits(ctx, kernel), Internal,
           "attention: kernel " << attention_kernel_name(kernel) << " cannot serve head_dim " << hd << " on device "
                                << device << " (" << smem_bytes(kernel) << " B of shared memory per block, the device allows "
                                << max_smem_per_block(device) << ")");
  switch (kernel) {
    case AttentionKernel::Hd128:
      launch<Hd128Tiling>(ctx, device, out, q, k, v, cu_seqlens, nseq, nh, nkv, hd, scale);
      return kernel;
    case AttentionKernel::Hd256:
      launch<Hd256Tiling>(ctx, device, out, q, k, v, cu_seqlens, nseq, nh, nkv, hd, scale);
      return kernel;
    case AttentionKernel::Hd256Small:
      launch<Hd256SmallTiling>(ctx, device, out, q, k, v, cu_seqlens, nseq, nh, nkv, hd, scale);
      return kernel;
    case AttentionKernel::Cudnn:
    case AttentionKernel::Auto: break;
  }
  DF_FAIL(Internal, "attention: unreachable kernel choice", "");
}

}  // namespace dflash::cuda
