// Row-major tensors seen by column-major cuBLASLt: a row-major [r, c] matrix is a column-major [c, r] one
// with leading dimension c, so out = in · W^T becomes out^T = W · in^T with W transposed ("TN", the
// layout cuBLASLt's fastest Hopper kernels take).
#include "matmul.cuh"
#include "matmul_plans.cuh"

#include "backend.cuh"
#include "cuda_check.cuh"
#include "lt_plan.cuh"

namespace dflash::cuda {

// One plan per tuning class (lt_plan.cuh, tuning_class): the descriptors, the algorithm tuned at the class's
// first shape, and the exact shape the layouts describe now with the algorithm that runs it.
struct MatmulPlan : LtPlan {
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;  // the current shape
};

namespace {

cudaDataType cuda_type(DType t) {
  DF_CHECK(t == DType::BF16 || t == DType::F32, Internal, "matmul: unsupported dtype " << dtype_name(t));
  return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// D [m, n] (column-major, ld ldd) = op(A) [m, k] · op(B) [k, n] + beta · C, C of D's type and layout: D
// itself (in place) when C is null. A and B are bf16; D is bf16 or fp32.
void gemm(Backend& be, cudaStream_t stream, bool trans_a, bool trans_b, int m, int n, int k, const void* A,
          int lda, const void* B, int ldb, void* D, DType d_type, int ldd, float beta, const void* C = nullptr) {
  if (!C) C = D;
  const Alignments align = alignments(A, B, C, D);  // C and D share one layout and one alignment preference
  MatmulKey key{trans_a, trans_b, tuning_class(m), tuning_class(n), tuning_class(k), 0, 0, 0,
                static_cast<int>(d_type) * 2 + (beta != 0.f), align.key()};
  bool planned = true;
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
    const float alpha = 1.f, beta0 = 0.f;
    planned = choose_first_algo(be, stream, *p, align, double(m) * n * k, size_t(m) * n * dtype_size(d_type),
                                [&](const cublasLtMatmulAlgo_t& algo, void* scratch) {
                                  return cublasLtMatmul(be.lt, p->desc, &alpha, A, p->a, B, p->b, &beta0, scratch,
                                                        p->c, scratch, p->c, &algo, be.workspace,
                                                        be.workspace_bytes, stream);
                                });
    plan = p;
  } else if (plan->m != m || plan->n != n || plan->k != k || plan->lda != lda || plan->ldb != ldb ||
             plan->ldd != ldd) {
    // Another shape of the class: the layouts describe it now (host-side attributes, no allocation).
    MatmulPlan& p = *plan;
    set_layout(p.a, trans_a ? k : m, trans_a ? m : k, lda);
    set_layout(p.b, trans_b ? n : k, trans_b ? k : n, ldb);
    set_layout(p.c, m, n, ldd);
    p.m = m, p.n = n, p.k = k, p.lda = lda, p.ldb = ldb, p.ldd = ldd;
    planned = choose_algo_for_shape(be, p, align);
  }
  DF_CHECK(planned, DeviceFailure, "cuBLASLt found no algorithm for a bf16 GEMM m=" << m << " n=" << n << " k=" << k);
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
