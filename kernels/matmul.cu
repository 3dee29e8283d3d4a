// Row-major tensors seen by column-major cuBLASLt: a row-major [r, c] matrix is a column-major [c, r] one
// with leading dimension c, so out = in · W^T becomes out^T = W · in^T with W transposed ("TN", the
// layout cuBLASLt's fastest Hopper kernels take).
#include "matmul.cuh"
#include "matmul_plans.cuh"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {

// One plan per tuning class (tuning_class below): the descriptors, the algorithm tuned at the class's first
// shape, and the exact shape the layouts describe now with the algorithm that runs it.
struct MatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t tuned{};  // the class's algorithm (timed, or the heuristic's first choice)
  cublasLtMatmulAlgo_t algo{};   // the algorithm of the current shape: tuned, when cuBLASLt accepts it for it
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;  // the current shape
};

namespace {

int alignment_of(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 2 && (v % align) != 0) align /= 2;
  return align;
}

cudaDataType cuda_type(DType t) {
  DF_CHECK(t == DType::BF16 || t == DType::F32, Internal, "matmul: unsupported dtype " << dtype_name(t));
  return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// GEMMs at least this large (m * n * k) have their algorithm picked by timing the heuristic's top
// candidates once, at the first shape of its tuning class (below); the heuristic's first choice is a few
// percent off on some of the target's shapes. DFLASH_GEMM_AUTOTUNE=0 keeps the heuristic's choice.
constexpr double kAutotuneMinWork = 1 << 30;

// A job's GEMMs change shape with every batch: the token count T of a packed batch is one of their
// dimensions (the target's projections, the drafter's fc and context k/v and their weight gradients), and
// it is rarely the same twice. Timing the candidates at each new shape cost a job more than the GEMMs
// themselves (eight candidates x four runs, a scratch allocation and its synchronizing free, per shape and
// batch: the H100 job's target forward took 0.650 s where the kernels take 0.38, bench/results/
// h100-issue44-plan/README.md). So the algorithm is chosen once per tuning class: every dimension rounded
// up to its three leading bits (at most eight classes per octave; the models' widths, 4096, 6144, 12288,
// 5120, ..., are their own class), and each new shape of a class takes the class's algorithm when
// cuBLASLt accepts it for that shape (cublasLtMatmulAlgoCheck), else the heuristic's first choice for it.
int tuning_class(int v) {
  int shift = 0;
  while ((v >> shift) >= 8) ++shift;  // v < 8 << shift: keep the three leading bits
  const int unit = 1 << shift;
  return (v + unit - 1) / unit * unit;
}

bool autotune_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("DFLASH_GEMM_AUTOTUNE");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

// Times each candidate (beta = 0, into a temporary output so an accumulating GEMM's destination is left
// alone) and returns the index of the fastest. Runs once per shape; synchronizes the stream.
int fastest_candidate(Backend& be, cudaStream_t stream, const MatmulPlan& p,
                      const cublasLtMatmulHeuristicResult_t* results, int found, int m, int n, const void* A,
                      const void* B, DType d_type) {
  void* scratch = nullptr;
  DF_CUDA(cudaMalloc(&scratch, size_t(m) * n * dtype_size(d_type)));
  cudaEvent_t e0, e1;
  DF_CUDA(cudaEventCreate(&e0));
  DF_CUDA(cudaEventCreate(&e1));
  const float alpha = 1.f, beta = 0.f;
  int best = 0;
  float best_ms = 1e30f;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > be.workspace_bytes) continue;
    auto run = [&] {
      return cublasLtMatmul(be.lt, p.desc, &alpha, A, p.a, B, p.b, &beta, scratch, p.c, scratch, p.c,
                            &results[i].algo, be.workspace, be.workspace_bytes, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; a candidate that fails is skipped
    DF_CUDA(cudaEventRecord(e0, stream));
    for (int r = 0; r < 3; ++r) DF_CUBLAS(run());
    DF_CUDA(cudaEventRecord(e1, stream));
    DF_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    DF_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (ms < best_ms) {
      best_ms = ms;
      best = i;
    }
  }
  DF_CUDA(cudaEventDestroy(e0));
  DF_CUDA(cudaEventDestroy(e1));
  DF_CUDA(cudaFree(scratch));
  return best;
}

// D [m, n] (column-major, ld ldd) = op(A) [m, k] · op(B) [k, n] + beta · C, C of D's type and layout: D
// itself (in place) when C is null. A and B are bf16; D is bf16 or fp32.
void set_layout(cublasLtMatrixLayout_t l, int rows, int cols, int ld) {
  const uint64_t r = uint64_t(rows), c = uint64_t(cols);
  const int64_t l64 = ld;
  DF_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof(r)));
  DF_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof(c)));
  DF_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &l64, sizeof(l64)));
}

// The heuristic's candidates (at most kCandidates) for the plan's current shape and these alignments.
constexpr int kCandidates = 8;
int heuristic(Backend& be, const MatmulPlan& p, const uint32_t align[3], cublasLtMatmulHeuristicResult_t* results) {
  cublasLtMatmulPreference_t pref;
  DF_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = be.workspace_bytes;
  DF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  DF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[0], 4));
  DF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[1], 4));
  DF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2], 4));
  DF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2], 4));
  int found = 0;
  DF_CUBLAS(cublasLtMatmulAlgoGetHeuristic(be.lt, p.desc, p.a, p.b, p.c, p.c, pref, kCandidates, results, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  DF_CHECK(found > 0, DeviceFailure,
           "cuBLASLt found no algorithm for a bf16 GEMM m=" << p.m << " n=" << p.n << " k=" << p.k);
  return found;
}

// Whether cuBLASLt runs `algo` on the plan's current shape within the workspace.
bool accepts(Backend& be, const MatmulPlan& p, const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t r{};
  return cublasLtMatmulAlgoCheck(be.lt, p.desc, p.a, p.b, p.c, p.c, &algo, &r) == CUBLAS_STATUS_SUCCESS &&
         r.workspaceSize <= be.workspace_bytes;
}

// D [m, n] (column-major, ld ldd) = op(A) [m, k] · op(B) [k, n] + beta · C, C of D's type and layout: D
// itself (in place) when C is null. A and B are bf16; D is bf16 or fp32.
void gemm(Backend& be, cudaStream_t stream, bool trans_a, bool trans_b, int m, int n, int k, const void* A,
          int lda, const void* B, int ldb, void* D, DType d_type, int ldd, float beta, const void* C = nullptr) {
  if (!C) C = D;
  // C and D share one layout and one alignment preference: the smaller of the two.
  int align_a = alignment_of(A), align_b = alignment_of(B), align_d = std::min(alignment_of(D), alignment_of(C));
  const uint32_t align[3] = {uint32_t(align_a), uint32_t(align_b), uint32_t(align_d)};
  MatmulKey key{trans_a, trans_b, tuning_class(m), tuning_class(n), tuning_class(k), 0, 0, 0,
                static_cast<int>(d_type) * 2 + (beta != 0.f), align_a * 1000000 + align_b * 1000 + align_d};
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  MatmulPlan*& plan = be.matmul_plans[key];
  if (!plan) {
    auto* p = new MatmulPlan();
    DF_CUBLAS(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    DF_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    DF_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // Stored shapes (before op): A is [m, k] or [k, m]; B is [k, n] or [n, k].
    DF_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, trans_a ? k : m, trans_a ? m : k, lda));
    DF_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, trans_b ? n : k, trans_b ? k : n, ldb));
    DF_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, cuda_type(d_type), m, n, ldd));
    p->m = m, p->n = n, p->k = k, p->lda = lda, p->ldb = ldb, p->ldd = ldd;
    const int found = heuristic(be, *p, align, results);
    p->tuned = results[0].algo;
    // Deterministic mode keeps the heuristic's choice: a timing may pick another algorithm next run.
    if (found > 1 && autotune_enabled() && !deterministic() && double(m) * n * k >= kAutotuneMinWork)
      p->tuned = results[fastest_candidate(be, stream, *p, results, found, m, n, A, B, d_type)].algo;
    p->algo = p->tuned;
    plan = p;
  } else if (plan->m != m || plan->n != n || plan->k != k || plan->lda != lda || plan->ldb != ldb ||
             plan->ldd != ldd) {
    // Another shape of the class: the layouts describe it now (host-side attributes, no allocation).
    MatmulPlan& p = *plan;
    set_layout(p.a, trans_a ? k : m, trans_a ? m : k, lda);
    set_layout(p.b, trans_b ? n : k, trans_b ? k : n, ldb);
    set_layout(p.c, m, n, ldd);
    p.m = m, p.n = n, p.k = k, p.lda = lda, p.ldb = ldb, p.ldd = ldd;
    // Deterministic mode: the heuristic's first choice for this exact shape, whatever came first (a resumed
    // run sees the shapes in another order and must run the same kernels).
    if (deterministic()) p.algo = (heuristic(be, p, align, results), results[0].algo);
    else p.algo = accepts(be, p, p.tuned) ? p.tuned : (heuristic(be, p, align, results), results[0].algo);
  }
  float alpha = 1.f;
  DF_CUBLAS(cublasLtMatmul(be.lt, plan->desc, &alpha, A, plan->a, B, plan->b, &beta, C, plan->c, D, plan->c,
                           &plan->algo, be.workspace, be.workspace_bytes, stream));
}

int as_int(int64_t v, const char* what) {
  DF_CHECK(v > 0 && v < (int64_t(1) << 31), Internal, "matmul: " << what << " = " << v << " out of range");
  return static_cast<int>(v);
}

// Rows and columns of a tensor seen as a matrix [numel / last, last].
int64_t cols_of(const Tensor& t) { return t.size(-1); }
int64_t rows_of(const Tensor& t) { return static_cast<int64_t>(t.numel() / static_cast<size_t>(t.size(-1))); }

}  // namespace

void matmul_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& W, ops::Accumulate acc) {
  Backend& be = backend_of(ctx);
  DF_CHECK(in.dtype == DType::BF16 && W.dtype == DType::BF16, Internal, "matmul_forward: in and W must be BF16");
  int N = as_int(rows_of(in), "N"), I = as_int(cols_of(in), "I"), O = as_int(W.size(0), "O");
  DF_CHECK(W.ndim == 2 && W.size(1) == I && rows_of(out) == N && cols_of(out) == O, Internal,
           "matmul_forward: out " << out.shape_str() << " = in " << in.shape_str() << " · W^T " << W.shape_str());
  float beta = acc == ops::Accumulate::Yes ? 1.f : 0.f;
  gemm(be, stream_of(ctx), true, false, O, N, I, W.data, I, in.data, I, out.data, out.dtype, O, beta);
}

void matmul_residual_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& W,
                             const Tensor& residual) {
  Backend& be = backend_of(ctx);
  DF_CHECK(in.dtype == DType::BF16 && W.dtype == DType::BF16 && out.dtype == DType::BF16 &&
               residual.dtype == DType::BF16,
           Internal, "matmul_residual_forward: out, in, W and residual must be BF16");
  int N = as_int(rows_of(in), "N"), I = as_int(cols_of(in), "I"), O = as_int(W.size(0), "O");
  DF_CHECK(W.ndim == 2 && W.size(1) == I && rows_of(out) == N && cols_of(out) == O && rows_of(residual) == N &&
               cols_of(residual) == O,
           Internal,
           "matmul_residual_forward: out " << out.shape_str() << " = residual " << residual.shape_str() << " + in "
                                           << in.shape_str() << " · W^T " << W.shape_str());
  gemm(be, stream_of(ctx), true, false, O, N, I, W.data, I, in.data, I, out.data, out.dtype, O, 1.f,
       residual.data);
}

void matmul_backward(const Ctx& ctx, const Tensor& din, const Tensor& dW, const Tensor& dout, const Tensor& in,
                     const Tensor& W) {
  Backend& be = backend_of(ctx);
  DF_CHECK(dout.dtype == DType::BF16 && W.dtype == DType::BF16 && in.dtype == DType::BF16, Internal,
           "matmul_backward: dout, in and W must be BF16");
  int N = as_int(rows_of(dout), "N"), O = as_int(cols_of(dout), "O"), I = as_int(W.size(1), "I");
  DF_CHECK(W.size(0) == O && rows_of(in) == N && cols_of(in) == I, Internal,
           "matmul_backward: dout " << dout.shape_str() << ", in " << in.shape_str() << ", W " << W.shape_str());
  if (!din.empty()) {
    DF_CHECK(rows_of(din) == N && cols_of(din) == I, Internal, "matmul_backward: din " << din.shape_str());
    // din^T [I, N] = W^T [I, O] · dout^T [O, N]
    gemm(be, stream_of(ctx), false, false, I, N, O, W.data, I, dout.data, O, din.data, din.dtype, I, 0.f);
  }
  if (!dW.empty()) {
    DF_CHECK(dW.ndim == 2 && dW.size(0) == O && dW.size(1) == I, Internal, "matmul_backward: dW " << dW.shape_str());
    // dW^T [I, O] += in^T [I, N] · dout [N, O]
    gemm(be, stream_of(ctx), false, true, I, O, N, in.data, I, dout.data, O, dW.data, dW.dtype, I, 1.f);
  }
}

int matmul_plan_count(const Ctx& ctx) { return static_cast<int>(backend_of(ctx).matmul_plans.size()); }

}  // namespace dflash::cuda
