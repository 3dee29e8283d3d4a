#include "embedding.cuh"

#include "backend.cuh"
#include "bf16_util.cuh"
#include "cuda_check.cuh"

namespace dflash::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per token, 16-byte chunks (H % 8 == 0).
__global__ void embedding_kernel(Bf16x8* __restrict__ out, const int32_t* __restrict__ tokens,
                                 const Bf16x8* __restrict__ table, int64_t T, int64_t V, int chunks,
                                 int* error_flags) {
  int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (t >= T) return;
  int64_t id = tokens[t];
  bool bad = id < 0 || id >= V;
  if (bad && lane == 0) atomicOr(error_flags, kBadTokenId);
  Bf16x8 zero{};
  for (int c = lane; c < chunks; c += 32) out[t * chunks + c] = bad ? zero : table[id * chunks + c];
}

}  // namespace

void embedding_forward(const Ctx& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table) {
  Backend& be = backend_of(ctx);
  // A bad id flagged by an earlier, unsynchronized launch is reported at the latest here.
  check_device_errors(be);
  DF_CHECK(out.dtype == DType::BF16 && table.dtype == DType::BF16 && tokens.dtype == DType::I32, Internal,
           "embedding_forward: out/table must be BF16, tokens I32");
  int64_t T = static_cast<int64_t>(tokens.numel()), V = table.size(0), H = table.size(1);
  DF_CHECK(table.ndim == 2 && H % 8 == 0 && static_cast<int64_t>(out.numel()) == T * H, Internal,
           "embedding_forward: out " << out.shape_str() << ", tokens " << tokens.shape_str() << ", table "
                                     << table.shape_str() << " (H must be a multiple of 8)");
  if (T == 0) return;
  unsigned blocks = static_cast<unsigned>((T + kWarpsPerBlock - 1) / kWarpsPerBlock);
  embedding_kernel<<<blocks, kWarpsPerBlock * 32, 0, stream_of(ctx)>>>(
      static_cast<Bf16x8*>(out.data), static_cast<const int32_t*>(tokens.data),
      static_cast<const Bf16x8*>(table.data), T, V, static_cast<int>(H / 8), be.error_flags_dev);
  DF_CUDA_LAUNCH();
}

}  // namespace dflash::cuda
