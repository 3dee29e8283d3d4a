// Times qkv_norm_rope_forward alone (kernels/qkv_norm_rope.cu): each kernel variant in one process on the
// same data, next to a device-to-device copy of as many bytes (the streaming ceiling of this card, in the
// same call), and checks every variant's q, k, v bit for bit against the first variant's. The target forward
// calls the op once per layer (src/model/qwen3_target.cpp), so 36 calls at the Qwen3-8B default shape.
//
//   bench_qkv_norm_rope                                  the Qwen3-8B layer: 16384 tokens, 32 + 8 heads of 128
//   bench_qkv_norm_rope --tokens 32768 --heads 64 --kv-heads 8       (Qwen3-32B)
//   bench_qkv_norm_rope --variants block,warp              the kernel before and the default
//   options: --tokens N (16384), --heads N (32), --kv-heads N (8), --head-dim N (128), --rotary-dim N (0 = hd),
//            --variants a,b,... (block,warp6,warp12,warp24; cuda::QkvNormRopeKernel: block = the
//            block-per-token kernel, warp = warp12), --iters N (20), --warmup N (5), --json
// same: "yes" (or "NO") for a variant's outputs against the first variant's, "NaN" where the first left an
// element unwritten.
//
// Bytes: the fused row read and q, k, v written, bf16 (4 x T x (heads + 2 kv-heads) x hd); GB/s = bytes /
// median. A variant the shape does not reach (hd not 64/128/256, partial RoPE) runs the shared-memory path.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/ops.h"
#include "qkv_norm_rope.cuh"
#include "random_fill.cuh"

using namespace dflash;
using cuda::QkvNormRopeKernel;

namespace {

struct Variant {
  const char* name;
  QkvNormRopeKernel kernel;
};
constexpr Variant kVariants[] = {{"block", QkvNormRopeKernel::Block},
                                 {"warp", QkvNormRopeKernel::Default},
                                 {"warp6", QkvNormRopeKernel::Warp6},
                                 {"warp12", QkvNormRopeKernel::Warp12},
                                 {"warp24", QkvNormRopeKernel::Warp24}};

std::vector<uint16_t> download(const Tensor& t) {
  std::vector<uint16_t> h(t.numel());
  BENCH_CUDA(cudaMemcpy(h.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Writer w("bench_qkv_norm_rope", argc, argv);
  int64_t T = 16384, nh = 32, nkv = 8, hd = 128;
  int rotary_dim = 0, iters = 20, warmup = 5;
  std::string variants = "block,warp6,warp12,warp24";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      DF_CHECK(i + 1 < argc, BadOptions, a << " needs a value");
      return argv[++i];
    };
    if (a == "--tokens") T = std::atoll(next().c_str());
    else if (a == "--heads") nh = std::atoll(next().c_str());
    else if (a == "--kv-heads") nkv = std::atoll(next().c_str());
    else if (a == "--head-dim") hd = std::atoll(next().c_str());
    else if (a == "--rotary-dim") rotary_dim = std::atoi(next().c_str());
    else if (a == "--variants") variants = next();
    else if (a == "--iters") iters = std::atoi(next().c_str());
    else if (a == "--warmup") warmup = std::atoi(next().c_str());
    else DF_FAIL(BadOptions, "unknown option " << a, "see the usage at the top of bench/qkv_norm_rope_bench.cpp");
  }
  DF_CHECK(T > 0 && nh > 0 && nkv > 0 && hd > 0 && iters > 0 && warmup >= 0, BadOptions,
           "--tokens, --heads, --kv-heads, --head-dim and --iters must be positive");
  std::vector<const Variant*> chosen;
  std::stringstream list(variants);
  for (std::string name; std::getline(list, name, ',');) {
    const Variant* found = nullptr;
    for (const Variant& v : kVariants)
      if (name == v.name) found = &v;
    DF_CHECK(found, BadOptions, "--variants: unknown variant '" << name << "' (block, warp, warp6, warp12, warp24)");
    chosen.push_back(found);
  }
  DF_CHECK(cuda_device_count() > 0, DeviceFailure, "no CUDA device visible");
  Ctx ctx = make_ctx(Device::CUDA, 0);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);

  const int64_t width = (nh + 2 * nkv) * hd;
  Buffer qkv(Device::CUDA, DType::BF16, {T, width}), copy(Device::CUDA, DType::BF16, {T, width});
  Buffer q(Device::CUDA, DType::BF16, {T, nh, hd}), k(Device::CUDA, DType::BF16, {T, nkv, hd}),
      v(Device::CUDA, DType::BF16, {T, nkv, hd});
  Buffer q_norm(Device::CUDA, DType::BF16, {hd}), k_norm(Device::CUDA, DType::BF16, {hd}),
      pos(Device::CUDA, DType::I32, {T});
  cuda::fill_random(ctx, qkv, 71, 0.f, 2.f);
  cuda::fill_random(ctx, q_norm, 72, 1.f, 0.2f);
  cuda::fill_random(ctx, k_norm, 73, 1.f, 0.2f);
  std::vector<int32_t> p(T);
  for (int64_t i = 0; i < T; ++i) p[i] = static_cast<int32_t>(i);  // one sequence of T tokens
  copy_tensor(ctx, pos, cpu_view(p.data(), {T}));
  const ops::RopeSpec rope{1e6f, rotary_dim};
  const float eps = 1e-6f;
  const double bytes = 4.0 * T * width;  // bf16: the row read, q, k, v written

  w.begin(bench::device_line(0), bench::timing_line(warmup, iters));
  w.meta("shape", bench::format("qkv [%lld, %lld] -> q [%lld, %lld, %lld], k and v [%lld, %lld, %lld], rotary_dim %d (0: hd)",
                                (long long)T, (long long)width, (long long)T, (long long)nh, (long long)hd,
                                (long long)T, (long long)nkv, (long long)hd, rotary_dim));
  w.meta("bytes", bench::format("%.1f MB a call (bf16 row read + q, k, v written); copy: cudaMemcpyAsync of the row",
                                bytes / 1e6));
  w.meta("cases", "copy: the device-to-device copy of as many bytes; then each variant of cuda::QkvNormRopeKernel; "
                  "same: its q, k, v bit for bit those of the first variant (outputs poisoned with NaN before each)");
  w.columns({bench::text("case", 8), bench::num("tokens", "", 0), bench::num("heads", "", 0),
             bench::num("kv_heads", "", 0), bench::num("hd", "", 0), bench::num("ms", "ms", 4, 8),
             bench::num("min_ms", "ms", 4, 8), bench::num("gbps", "GB/s", 0, 6), bench::text("same", 4)});
  auto row = [&](const char* name, const std::vector<double>& ms, const char* same) {
    const double med = bench::median(ms), mn = *std::min_element(ms.begin(), ms.end());
    w.row({name, T, nh, nkv, hd, med, mn, bytes / 1e9 / (med * 1e-3), same});
  };
  row("copy",
      bench::time_calls(ctx, warmup, iters, [&] {
        BENCH_CUDA(cudaMemcpyAsync(copy.t().data, qkv.t().data, qkv.t().nbytes(), cudaMemcpyDeviceToDevice, stream));
      }, [] {}),
      "-");

  std::vector<uint16_t> first_q, first_k, first_v;
  for (size_t n = 0; n < chosen.size(); ++n) {
    cuda::set_qkv_norm_rope_kernel(chosen[n]->kernel);
    for (const Buffer* b : {&q, &k, &v}) BENCH_CUDA(cudaMemsetAsync(b->t().data, 0xff, b->t().nbytes(), stream));
    const std::vector<double> ms = bench::time_calls(ctx, warmup, iters, [&] {
      ops::qkv_norm_rope_forward(ctx, q, k, v, qkv.t(), q_norm, k_norm, pos, rope, eps);
    }, [] {});
    std::vector<uint16_t> hq = download(q), hk = download(k), hv = download(v);
    const char* same = "-";
    if (n == 0) {
      // The poison left anywhere (random inputs give no NaN): an element no kernel wrote.
      for (const auto* h : {&hq, &hk, &hv})
        if (std::find(h->begin(), h->end(), uint16_t(0xffff)) != h->end()) same = "NaN";
      first_q = std::move(hq), first_k = std::move(hk), first_v = std::move(hv);
    } else {
      same = hq == first_q && hk == first_k && hv == first_v ? "yes" : "NO";
    }
    row(chosen[n]->name, ms, same);
  }
  cuda::set_qkv_norm_rope_kernel(QkvNormRopeKernel::Default);
  return 0;
}
