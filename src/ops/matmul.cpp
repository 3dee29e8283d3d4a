// Linear layers on the CPU backend: out = in · W^T and its backward. Float32, no BLAS.
//
// The forward is the cost of a CPU job, so it is cache-blocked: a block of W rows (OB x IB floats) stays
// in L2 while every row block of `in` streams past it, and a 4x4 register tile of dot products runs over
// contiguous I with 8 independent lanes per dot product (the compiler turns them into SIMD registers;
// an x86 build also carries AVX2/AVX-512 clones of the kernel, picked at load time).
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
constexpr int64_t kInnerBlock = 512;  // reduction length per block

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

// din [N, I] = dout [N, O] · W [O, I]: four rows of din at a time, each an axpy over W's rows.
DF_SIMD_CLONES
void matmul_backward_input_cpu(float* din, const float* dout, const float* W, int64_t N, int64_t I, int64_t O) {
  std::memset(din, 0, static_cast<size_t>(N) * I * sizeof(float));
  for (int64_t ib = 0; ib < I; ib += kInnerBlock) {
    const int64_t ie = std::min(I, ib + kInnerBlock);
    for (int64_t n = 0; n < N; n += 4) {
      const int64_t rows = std::min<int64_t>(4, N - n);
      for (int64_t o = 0; o < O; ++o) {
        const float* w = W + static_cast<size_t>(o) * I;
        for (int64_t r = 0; r < rows; ++r) {
          const float g = dout[static_cast<size_t>(n + r) * O + o];
          float* d = din + static_cast<size_t>(n + r) * I;
          for (int64_t i = ib; i < ie; ++i) d[i] += g * w[i];
        }
      }
    }
  }
}

// dW [O, I] += dout^T [O, N] · in [N, I]: four rows of dW at a time, each an axpy over in's rows.
DF_SIMD_CLONES
void matmul_backward_weight_cpu(float* dW, const float* dout, const float* in, int64_t N, int64_t I, int64_t O) {
  for (int64_t ib = 0; ib < I; ib += kInnerBlock) {
    const int64_t ie = std::min(I, ib + kInnerBlock);
    for (int64_t o = 0; o < O; o += 4) {
      const int64_t rows = std::min<int64_t>(4, O - o);
      for (int64_t n = 0; n < N; ++n) {
        const float* x = in + static_cast<size_t>(n) * I;
        for (int64_t r = 0; r < rows; ++r) {
          const float g = dout[static_cast<size_t>(n) * O + o + r];
          float* d = dW + static_cast<size_t>(o + r) * I;
          for (int64_t i = ib; i < ie; ++i) d[i] += g * x[i];
        }
      }
    }
  }
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
  if (ctx.device == Device::CUDA) {
#ifdef DFLASH_HAVE_CUDA
    return detail::cuda_op_missing(op);  // CUDA twin: return cuda::matmul_forward(ctx, out, in, W, acc);
#else
    return detail::no_cuda_build(op);
#endif
  }
  detail::check_cpu_dtype(op, "out", out, DType::F32);
  detail::check_cpu_dtype(op, "in", in, DType::F32);
  detail::check_cpu_dtype(op, "W", W, DType::F32);
  matmul_forward_cpu(out.ptr<float>(), in.ptr<float>(), W.ptr<float>(), N, I, O, acc);
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
  if (ctx.device == Device::CUDA) {
#ifdef DFLASH_HAVE_CUDA
    return detail::cuda_op_missing(op);  // CUDA twin: return cuda::matmul_backward(ctx, din, dW, dout, in, W);
#else
    return detail::no_cuda_build(op);
#endif
  }
  detail::check_cpu_dtype(op, "dout", dout, DType::F32);
  detail::check_cpu_dtype(op, "in", in, DType::F32);
  detail::check_cpu_dtype(op, "W", W, DType::F32);
  if (!din.empty()) {
    detail::check_cpu_dtype(op, "din", din, DType::F32);
    matmul_backward_input_cpu(din.ptr<float>(), dout.ptr<float>(), W.ptr<float>(), N, I, O);
  }
  if (!dW.empty()) {
    detail::check_cpu_dtype(op, "dW", dW, DType::F32);
    matmul_backward_weight_cpu(dW.ptr<float>(), dout.ptr<float>(), in.ptr<float>(), N, I, O);
  }
}

}  // namespace dflash::ops
