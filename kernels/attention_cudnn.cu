// The per-batch inputs of the cuDNN attention graph (attention_cudnn.cuh): sequence lengths and ragged
// element offsets from cu_seqlens, computed on the device so no host sync is needed between batches.
#include "attention_cudnn.cuh"
#include "backend.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

// One thread per entry i in [0, b]: seq_len[i] (i < b) and both offsets; entries past nseq are empty.
static __global__ void ragged_kernel(const int32_t* __restrict__ cu, int nseq, int b, int32_t q_per_token,
                                     int32_t kv_per_token, int32_t* __restrict__ seq_len, int32_t* __restrict__ q_off,
                                     int32_t* __restrict__ kv_off) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i > b) return;
  const int32_t c = cu[i < nseq ? i : nseq];
  q_off[i] = c * q_per_token;
  kv_off[i] = c * kv_per_token;
  if (i < b) seq_len[i] = i < nseq ? cu[i + 1] - c : 0;
}

}  // namespace

void attention_cudnn_ragged(const Ctx& ctx, const int32_t* cu_seqlens, int nseq, int b, int32_t q_elems_per_token,
                            int32_t kv_elems_per_token, int32_t* seq_len, int32_t* q_off, int32_t* kv_off) {
  DF_CHECK(nseq > 0 && b >= nseq && cu_seqlens && seq_len && q_off && kv_off && q_elems_per_token > 0 && kv_elems_per_token > 0,
           Internal, "attention_cudnn_ragged: nseq " << nseq << ", per-token elements " << q_elems_per_token << "/"
                                                     << kv_elems_per_token);
  constexpr int kThreads = 128;
  const unsigned blocks = static_cast<unsigned>((b + 1 + kThreads - 1) / kThreads);
  ragged_kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(cu_seqlens, nseq, b, q_elems_per_token, kv_elems_per_token,
                                                         seq_len, q_off, kv_off);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
