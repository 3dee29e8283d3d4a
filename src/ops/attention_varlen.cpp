// Causal GQA attention over packed variable-length sequences (the target's attention), CPU backend.
//
// Query t of the sequence [s0, s1) attends to keys s0..t only. Keys are visited in blocks of kKeyBlock
// with an online softmax (running max and sum, rescaled once per block), so no T x T score matrix is
// ever stored and nothing is allocated. Also the rule of which head dims each backend serves
// (ops/attention_head_dim.h), checked by the model loader.
#include <algorithm>
#include <cmath>
#include <string>

#include "dflash/ops.h"
#include "ops/attention_head_dim.h"
#include "ops/op_checks.h"

namespace dflash::ops {
namespace {

constexpr int64_t kKeyBlock = 64;
constexpr int64_t kMaxHeadDim = 1024;
// The CUDA kernels' rule (kernels/attention.cuh, declared in every build), which the loader checks.
constexpr int64_t kCudaMaxHeadDim = cuda::kAttentionMaxHeadDim;
constexpr int64_t kCudaHeadDimStep = 8;

// Dot product with 8 independent partial sums (vectorisable without reassociating a single sum).
inline float dot(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[i + l] * b[i + l];
  float t = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}

void attention_varlen_causal_cpu(float* out, const float* q, const float* k, const float* v, const int32_t* cu,
                                 int nseq, int64_t nh, int64_t nkv, int64_t hd, float scale) {
  const int64_t group = nh / nkv;
  const size_t q_row = static_cast<size_t>(nh) * hd, kv_row = static_cast<size_t>(nkv) * hd;
  float scores[kKeyBlock];
  float acc[kMaxHeadDim];
  for (int s = 0; s < nseq; ++s) {
    const int64_t s0 = cu[s], s1 = cu[s + 1];
    for (int64_t t = s0; t < s1; ++t) {
      for (int64_t h = 0; h < nh; ++h) {
        const float* qv = q + t * q_row + h * hd;
        const int64_t g = h / group;
        float m = -INFINITY, l = 0.0f;
        std::fill(acc, acc + hd, 0.0f);
        for (int64_t j0 = s0; j0 <= t; j0 += kKeyBlock) {
          const int64_t j1 = std::min(t + 1, j0 + kKeyBlock);
          float bmax = -INFINITY;
          for (int64_t j = j0; j < j1; ++j) {
            const float sc = dot(qv, k + j * kv_row + g * hd, hd) * scale;
            scores[j - j0] = sc;
            bmax = std::max(bmax, sc);
          }
          const float m_new = std::max(m, bmax);
          const float correction = std::exp(m - m_new);  // exp(-inf) = 0 on the first block
          l *= correction;
          for (int64_t c = 0; c < hd; ++c) acc[c] *= correction;
          for (int64_t j = j0; j < j1; ++j) {
            const float p = std::exp(scores[j - j0] - m_new);
            l += p;
            const float* vv = v + j * kv_row + g * hd;
            for (int64_t c = 0; c < hd; ++c) acc[c] += p * vv[c];
          }
          m = m_new;
        }
        float* o = out + t * q_row + h * hd;
        const float inv_l = 1.0f / l;
        for (int64_t c = 0; c < hd; ++c) o[c] = acc[c] * inv_l;
      }
    }
  }
}

}  // namespace

bool attention_head_dim_supported(Device device, int64_t head_dim) {
  if (device == Device::CUDA) return head_dim > 0 && head_dim <= kCudaMaxHeadDim && head_dim % kCudaHeadDimStep == 0;
  return head_dim > 0 && head_dim <= kMaxHeadDim;
}

std::string attention_head_dims_text(Device device) {
  if (device == Device::CUDA)
    return "multiples of " + std::to_string(kCudaHeadDimStep) + " from " + std::to_string(kCudaHeadDimStep) + " to " +
           std::to_string(kCudaMaxHeadDim);
  return "1 to " + std::to_string(kMaxHeadDim);
}

void attention_varlen_causal_forward(const Ctx& ctx, const Tensor& out, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& cu_seqlens, float scale) {
  constexpr const char* op = "attention_varlen_causal_forward";
  detail::check_tensor(op, "q", q, ctx, 3);
  const int64_t T = q.shape[0], nh = q.shape[1], hd = q.shape[2];
  detail::check_tensor(op, "k", k, ctx, 3);
  const int64_t nkv = k.shape[1];
  detail::check_shape(op, "k", k, {T, nkv, hd});
  detail::check_tensor(op, "v", v, ctx, 3);
  detail::check_shape(op, "v", v, {T, nkv, hd});
  detail::check_tensor(op, "out", out, ctx, 3);
  detail::check_shape(op, "out", out, {T, nh, hd});
  DF_CHECK(nkv > 0 && nh % nkv == 0, Internal, op << ": " << nh << " query heads for " << nkv << " kv heads");
  DF_CHECK(attention_head_dim_supported(ctx.device, hd), Internal,
           op << ": head_dim " << hd << " unsupported on " << device_name(ctx.device) << " (supported: "
              << attention_head_dims_text(ctx.device) << ")");
  DF_CHECK(!cu_seqlens.empty() && cu_seqlens.ndim == 1 && cu_seqlens.shape[0] >= 1 &&
               cu_seqlens.dtype == DType::I32,
           Internal, op << ": cu_seqlens must be a non-empty I32 vector, got " << cu_seqlens.shape_str());
  if (ctx.device == Device::CUDA)
    return (void)cuda::library_for(op).attention_varlen_causal_forward(ctx, out, q, k, v, cu_seqlens, scale,
                                                                       cuda::AttentionKernel::Auto, 0);
  DF_CHECK(cu_seqlens.device == Device::CPU, Internal, op << ": cu_seqlens must be in host memory on the CPU");
  for (const Tensor* t : {&q, &k, &v, &out}) detail::check_cpu_dtype(op, "q/k/v/out", *t, DType::F32);
  const int32_t* cu = cu_seqlens.ptr<int32_t>();
  const int nseq = static_cast<int>(cu_seqlens.shape[0]) - 1;
  DF_CHECK(cu[0] == 0 && cu[nseq] == T, Internal,
           op << ": cu_seqlens must run from 0 to T=" << T << ", got " << cu[0] << ".." << cu[nseq]);
  for (int s = 0; s < nseq; ++s)
    DF_CHECK(cu[s] <= cu[s + 1], Internal, op << ": cu_seqlens decreases at " << s);
  attention_varlen_causal_cpu(out.ptr<float>(), q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), cu, nseq, nh, nkv,
                              hd, scale);
}

}  // namespace dflash::ops
