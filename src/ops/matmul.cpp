// Linear layers on the CPU backend: out = in · W^T and its backward. Float32, no BLAS.
//
// The forward is the cost of a CPU job, so it is cache-blocked: a block of W rows (OB x IB floats) stays
// in L2 while every row block of `in` streams past it, and a 4x4 register tile of dot products runs over
// contiguous I with 8 independent lanes per dot product (the compiler turns them into SIMD registers;
// an x86 build also carries AVX2/AVX-512 clones of the kernel, picked at load time). The backward
// products use a register-tiled rank update (see rank_update_cpu).
#include <algorithm>
#include <cstring>

#include "dflash/ops.h"
#include "ops/op_checks.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DF_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DF_SIMD_CLONES
#endif

// The 8-lane helpers below are always inlined, so the AVX argument-passing ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace dflash::ops {
namespace {

#define DF_INLINE inline __attribute__((always_inline))  // so each SIMD clone gets its own copy

typedef float f8 __attribute__((vector_size(32), aligned(4)));  // 8 lanes, unaligned loads allowed

constexpr int64_t kRowBlock = 64;   // rows of `in` per block
constexpr int64_t kOutBlock = 64;   // rows of W per block
constexpr int64_t kInnerBlock = 512;  // reduction length per block (forward)

DF_INLINE f8 load8(const float* p) { return *reinterpret_cast<const f8*>(p); }
DF_INLINE float hsum(f8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

// acc[r][c] = dot(a[r][0..len), b[c][0..len)) for an R x C tile of rows.
template <int R, int C>
DF_INLINE void dot_tile(const float* const* a, const float* const* b, int64_t len, float acc[4][4]) {
  f8 s[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) s[r][c] = f8{0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    f8 av[R];
    for (int r = 0; r < R; ++r) av[r] = load8(a[r] + i);
    for (int c = 0; c < C; ++c) {
      f8 bv = load8(b[c] + i);
      for (int r = 0; r < R; ++r) s[r][c] += av[r] * bv;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float t = hsum(s[r][c]);
      for (int64_t j = i; j < len; ++j) t += a[r][j] * b[c][j];
      acc[r][c] = t;
    }
}

// out[n:n+R, o:o+C] (+)= in[n:n+R, i0:i0+len] · W[o:o+C, i0:i0+len]^T; overwrite on the first reduction block.
template <int R, int C>
DF_INLINE void tile(float* out, const float* in, const float* W, int64_t n, int64_t o, int64_t i0, int64_t len,
                 int64_t I, int64_t O, bool overwrite) {
  const float* a[4];
  const float* b[4];
  for (int r = 0; r < R; ++r) a[r] = in + static_cast<size_t>(n + r) * I + i0;
  for (int c = 0; c < C; ++c) b[c] = W + static_cast<size_t>(o + c) * I + i0;
  float acc[4][4];
  dot_tile<R, C>(a, b, len, acc);
  for (int r = 0; r < R; ++r) {
    float* row = out + static_cast<size_t>(n + r) * O + o;
    for (int c = 0; c < C; ++c) row[c] = overwrite ? acc[r][c] : row[c] + acc[r][c];
  }
}

template <int R>
DF_INLINE void tile_row_block(float* out, const float* in, const float* W, int64_t n, int64_t o0, int64_t o1,
                           int64_t i0, int64_t len, int64_t I, int64_t O, bool overwrite) {
  int64_t o = o0;
  for (; o + 4 <= o1; o += 4) tile<R, 4>(out, in, W, n, o, i0, len, I, O, overwrite);
  switch (o1 - o) {
    case 3: tile<R, 3>(out, in, W, n, o, i0, len, I, O, overwrite); break;
    case 2: tile<R, 2>(out, in, W, n, o, i0, len, I, O, overwrite); break;
    case 1: tile<R, 1>(out, in, W, n, o, i0, len, I, O, overwrite); break;
    default: break;
  }
}

DF_SIMD_CLONES
void matmul_forward_cpu(float* out, const float* in, const float* W, int64_t N, int64_t I, int64_t O,
                        Accumulate acc) {
  if (I == 0) {
    if (acc == Accumulate::No) std::memset(out, 0, static_cast<size_t>(N) * O * sizeof(float));
    return;
  }
  for (int64_t ob = 0; ob < O; ob += kOutBlock) {
    const int64_t oe = std::min(O, ob + kOutBlock);
    for (int64_t ib = 0; ib < I; ib += kInnerBlock) {
      const int64_t len = std::min(I, ib + kInnerBlock) - ib;
      const bool overwrite = ib == 0 && acc == Accumulate::No;
      for (int64_t nb = 0; nb < N; nb += kRowBlock) {
        const int64_t ne = std::min(N, nb + kRowBlock);
        int64_t n = nb;
        for (; n + 4 <= ne; n += 4) tile_row_block<4>(out, in, W, n, ob, oe, ib, len, I, O, overwrite);
        switch (ne - n) {
          case 3: tile_row_block<3>(out, in, W, n, ob, oe, ib, len, I, O, overwrite); break;
          case 2: tile_row_block<2>(out, in, W, n, ob, oe, ib, len, I, O, overwrite); break;
          case 1: tile_row_block<1>(out, in, W, n, ob, oe, ib, len, I, O, overwrite); break;
          default: break;
        }
      }
    }
  }
}

// The backward products are both C[R rows, I] (+)= A[R, K] · B[K, I] with B's rows contiguous in I:
//   din [N, I] = dout [N, O] · W [O, I]             (A(r, k) = dout[n + r, k], K = O)
//   dW  [O, I] += dout^T [O, N] · in [N, I]          (A(r, k) = dout[k, o + r], K = N)
// so one register-tiled kernel serves both: a tile of R rows x kChunk columns of C stays in registers
// while K rows of B stream past, each multiplied by a broadcast element of A.
constexpr int64_t kChunk = 32;  // columns of C per tile: 4 vectors of 8

template <int R>
DF_INLINE void rank_update_tile(float* C, int64_t ldc, const float* A, int64_t a_row, int64_t a_k, const float* B,
                                int64_t ldb, int64_t K, int64_t i0, bool overwrite) {
  f8 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v)
      acc[r][v] = overwrite ? f8{0, 0, 0, 0, 0, 0, 0, 0} : load8(C + r * ldc + i0 + 8 * v);
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb + i0;
    const f8 b0 = load8(b), b1 = load8(b + 8), b2 = load8(b + 16), b3 = load8(b + 24);
    for (int r = 0; r < R; ++r) {
      const float a = A[r * a_row + k * a_k];
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
      acc[r][2] += a * b2;
      acc[r][3] += a * b3;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) *reinterpret_cast<f8*>(C + r * ldc + i0 + 8 * v) = acc[r][v];
}

// Columns past the last full chunk, scalar.
DF_INLINE void rank_update_tail(float* C, int64_t ldc, int rows, const float* A, int64_t a_row, int64_t a_k,
                                const float* B, int64_t ldb, int64_t K, int64_t i0, int64_t i1, bool overwrite) {
  for (int r = 0; r < rows; ++r)
    for (int64_t i = i0; i < i1; ++i) {
      float t = overwrite ? 0.0f : C[r * ldc + i];
      for (int64_t k = 0; k < K; ++k) t += A[r * a_row + k * a_k] * B[k * ldb + i];
      C[r * ldc + i] = t;
    }
}

DF_SIMD_CLONES
void rank_update_cpu(float* C, int64_t rows, int64_t I, const float* A, int64_t a_row, int64_t a_k, const float* B,
                     int64_t K, bool overwrite) {
  const int64_t full = I / kChunk * kChunk;
  for (int64_t i0 = 0; i0 < full; i0 += kChunk) {  // B's column chunk stays in cache across row tiles
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
      rank_update_tile<4>(C + r * I, I, A + r * a_row, a_row, a_k, B, I, K, i0, overwrite);
    for (; r < rows; ++r) rank_update_tile<1>(C + r * I, I, A + r * a_row, a_row, a_k, B, I, K, i0, overwrite);
  }
  if (full < I) rank_update_tail(C, I, static_cast<int>(rows), A, a_row, a_k, B, I, K, full, I, overwrite);
}

}  // namespace

void matmul_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& W, Accumulate acc) {
  constexpr const char* op = "matmul_forward";
  detail::check_tensor(op, "out", out, ctx, 2);
  detail::check_tensor(op, "in", in, ctx, 2);
  detail::check_tensor(op, "W", W, ctx, 2);
  const int64_t N = in.shape[0], I = in.shape[1], O = W.shape[0];
  detail::check_shape(op, "W", W, {O, I});
  detail::check_shape(op, "out", out, {N, O});
  if (ctx.device == Device::CUDA) return cuda::library_for("matmul_forward").matmul_forward(ctx, out, in, W, acc);
  detail::check_cpu_dtype(op, "out", out, DType::F32);
  detail::check_cpu_dtype(op, "in", in, DType::F32);
  detail::check_cpu_dtype(op, "W", W, DType::F32);
  matmul_forward_cpu(out.ptr<float>(), in.ptr<float>(), W.ptr<float>(), N, I, O, acc);
}

void matmul_residual_forward(const Ctx& ctx, const Tensor& out, const Tensor& in, const Tensor& W,
                             const Tensor& residual) {
  constexpr const char* op = "matmul_residual_forward";
  detail::check_tensor(op, "out", out, ctx, 2);
  detail::check_tensor(op, "in", in, ctx, 2);
  detail::check_tensor(op, "W", W, ctx, 2);
  detail::check_tensor(op, "residual", residual, ctx, 2);
  const int64_t N = in.shape[0], I = in.shape[1], O = W.shape[0];
  detail::check_shape(op, "W", W, {O, I});
  detail::check_shape(op, "out", out, {N, O});
  detail::check_shape(op, "residual", residual, {N, O});
  DF_CHECK(residual.data == out.data || !detail::overlaps(residual, out), Internal,
           op << ": residual must be out itself or not overlap it");
  DF_CHECK(!detail::overlaps(in, out), Internal, op << ": in must not overlap out");
  if (ctx.device == Device::CUDA)
    return cuda::library_for("matmul_residual_forward").matmul_residual_forward(ctx, out, in, W, residual);
  for (const Tensor* t : {&out, &in, &W, &residual}) detail::check_cpu_dtype(op, "out/in/W/residual", *t, DType::F32);
  if (residual.data != out.data) std::memcpy(out.data, residual.data, out.nbytes());
  matmul_forward_cpu(out.ptr<float>(), in.ptr<float>(), W.ptr<float>(), N, I, O, Accumulate::Yes);
}

void matmul_backward(const Ctx& ctx, const Tensor& din, const Tensor& dW, const Tensor& dout, const Tensor& in,
                     const Tensor& W) {
  constexpr const char* op = "matmul_backward";
  detail::check_tensor(op, "dout", dout, ctx, 2);
  detail::check_tensor(op, "in", in, ctx, 2);
  detail::check_tensor(op, "W", W, ctx, 2);
  const int64_t N = in.shape[0], I = in.shape[1], O = W.shape[0];
  detail::check_shape(op, "W", W, {O, I});
  detail::check_shape(op, "dout", dout, {N, O});
  if (!din.empty()) {
    detail::check_tensor(op, "din", din, ctx, 2);
    detail::check_shape(op, "din", din, {N, I});
  }
  if (!dW.empty()) {
    detail::check_tensor(op, "dW", dW, ctx, 2);
    detail::check_shape(op, "dW", dW, {O, I});
  }
  if (ctx.device == Device::CUDA)
    return cuda::library_for("matmul_backward").matmul_backward(ctx, din, dW, dout, in, W);
  detail::check_cpu_dtype(op, "dout", dout, DType::F32);
  detail::check_cpu_dtype(op, "in", in, DType::F32);
  detail::check_cpu_dtype(op, "W", W, DType::F32);
  if (!din.empty()) {
    detail::check_cpu_dtype(op, "din", din, DType::F32);
    rank_update_cpu(din.ptr<float>(), N, I, dout.ptr<float>(), /*a_row=*/O, /*a_k=*/1, W.ptr<float>(), O,
                    /*overwrite=*/true);
  }
  if (!dW.empty()) {
    detail::check_cpu_dtype(op, "dW", dW, DType::F32);
    rank_update_cpu(dW.ptr<float>(), O, I, dout.ptr<float>(), /*a_row=*/1, /*a_k=*/O, in.ptr<float>(), N,
                    /*overwrite=*/false);
  }
}

}  // namespace dflash::ops
