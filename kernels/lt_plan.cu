// cuBLASLt plans per tuning class and their autotune (lt_plan.cuh): shared by kernels/matmul.cu and
// kernels/fp8_linear.cu.
#include "lt_plan.cuh"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda_check.cuh"

namespace dflash::cuda {

namespace {

// GEMMs at least this large (m * n * k) have their algorithm picked by timing the heuristic's top
// candidates once, at the first shape of its tuning class; the heuristic's first choice is a few percent
// off on some of the target's shapes. DFLASH_GEMM_AUTOTUNE=0 keeps the heuristic's choice.
constexpr double kAutotuneMinWork = 1 << 30;

bool autotune_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("DFLASH_GEMM_AUTOTUNE");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

int alignment_of(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 2 && (v % align) != 0) align /= 2;
  return align;
}

// Whether cuBLASLt runs `algo` on the plan's current layouts within the workspace.
bool accepts(const Backend& be, const LtPlan& p, const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t r{};
  return cublasLtMatmulAlgoCheck(be.lt, p.desc, p.a, p.b, p.c, p.c, &algo, &r) == CUBLAS_STATUS_SUCCESS &&
         r.workspaceSize <= be.workspace_bytes;
}

// Times each candidate (`run`, into a temporary output) and returns the index of the fastest. Synchronizes
// the stream.
int fastest_candidate(const Backend& be, cudaStream_t stream, const cublasLtMatmulHeuristicResult_t* results,
                      int found, size_t out_bytes, const CandidateRun& run) {
  void* scratch = nullptr;
  DF_CUDA(cudaMalloc(&scratch, out_bytes));
  cudaEvent_t e0, e1;
  DF_CUDA(cudaEventCreate(&e0));
  DF_CUDA(cudaEventCreate(&e1));
  int best = 0;
  float best_ms = 1e30f;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > be.workspace_bytes) continue;
    if (run(results[i].algo, scratch) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; a candidate that fails is skipped
    DF_CUDA(cudaEventRecord(e0, stream));
    for (int r = 0; r < 3; ++r) DF_CUBLAS(run(results[i].algo, scratch));
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

}  // namespace

int tuning_class(int v) {
  int shift = 0;
  while ((v >> shift) >= 8) ++shift;  // v < 8 << shift: keep the three leading bits
  const int unit = 1 << shift;
  return (v + unit - 1) / unit * unit;
}

Alignments alignments(const void* A, const void* B, const void* C, const void* D) {
  const int d = std::min(alignment_of(C), alignment_of(D));
  return Alignments{{uint32_t(alignment_of(A)), uint32_t(alignment_of(B)), uint32_t(d)}};
}

void set_layout(cublasLtMatrixLayout_t l, int rows, int cols, int ld) {
  const uint64_t r = uint64_t(rows), c = uint64_t(cols);
  const int64_t l64 = ld;
  DF_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof(r)));
  DF_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof(c)));
  DF_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &l64, sizeof(l64)));
}

int lt_heuristic(const Backend& be, const LtPlan& p, const Alignments& align, cublasLtMatmulHeuristicResult_t* results) {
  cublasLtMatmulPreference_t pref;
  DF_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = be.workspace_bytes;
  DF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  DF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align.bytes[0], 4));
  DF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align.bytes[1], 4));
  DF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align.bytes[2], 4));
  DF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align.bytes[2], 4));
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(be.lt, p.desc, p.a, p.b, p.c, p.c, pref, kCandidates, results, &found) !=
      CUBLAS_STATUS_SUCCESS)
    found = 0;
  cublasLtMatmulPreferenceDestroy(pref);
  return found;
}

bool choose_first_algo(Backend& be, cudaStream_t stream, LtPlan& p, const Alignments& align, double work,
                       size_t out_bytes, const CandidateRun& run) {
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  const int found = lt_heuristic(be, p, align, results);
  if (found == 0) return false;
  p.tuned = results[0].algo;
  // Deterministic mode keeps the heuristic's choice: a timing may pick another algorithm next run.
  if (found > 1 && autotune_enabled() && !deterministic() && work >= kAutotuneMinWork)
    p.tuned = results[fastest_candidate(be, stream, results, found, out_bytes, run)].algo;
  p.algo = p.tuned;
  return true;
}

bool choose_algo_for_shape(Backend& be, LtPlan& p, const Alignments& align) {
  if (!deterministic() && accepts(be, p, p.tuned)) {
    p.algo = p.tuned;
    return true;
  }
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  if (lt_heuristic(be, p, align, results) == 0) return false;
  p.algo = results[0].algo;
  return true;
}

}  // namespace dflash::cuda
