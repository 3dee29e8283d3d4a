// cuBLASLt GEMMs planned once per tuning class and autotuned: what kernels/matmul.cu (the bf16 GEMMs) and
// kernels/fp8_linear.cu (the block-scaled FP8 GEMM) share. Each keeps its own plans on the Backend
// (backend.cuh: matmul_plans, fp8_plans), keyed by its own dimensions, with the objects below.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "backend.cuh"

namespace dflash::cuda {

// A job's GEMMs change shape with every batch: the token count T of a packed batch is one of their
// dimensions (the target's projections, the drafter's fc and context k/v and their weight gradients), and
// it is rarely the same twice. Timing the candidates at each new shape cost a job more than the GEMMs
// themselves (eight candidates x four runs, a scratch allocation and its synchronizing free, per shape and
// batch: the H100 job's target forward took 0.650 s where the kernels take 0.38, bench/results/
// h100-issue44-plan/README.md). So the algorithm is chosen once per tuning class: every dimension rounded
// up to its three leading bits (at most eight classes per octave; the models' widths, 4096, 6144, 12288,
// 5120, ..., are their own class), and each new shape of a class takes the class's algorithm when
// cuBLASLt accepts it for that shape (cublasLtMatmulAlgoCheck), else the heuristic's first choice for it.
int tuning_class(int v);

// The operands' alignments (the largest power of two <= 256 that divides each address) of A, B and C = D
// (the smaller of the two: they share one layout and one preference), as the heuristic is asked for them,
// and as one int for a plan's key: an algorithm chosen for aligned operands may not run on less aligned ones.
struct Alignments {
  uint32_t bytes[3];
  int key() const { return int(bytes[0]) * 1000000 + int(bytes[1]) * 1000 + int(bytes[2]); }
};
Alignments alignments(const void* A, const void* B, const void* C, const void* D);

// The descriptors of one planned GEMM and its algorithms. C and D share the layout c.
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t tuned{};  // the class's algorithm (timed, or the heuristic's first choice)
  cublasLtMatmulAlgo_t algo{};   // the algorithm of the current shape: tuned, when cuBLASLt accepts it for it
};

// Re-describes a layout as [rows, cols] (column-major, leading dimension ld): host-side attributes only.
void set_layout(cublasLtMatrixLayout_t l, int rows, int cols, int ld);

// The heuristic's candidates for the plan's current layouts, at most kCandidates, for operands aligned as
// `align` says, within the backend's workspace. Returns how many;
// 0 when cuBLASLt has none or refuses the descriptor (NOT_SUPPORTED: a scale mode this cuBLASLt or GPU
// does not serve).
constexpr int kCandidates = 8;
int lt_heuristic(const Backend& be, const LtPlan& p, const Alignments& align, cublasLtMatmulHeuristicResult_t* results);

// Runs one candidate algorithm into `scratch` with beta = 0 (an accumulating GEMM's destination is left alone).
using CandidateRun = std::function<cublasStatus_t(const cublasLtMatmulAlgo_t& algo, void* scratch)>;

// A new plan's algorithms for its first shape: the heuristic's first choice, or, where autotuning applies
// (below), the fastest of its candidates, each timed once warm + three runs (CUDA events) into a scratch
// output of `out_bytes`. Synchronizes the stream when it times. `work` = m * n * k of the shape. Returns
// false (the plan untouched) when the heuristic has no candidate.
bool choose_first_algo(Backend& be, cudaStream_t stream, LtPlan& p, const Alignments& align, double work,
                       size_t out_bytes, const CandidateRun& run);

// After the plan's layouts were re-set to another shape of its class: its tuned algorithm when cuBLASLt
// accepts it for the shape, else the heuristic's first choice; in deterministic mode always the
// heuristic's first choice for the exact shape (a resumed run sees the shapes in another order and must run
// the same kernels). Returns false when the heuristic has no candidate.
bool choose_algo_for_shape(Backend& be, LtPlan& p, const Alignments& align);

}  // namespace dflash::cuda
