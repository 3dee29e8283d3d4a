// FP8 linears on CUDA (docs/fp8.md). The activation quantization is the host arithmetic of
// include/dflash/fp8.h on BF16 inputs: s = amax / 448 and x / s with IEEE division (__fdiv_rn), then the
// hardware's saturating round-to-nearest-even e4m3 conversion, so the codes equal the CPU twin's bit for bit.
// The GEMM is cuBLASLt's block-scaled FP8 matmul: 1x128 (VEC128_32F) scales on both operands. cuBLAS 12.9+
// offers VEC128_32F / BLK128x128_32F on sm_90 only (the cuBLAS docs' scaling-mode table; sm_100+ has
// VEC32_UE8M0, MXFP8, another rounding of the scales); elsewhere this GEMM is refused and the target runs its
// FP8 linears as dequantized BF16 GEMMs behind ops::fp8_activation_qdq.
#include "fp8_linear.cuh"

#include <atomic>
#include <mutex>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "dflash/error.h"

namespace dflash::cuda {
namespace {

constexpr int kGroup = 128;  // fp8::kBlock

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One warp per (row, group): lane i holds channels c0 + i, c0 + i + 32, ... (up to `group` of them).
// Writes the dequantized values (qdq) or the codes and the kb-major scale (quant).
template <bool kDequantize>
__global__ void act_quant_kernel(__nv_bfloat16* __restrict__ qdq, __nv_fp8_storage_t* __restrict__ codes,
                                 float* __restrict__ scales, const __nv_bfloat16* __restrict__ in, int64_t N,
                                 int64_t K, int64_t group, int64_t groups) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= N * groups) return;
  const int64_t n = warp / groups, g = warp % groups;
  const int64_t c0 = g * group, c1 = min(K, c0 + group);
  const __nv_bfloat16* x = in + n * K;
  float amax = 0.f;
  for (int64_t c = c0 + lane; c < c1; c += 32) amax = fmaxf(amax, fabsf(__bfloat162float(x[c])));
  amax = warp_max(amax);
  const float s = __fdiv_rn(amax, 448.f);
  for (int64_t c = c0 + lane; c < c1; c += 32) {
    const __nv_fp8_storage_t q =
        s > 0.f ? __nv_cvt_float_to_fp8(__fdiv_rn(__bfloat162float(x[c]), s), __NV_SATFINITE, __NV_E4M3) : 0;
    if constexpr (kDequantize) {
      const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
      qdq[n * K + c] = __float2bfloat16_rn(v * s);
    } else {
      codes[n * K + c] = q;
    }
  }
  if (!kDequantize && lane == 0) scales[g * N + n] = s;  // kb-major: cuBLASLt's VEC128_32F layout
}

void launch_act_quant(const Ctx& ctx, bool dequantize, const Tensor& qdq, const Tensor& codes, const Tensor& scales,
                      const Tensor& in, int64_t group) {
  const int64_t N = in.size(0), K = in.size(1), groups = (K + group - 1) / group;
  const int64_t warps = N * groups;
  if (warps == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (warps * 32 + kThreads - 1) / kThreads;
  const auto* x = static_cast<const __nv_bfloat16*>(in.data);
  if (dequantize)
    act_quant_kernel<true><<<static_cast<unsigned>(blocks), kThreads, 0, stream_of(ctx)>>>(
        static_cast<__nv_bfloat16*>(qdq.data), nullptr, nullptr, x, N, K, group, groups);
  else
    act_quant_kernel<false><<<static_cast<unsigned>(blocks), kThreads, 0, stream_of(ctx)>>>(
        nullptr, static_cast<__nv_fp8_storage_t*>(codes.data), static_cast<float*>(scales.data), x, N, K, group,
        groups);
  DF_CUDA_LAUNCH();
}

}  // namespace

void fp8_activation_qdq(const Ctx& ctx, const Tensor& out, const Tensor& in, int64_t group) {
  DF_CHECK(in.dtype == DType::BF16 && out.dtype == DType::BF16, Internal, "fp8_activation_qdq: in and out must be BF16");
  launch_act_quant(ctx, true, out, Tensor(), Tensor(), in, group);
}

namespace {

// The block-scaled FP8 GEMM's cuBLASLt objects for one shape, released on scope exit. Column-major view:
// out^T [O, N] = W [K, O]^T (A, transposed) x act^T [K, N] (B): the TN layout FP8 needs; C and D BF16 [O, N].
struct Fp8Gemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;

  Fp8Gemm(const Backend& be, int64_t N, int64_t K, int64_t O, const void* a_scale, const void* b_scale) {
    DF_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    DF_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    DF_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    const cublasLtMatmulMatrixScale_t vec128 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    DF_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec128, sizeof(vec128)));
    DF_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec128, sizeof(vec128)));
    DF_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    DF_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    DF_CUBLAS(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, K, O, K));
    DF_CUBLAS(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, K, N, K));
    DF_CUBLAS(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, O, N, O));
    DF_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = be.workspace_bytes;
    DF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // A shape or scale mode this cuBLASLt (or GPU) does not serve answers NOT_SUPPORTED: found stays 0.
    if (cublasLtMatmulAlgoGetHeuristic(be.lt, desc, a, b, c, c, pref, 1, &result, &found) != CUBLAS_STATUS_SUCCESS)
      found = 0;
  }
  ~Fp8Gemm() {
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(desc);
  }
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;
};

// Per device: 0 not asked yet, 1 available, 2 not.
constexpr int kMaxDevices = 64;
std::atomic<int> g_block_gemm[kMaxDevices];
std::mutex g_block_gemm_mutex;

}  // namespace

bool fp8_block_gemm_available(const Ctx& ctx) {
  Backend& be = backend_of(ctx);
  DF_CHECK(be.device >= 0 && be.device < kMaxDevices, Internal, "fp8_block_gemm_available: device " << be.device);
  std::atomic<int>& known = g_block_gemm[be.device];
  if (const int k = known.load()) return k == 1;
  std::lock_guard<std::mutex> lock(g_block_gemm_mutex);
  if (const int k = known.load()) return k == 1;
  int major = 0, minor = 0;
  DF_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, be.device));
  DF_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, be.device));
  bool ok = major == 9 && minor == 0;
  if (ok) {
    // The scale pointers only have to be set for the heuristic; nothing runs.
    const float* dummy = reinterpret_cast<const float*>(be.workspace);
    const Fp8Gemm probe(be, 128, 128, 128, dummy, dummy);
    ok = probe.found > 0;
  }
  known.store(ok ? 1 : 2);
  return ok;
}

void fp8_linear_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& w_codes,
                        const Tensor& w_scales, const Tensor& act_codes, const Tensor& act_scales, ops::Accumulate acc,
                        const Tensor& residual) {
  Backend& be = backend_of(ctx);
  DF_CHECK(in.dtype == DType::BF16 && out.dtype == DType::BF16 && (residual.empty() || residual.dtype == DType::BF16),
           Internal, "fp8_linear_forward: in, out and residual must be BF16");
  const int64_t N = in.size(0), K = in.size(1), O = w_codes.size(0);
  DF_CHECK_HINT(fp8_block_gemm_available(ctx), DeviceFailure,
                "fp8_linear_forward: cuBLASLt's 1x128 block-scaled FP8 GEMM runs on sm_90 only (with cuBLAS 12.9 or "
                "later), not on this GPU",
                "FP8 targets run their linears as dequantized BF16 GEMMs on this GPU (docs/fp8.md)");
  DF_CHECK(K % kGroup == 0 && O % 16 == 0 && N % 16 == 0, Internal,
           "fp8_linear_forward: cuBLASLt's block-scaled FP8 GEMM needs K % 128 == 0 and N, O % 16 == 0, got N "
               << N << " K " << K << " O " << O);
  launch_act_quant(ctx, false, Tensor(), act_codes, act_scales, in, kGroup);

  const Fp8Gemm g(be, N, K, O, w_scales.data, act_scales.data);
  DF_CHECK_HINT(g.found > 0, DeviceFailure,
                "fp8_linear_forward: cuBLASLt has no block-scaled FP8 algorithm for N " << N << " K " << K << " O " << O,
                "update the CUDA toolkit to 12.9 or later (1x128 block scaling on sm_90)");
  // C: out itself (Accumulate::Yes), the residual, or nothing (beta = 0).
  const bool add = acc == ops::Accumulate::Yes || !residual.empty();
  const void* c = residual.empty() ? out.data : residual.data;
  const float alpha = 1.f, beta = add ? 1.f : 0.f;
  DF_CUBLAS(cublasLtMatmul(be.lt, g.desc, &alpha, w_codes.data, g.a, act_codes.data, g.b, &beta, c, g.c, out.data,
                           g.c, &g.result.algo, be.workspace, be.workspace_bytes, stream_of(ctx)));
}

}  // namespace dflash::cuda
