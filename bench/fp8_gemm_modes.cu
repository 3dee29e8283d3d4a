// fp8_gemm_modes: which FP8 scaling modes cuBLASLt runs on this GPU, and how fast, at a target's linear shapes
// (issue 46: the block-scaled GEMM reaches ~815 TFLOP/s on an H100, 1.14x bf16; what do the other modes give?).
// For each shape: bf16, FP8 with 1x128 block scales on both operands (VEC128_32F: the fine-grained format),
// FP8 with per-row / per-column scales (OUTER_VEC_32F: compressed-tensors FP8-Dynamic, per token x per
// channel), and FP8 with one scale per tensor (SCALAR_32F), the last with and without fast accumulation.
// Each mode asks the heuristic for up to 8 algorithms and times each (CUDA events, 2 warm-ups, median of 7);
// the fastest counts. Standalone (cuBLASLt only) so it runs on any CUDA machine:
//   nvcc -O2 -std=c++17 -arch=sm_90a bench/fp8_gemm_modes.cu -lcublasLt -o fp8_gemm_modes && ./fp8_gemm_modes
// Options: --tokens N (16384), --shapes 8b|27b (8b), --search N: for the per-token mode (OUTER_VEC_32F, for
// which the heuristic offers one algorithm) also every algorithm id x tile x stages x cluster shape cuBLASLt
// accepts (cublasLtMatmulAlgoCheck), at most N of them timed per shape (1 warm-up + median of 3), the fastest
// reported with its configuration: whether a better kernel than the heuristic's exists for the wide shapes.
// Output: `# ` metadata, then one fixed-width row per (shape, mode): the algorithms tried, the best time and
// TFLOP/s, or why the mode is not available.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                         \
    }                                                                                       \
  } while (0)

namespace {

enum class Mode { Bf16, Block, Outer, OuterFastAccum, Tensor, TensorFastAccum };
const char* name(Mode m) {
  switch (m) {
    case Mode::Bf16: return "bf16";
    case Mode::Block: return "fp8-block128";
    case Mode::Outer: return "fp8-outer-vec";
    case Mode::OuterFastAccum: return "fp8-outer-vec-fastacc";
    case Mode::Tensor: return "fp8-tensor";
    case Mode::TensorFastAccum: return "fp8-tensor-fastacc";
  }
  return "?";
}

struct Shape { const char* what; int k, o; };

// One GEMM's cuBLASLt objects in mode m, column-major as the product runs it: out^T [O, N] = W [K, O]^T x
// act^T [K, N] (TN), C = D bf16. Released on scope exit.
struct LtGemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  LtGemm(Mode m, int N, int K, int O, float* sa, float* sb) {
    const bool fp8 = m != Mode::Bf16;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    if (fp8) {
      cublasLtMatmulMatrixScale_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
      if (m == Mode::Block) mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      if (m == Mode::Outer || m == Mode::OuterFastAccum) mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode));
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode));
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
      const int8_t fast = m == Mode::TensorFastAccum || m == Mode::OuterFastAccum ? 1 : 0;
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
    }
    const cudaDataType_t in_t = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    cublasLtMatrixLayoutCreate(&a, in_t, K, O, K);
    cublasLtMatrixLayoutCreate(&b, in_t, K, N, K);
    cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, O, N, O);
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(desc);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
};

// The median ms of `timed` runs of algo after `warmup` (CUDA events), or -1 when it does not run.
double time_algo(cublasLtHandle_t lt, const LtGemm& g, const cublasLtMatmulAlgo_t& algo, int warmup, int timed,
                 void* w, void* x, void* out, void* ws, size_t ws_bytes) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const float alpha = 1.f, beta = 0.f;
  std::vector<float> t;
  bool ok = true;
  for (int r = 0; r < warmup + timed && ok; ++r) {
    CK(cudaEventRecord(e0));
    ok = cublasLtMatmul(lt, g.desc, &alpha, w, g.a, x, g.b, &beta, out, g.c, out, g.c, &algo, ws, ws_bytes, 0) ==
         CUBLAS_STATUS_SUCCESS;
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= warmup) t.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (!ok || cudaGetLastError() != cudaSuccess) return -1;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The heuristic's candidates (up to 8) in mode m, each timed (2 warm-ups, median of 7). Returns the best
// median ms, or a negative number with `why` set.
double time_mode(cublasLtHandle_t lt, Mode m, int N, int K, int O, void* w, void* x, void* out, float* sa,
                 float* sb, void* ws, size_t ws_bytes, int* tried, std::string* why) {
  const LtGemm g(m, N, K, O, sa, sb);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
  cublasLtMatmulHeuristicResult_t res[8] = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, g.desc, g.a, g.b, g.c, g.c, pref, 8, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  double best = -1;
  *tried = 0;
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    *why = "no algorithm (heuristic status " + std::to_string(int(st)) + ")";
    return best;
  }
  for (int i = 0; i < found; ++i) {
    const double med = time_algo(lt, g, res[i].algo, 2, 7, w, x, out, ws, ws_bytes);
    if (med < 0) continue;
    ++*tried;
    if (best < 0 || med < best) best = med;
  }
  if (best < 0) *why = "every algorithm failed to run";
  return best;
}

// --search: cuBLASLt's algorithm space for the per-token mode at one shape. Returns the best median ms (or -1),
// with how many configurations were accepted and timed, and the best one's (id, tile, stages, cluster).
double search_outer(cublasLtHandle_t lt, int N, int K, int O, void* w, void* x, void* out, float* sa, float* sb,
                    void* ws, size_t ws_bytes, int limit, int* timed, std::string* best_cfg) {
  const LtGemm g(Mode::Outer, N, K, O, sa, sb);
  int ids[256];
  int nids = 0;
  cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF,
                           CUDA_R_16BF, 256, ids, &nids);
  double best = -1;
  *timed = 0;
  const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                               CUBLASLT_CLUSTER_SHAPE_1x2x1};
  for (int i = 0; i < nids && *timed < limit; ++i) {
    cublasLtMatmulAlgo_t algo;
    if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF,
                               CUDA_R_16BF, ids[i], &algo) != CUBLAS_STATUS_SUCCESS)
      continue;
    uint32_t tiles[128] = {}, stages[128] = {};
    size_t tb_bytes = 0, sb_bytes = 0;
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof(tiles), &tb_bytes);
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, sizeof(stages), &sb_bytes);
    const int ntiles = tb_bytes ? int(std::min(tb_bytes, sizeof(tiles)) / 4) : 1;
    const int nstages = sb_bytes ? int(std::min(sb_bytes, sizeof(stages)) / 4) : 1;
    for (int t = 0; t < ntiles && *timed < limit; ++t)
      for (int s = 0; s < nstages && *timed < limit; ++s)
        for (uint16_t cl : clusters) {
          if (*timed >= limit) break;
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tiles[t], sizeof(tiles[t]));
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages[s], sizeof(stages[s]));
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof(cl));
          cublasLtMatmulHeuristicResult_t check = {};
          if (cublasLtMatmulAlgoCheck(lt, g.desc, g.a, g.b, g.c, g.c, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
              check.workspaceSize > ws_bytes)
            continue;
          const double med = time_algo(lt, g, algo, 1, 3, w, x, out, ws, ws_bytes);
          if (med < 0) continue;
          ++*timed;
          if (best < 0 || med < best) {
            best = med;
            *best_cfg = "id " + std::to_string(ids[i]) + " tile " + std::to_string(tiles[t]) + " stages " +
                        std::to_string(stages[s]) + " cluster " + std::to_string(cl);
          }
        }
  }
  return best;
}

__global__ void fill_kernel(unsigned char* p, size_t n, unsigned seed, bool fp8) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = (unsigned(i) ^ seed) * 2654435761u;
    h ^= h >> 13;
    // small finite values: e4m3 codes with exponent bits below the top (no NaN), bf16 bytes ~ +-[0.5, 2)
    p[i] = fp8 ? static_cast<unsigned char>((h & 0x80) | (0x30 + (h >> 8) % 0x18)) : static_cast<unsigned char>(i % 2 ? (h & 0x80) | 0x3f : h);
  }
}

__global__ void fill_scales(float* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = 1.f / 64 + (i % 7) / 512.f;
}

}  // namespace

int main(int argc, char** argv) {
  int N = 16384, search = 0;
  std::string set = "8b";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) N = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc) set = argv[++i];
    else if (!std::strcmp(argv[i], "--search") && i + 1 < argc) search = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: fp8_gemm_modes [--tokens N] [--shapes 8b|27b] [--search N]\n");
      return 2;
    }
  }
  // Qwen3-8B: hidden 4096, q|k|v 4096+1024+1024, MLP 12288. Qwen3.6-27B: hidden 5120, MLP 17408; its full
  // attention q (with the gate) 2x6144 + k|v 2x1024 and the DeltaNet's in_proj_qkvz, out_proj.
  std::vector<Shape> shapes = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 24576}, {"down", 12288, 4096}};
  if (set == "27b")
    shapes = {{"attn_qkv", 5120, 14336}, {"attn_o", 6144, 5120}, {"gdn_qkvz", 5120, 16384},
              {"gdn_out", 6144, 5120},   {"gate_up", 5120, 34816}, {"down", 17408, 5120}};
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int ver = 0;
  ver = int(cublasLtGetVersion());
  std::printf("# fp8_gemm_modes: %s (sm_%d%d), cuBLASLt %d, tokens %d, shapes %s\n", prop.name, prop.major,
              prop.minor, ver, N, set.c_str());
  std::printf("# time: median of 7 after 2 warm-ups per algorithm, best of the heuristic's <= 8 (CUDA events)\n");
  size_t max_w = 0, max_x = 0, max_o = 0;
  for (auto& s : shapes) {
    max_w = std::max(max_w, size_t(s.k) * s.o);
    max_x = std::max(max_x, size_t(s.k) * N);
    max_o = std::max(max_o, size_t(s.o) * N);
  }
  void *w, *x, *out, *ws;
  float *sa, *sb;
  const size_t ws_bytes = size_t(64) << 20;
  CK(cudaMalloc(&w, max_w * 2));
  CK(cudaMalloc(&x, max_x * 2));
  CK(cudaMalloc(&out, max_o * 2));
  CK(cudaMalloc(&ws, ws_bytes));
  const size_t nscale = std::max(max_w, max_x) / 128 + 65536;
  CK(cudaMalloc(&sa, nscale * 4));
  CK(cudaMalloc(&sb, nscale * 4));
  fill_scales<<<1024, 256>>>(sa, nscale);
  fill_scales<<<1024, 256>>>(sb, nscale);
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  std::printf("%-10s %6s %6s %6s  %-20s %5s %10s %9s  %s\n", "shape", "N", "K", "O", "mode", "algos", "ms", "TFLOP/s",
              "vs bf16");
  for (auto& s : shapes) {
    double bf16_ms = -1;
    for (Mode m : {Mode::Bf16, Mode::Block, Mode::Outer, Mode::OuterFastAccum, Mode::Tensor, Mode::TensorFastAccum}) {
      const bool fp8 = m != Mode::Bf16;
      fill_kernel<<<1024, 256>>>(static_cast<unsigned char*>(w), size_t(s.k) * s.o * (fp8 ? 1 : 2), 1, fp8);
      fill_kernel<<<1024, 256>>>(static_cast<unsigned char*>(x), size_t(s.k) * N * (fp8 ? 1 : 2), 2, fp8);
      CK(cudaDeviceSynchronize());
      int tried = 0;
      std::string why;
      const double ms = time_mode(lt, m, N, s.k, s.o, w, x, out, sa, sb, ws, ws_bytes, &tried, &why);
      CK(cudaGetLastError());
      if (ms < 0) {
        std::printf("%-10s %6d %6d %6d  %-20s %5d %10s %9s  %s\n", s.what, N, s.k, s.o, name(m), tried, "-", "-",
                    why.c_str());
        continue;
      }
      if (m == Mode::Bf16) bf16_ms = ms;
      const double tflops = 2.0 * N * s.k * s.o / (ms * 1e-3) / 1e12;
      std::printf("%-10s %6d %6d %6d  %-20s %5d %10.3f %9.1f  %.2fx\n", s.what, N, s.k, s.o, name(m), tried, ms,
                  tflops, bf16_ms > 0 ? bf16_ms / ms : 0.0);
      if (m == Mode::Outer && search > 0) {
        int timed = 0;
        std::string cfg;
        const double best = search_outer(lt, N, s.k, s.o, w, x, out, sa, sb, ws, ws_bytes, search, &timed, &cfg);
        CK(cudaGetLastError());
        if (best > 0)
          std::printf("%-10s %6d %6d %6d  %-20s %5d %10.3f %9.1f  %.2fx  (%s)\n", s.what, N, s.k, s.o,
                      "fp8-outer-vec-search", timed, best, 2.0 * N * s.k * s.o / (best * 1e-3) / 1e12,
                      bf16_ms > 0 ? bf16_ms / best : 0.0, cfg.c_str());
        else
          std::printf("%-10s %6d %6d %6d  %-20s %5d %10s %9s  no configuration ran\n", s.what, N, s.k, s.o,
                      "fp8-outer-vec-search", timed, "-", "-");
      }
    }
  }
  cublasLtDestroy(lt);
  return 0;
}
