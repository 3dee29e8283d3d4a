// FP8 linears on CUDA (docs/fp8.md). The activation quantization is the host arithmetic of
// include/dflash/fp8.h on BF16 inputs: s = amax / 448 and x / s with IEEE division (__fdiv_rn), then the
// hardware's saturating round-to-nearest-even e4m3 conversion, so the codes equal the CPU twin's bit for bit.
// The GEMM is cuBLASLt's block-scaled FP8 matmul: 1x128 (VEC128_32F) scales on both operands. cuBLAS 12.9+
// offers VEC128_32F / BLK128x128_32F on sm_90 only (the cuBLAS docs' scaling-mode table; sm_100+ has
// VEC32_UE8M0, MXFP8, another rounding of the scales); elsewhere this GEMM is refused and the target runs its
// FP8 linears as dequantized BF16 GEMMs behind ops::fp8_activation_qdq. Fp8Scaling::TokenChannel
// (compressed-tensors FP8-Dynamic) runs the same way with one scale per row of each operand (OUTER_VEC_32F),
// the activations quantized per token by kernels/fp8_rows.cu's row quantizer (the same arithmetic, one
// group of K). fp8_gemm_forward is the GEMM alone, over activations a caller quantized once for several
// linears or a fused producer wrote (ops::rmsnorm_fp8_forward, ops::swiglu_fp8_forward).
#include "fp8_linear.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "device_limits.cuh"
#include "dflash/error.h"
#include "fp8_block_gemm_mma.cuh"
#include "fp8_rows.cuh"
#include "lt_plan.cuh"
#include "matmul_plans.cuh"

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
  // One group per row (Fp8Scaling::TokenChannel): the row quantizer (one read of the row, 16-byte loads).
  if (!dequantize && groups == 1)
    return launch_rows_quantize(ctx, codes.data, static_cast<float*>(scales.data), in.data, N, K);
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

// The FP8 GEMM, planned once per tuning class like the bf16 GEMMs (lt_plan.cuh): keyed by the
// token count's class (N is the dimension that changes with every batch), the exact K and O (a linear's
// own), whether C is read (beta = 1: Accumulate::Yes or a residual), the operands' alignments and the scaling. The
// descriptor (the TN layout, the VEC128_32F scale modes) and the layouts are made once; a call sets its
// scale pointers on the plan's descriptor (host-side attributes, read by cublasLtMatmul when it enqueues)
// and, for another token count of the class, re-sets the layouts of B and C to it. Column-major view:
// out^T [O, N] = W [K, O]^T (A, transposed) x act^T [K, N] (B): the TN layout FP8 needs; C and D BF16 [O, N].
struct Fp8Plan : LtPlan {
  int n = 0;  // the token count the layouts describe now
};

namespace {

// Whether the per-token GEMMs accumulate in the tensor cores' fast FP8 mode (CUBLASLT_MATMUL_DESC_FAST_ACCUM:
// no promotion of the partial sums to fp32 every few k-steps) on a device of compute capability `cc`.
// Default: on sm_90, where vLLM's CUTLASS per-token FP8 GEMMs run the fast schedules too (so it is what an
// engine serving an FP8-Dynamic target computes) and where it was measured (docs/fp8.md "Accumulation":
// the 8B forward 263 -> 242 ms, the GEMM's error against the CPU twin 0.0017 -> 0.0030 at K 12288, the
// target's unchanged); exact elsewhere (not measured there). DFLASH_FP8_ACCUMULATION=exact|fast overrides
// it (read once). Block128 is never fast: cuBLASLt rescales its every 128-deep partial sum.
bool fast_token_accumulation(int cc) {
  static const int forced = [] {  // -1 exact, 1 fast, 0 the default
    const char* v = std::getenv("DFLASH_FP8_ACCUMULATION");
    if (!v || !*v) return 0;
    DF_CHECK_HINT(std::string(v) == "fast" || std::string(v) == "exact", BadOptions,
                  "DFLASH_FP8_ACCUMULATION=" << v << " is not fast or exact",
                  "unset it (fast on sm_90, exact elsewhere) or set it to fast or exact");
    return std::string(v) == "fast" ? 1 : -1;
  }();
  return forced != 0 ? forced > 0 : cc == 90;
}

// The real device's compute capability as 10 * major + minor (device_limits: queried once per device).
int compute_capability(int device) {
  const DeviceLimits& l = device_limits(device);
  return l.cc_major * 10 + l.cc_minor;
}

// Block128: 1x128 scales on both operands (VEC128_32F); TokenChannel: one per row of each (OUTER_VEC_32F:
// the weights' per output channel, the activations' per token).
void create_fp8_gemm(LtPlan& p, int N, int K, int O, ops::Fp8Scaling scaling, int cc) {
  DF_CUBLAS(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  DF_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  DF_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtMatmulMatrixScale_t mode = scaling == ops::Fp8Scaling::TokenChannel
                                               ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                               : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  DF_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
  DF_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
  if (scaling == ops::Fp8Scaling::TokenChannel && fast_token_accumulation(cc)) {
    const int8_t fast = 1;
    DF_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  }
  DF_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, K, O, K));
  DF_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, K, N, K));
  DF_CUBLAS(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, O, N, O));
}

// The weights' (A) and the activations' (B) kb-major scales of this call.
void set_scales(const LtPlan& p, const void* a_scale, const void* b_scale) {
  DF_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
  DF_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
}

void destroy_fp8_gemm(LtPlan& p) {
  cublasLtMatrixLayoutDestroy(p.c);
  cublasLtMatrixLayoutDestroy(p.b);
  cublasLtMatrixLayoutDestroy(p.a);
  cublasLtMatmulDescDestroy(p.desc);
}

// Which kernel runs the Block128 GEMM: cuBLASLt's VEC128_32F (sm_90; the default) or the hand-written
// mma.sync one (fp8_block_gemm_mma.cuh: any GPU of compute capability 8.9+, chosen only by
// DFLASH_FP8_BLOCK_GEMM=mma until it is measured on the GPUs cuBLASLt leaves out). Read once per process.
enum class BlockGemm : uint8_t { CublasLt, Mma };
BlockGemm block_gemm_choice() {
  static const BlockGemm choice = [] {
    const char* v = std::getenv("DFLASH_FP8_BLOCK_GEMM");
    const std::string s = v ? v : "";
    DF_CHECK_HINT(s.empty() || s == "cublaslt" || s == "mma", BadOptions,
                  "DFLASH_FP8_BLOCK_GEMM=" << s << " is not cublaslt or mma",
                  "unset it (cuBLASLt on sm_90, none elsewhere) or set cublaslt or mma (docs/fp8.md \"Which FP8 GEMM\")");
    return s == "mma" ? BlockGemm::Mma : BlockGemm::CublasLt;
  }();
  return choice;
}

// Per scaling and device: 0 not asked yet, 1 available, 2 not.
constexpr int kMaxDevices = 64;
std::atomic<int> g_gemm[2][kMaxDevices];
std::mutex g_gemm_mutex;

// Whether this device's cuBLASLt runs the FP8 GEMM of `scaling`: the architectures that can (Block128: sm_90
// only, the cuBLAS docs' scaling-mode table; TokenChannel: FP8 tensor cores, sm_89 and later), then the
// heuristic asked for a probe shape (nothing runs; the scale pointers only have to be set). Once per device.
bool fp8_gemm_available(const Ctx& ctx, ops::Fp8Scaling scaling) {
  Backend& be = backend_of(ctx);
  DF_CHECK(be.device >= 0 && be.device < kMaxDevices, Internal, "fp8_gemm_available: device " << be.device);
  std::atomic<int>& known = g_gemm[static_cast<int>(scaling)][be.device];
  if (const int k = known.load()) return k == 1;
  std::lock_guard<std::mutex> lock(g_gemm_mutex);
  if (const int k = known.load()) return k == 1;
  const int cc = compute_capability(be.device);
  const bool mma = scaling == ops::Fp8Scaling::Block128 && block_gemm_choice() == BlockGemm::Mma;
  bool ok = (scaling == ops::Fp8Scaling::Block128 && !mma) ? cc == 90 : cc >= 89;
  if (ok && !mma) {
    LtPlan probe;
    create_fp8_gemm(probe, 128, 128, 128, scaling, cc);
    set_scales(probe, be.workspace, be.workspace);
    cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
    ok = lt_heuristic(be, probe, Alignments{{256, 256, 256}}, results) > 0;
    destroy_fp8_gemm(probe);
  }
  known.store(ok ? 1 : 2);
  return ok;
}

}  // namespace

bool fp8_block_gemm_available(const Ctx& ctx) { return fp8_gemm_available(ctx, ops::Fp8Scaling::Block128); }
bool fp8_token_gemm_available(const Ctx& ctx) { return fp8_gemm_available(ctx, ops::Fp8Scaling::TokenChannel); }

void fp8_linear_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& w_codes,
                        const Tensor& w_scales, const Tensor& act_codes, const Tensor& act_scales, ops::Accumulate acc,
                        const Tensor& residual, ops::Fp8Scaling scaling) {
  DF_CHECK(in.dtype == DType::BF16, Internal, "fp8_linear_forward: in must be BF16");
  const int64_t K = in.size(1);
  launch_act_quant(ctx, false, Tensor(), act_codes, act_scales, in,
                   scaling == ops::Fp8Scaling::TokenChannel ? K : kGroup);
  cuda::fp8_gemm_forward(ctx, out, act_codes, act_scales, w_codes, w_scales, acc, residual, scaling);  // not ops:: (ADL)
}

void fp8_gemm_forward(const Ctx& ctx, const Tensor& out, const Tensor& act_codes, const Tensor& act_scales,
                      const Tensor& w_codes, const Tensor& w_scales, ops::Accumulate acc, const Tensor& residual,
                      ops::Fp8Scaling scaling) {
  Backend& be = backend_of(ctx);
  DF_CHECK(out.dtype == DType::BF16 && (residual.empty() || residual.dtype == DType::BF16), Internal,
           "fp8_gemm_forward: out and residual must be BF16");
  const int64_t N = act_codes.size(0), K = act_codes.size(1), O = w_codes.size(0);
  const bool per_token = scaling == ops::Fp8Scaling::TokenChannel;
  if (!per_token && block_gemm_choice() == BlockGemm::Mma)
    return fp8_block_gemm_mma(ctx, out, act_codes, act_scales, w_codes, w_scales, acc, residual);
  DF_CHECK_HINT(fp8_gemm_available(ctx, scaling), DeviceFailure,
                "fp8_gemm_forward: this GPU's cuBLASLt has no "
                    << (per_token ? "per-token x per-channel (OUTER_VEC_32F) FP8 GEMM"
                                  : "1x128 block-scaled FP8 GEMM (sm_90 only, cuBLAS 12.9 or later)"),
                "FP8 targets run their linears as dequantized BF16 GEMMs on this GPU (docs/fp8.md)");
  DF_CHECK(K % (per_token ? 16 : kGroup) == 0 && O % 16 == 0 && N % 16 == 0 &&
               std::max({N, K, O}) < (int64_t(1) << 31),
           Internal,
           "fp8_gemm_forward: cuBLASLt's FP8 GEMM needs K % " << (per_token ? 16 : kGroup)
                                                                << " == 0 and N, O % 16 == 0 (each < 2^31), got N " << N
                                                                << " K " << K << " O " << O);

  const int n = static_cast<int>(N), k = static_cast<int>(K), o = static_cast<int>(O);
  cudaStream_t stream = stream_of(ctx);
  // C: out itself (Accumulate::Yes), the residual, or nothing (beta = 0).
  const bool reads_c = acc == ops::Accumulate::Yes || !residual.empty();
  const void* c = residual.empty() ? out.data : residual.data;
  const Alignments align = alignments(w_codes.data, act_codes.data, c, out.data);
  const Fp8Key key{tuning_class(n), k, o, reads_c ? 1 : 0, align.key(), static_cast<int>(scaling)};
  bool planned = true;
  Fp8Plan*& plan = be.fp8_plans[key];
  if (!plan) {
    auto* p = new Fp8Plan();
    create_fp8_gemm(*p, n, k, o, scaling, compute_capability(be.device));
    p->n = n;
    set_scales(*p, w_scales.data, act_scales.data);
    const float alpha = 1.f, beta0 = 0.f;
    planned = choose_first_algo(be, stream, *p, align, double(n) * k * o, size_t(n) * o * dtype_size(DType::BF16),
                                [&](const cublasLtMatmulAlgo_t& algo, void* scratch) {
                                  return cublasLtMatmul(be.lt, p->desc, &alpha, w_codes.data, p->a, act_codes.data,
                                                        p->b, &beta0, scratch, p->c, scratch, p->c, &algo,
                                                        be.workspace, be.workspace_bytes, stream);
                                });
    plan = p;
  } else {
    set_scales(*plan, w_scales.data, act_scales.data);
    if (plan->n != n) {  // another token count of the class
      set_layout(plan->b, k, n, k);
      set_layout(plan->c, o, n, o);
      plan->n = n;
      planned = choose_algo_for_shape(be, *plan, align);
    }
  }
  DF_CHECK_HINT(planned, DeviceFailure,
                "fp8_gemm_forward: cuBLASLt has no " << (per_token ? "per-token" : "block-scaled") << " FP8 algorithm for N "
                                                       << N << " K " << K << " O " << O,
                per_token ? "report the GPU and CUDA version; DFLASH_FP8_LINEAR=dequant runs this target's linears "
                            "dequantized meanwhile"
                          : "update the CUDA toolkit to 12.9 or later (1x128 block scaling on sm_90)");
  const float alpha = 1.f, beta = reads_c ? 1.f : 0.f;
  DF_CUBLAS(cublasLtMatmul(be.lt, plan->desc, &alpha, w_codes.data, plan->a, act_codes.data, plan->b, &beta, c,
                           plan->c, out.data, plan->c, &plan->algo, be.workspace, be.workspace_bytes, stream));
}

int fp8_plan_count(const Ctx& ctx) { return static_cast<int>(backend_of(ctx).fp8_plans.size()); }

}  // namespace dflash::cuda
