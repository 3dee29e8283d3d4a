// FP8 fidelity (issue 46 item 3, docs/fp8.md): the captured hidden states of a target run FP8 against the
// same target run bf16, per captured layer, relative L2 error ||fp8 - bf16|| / ||bf16|| over a packed batch
// of random tokens; and each run's forward time. The two runs are sequential (one target on the GPU at a
// time: a 27B pair would not fit), the bf16 features kept on the host.
//   bench_fp8_fidelity --target DIR [--fp8-target DIR | --precision fp8|fp8-dynamic] [--seqlens 4096,4096,4096,4096]
//                      [--capture 1,9,17,25,33]
//   --fp8-target: an FP8 checkpoint of the same weights (dflash-fp8-convert); default: DIR with
//   --target-precision PRECISION (quantized on load: fp8, the default, or fp8-dynamic). The bf16 run is
//   always DIR as stored.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/target.h"

using namespace dflash;

namespace {

std::vector<int64_t> ints(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoll(x));
  return v;
}

struct Run {
  std::vector<float> features;  // [k, T, H] as float
  double ms = 0;
};

Run run(const std::string& dir, const std::string& precision, const Ctx& ctx, const std::vector<int>& layers,
        const PackedBatch& batch) {
  TargetConfig cfg = load_target_config(dir);
  resolve_target_precision(cfg.quant, precision);
  const int64_t T = batch.num_tokens(), H = cfg.text.hidden_size, k = static_cast<int64_t>(layers.size());
  auto model = make_target_model(cfg, dir, ctx, layers, T);
  Buffer feats(ctx.device, model->activation_dtype(), {k, T, H});
  Buffer fn(ctx.device, model->activation_dtype(), {T, H});
  CaptureOut out{feats.t(), fn.t()};
  model->forward(batch, out);  // warm-up
  synchronize(ctx);
  const auto t0 = std::chrono::steady_clock::now();
  const int iters = 3;
  for (int i = 0; i < iters; ++i) model->forward(batch, out);
  synchronize(ctx);
  Run r;
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
  r.features.resize(feats.numel());
  copy_tensor(ctx, cpu_view(r.features.data(), {static_cast<int64_t>(r.features.size())}),
              feats.t().reshape({static_cast<int64_t>(feats.numel())}));
  synchronize(ctx);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string target, fp8_target, precision = "fp8", seqlens = "4096,4096,4096,4096", capture;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    DF_CHECK(i + 1 < argc, BadOptions, a << " needs a value");
    const std::string v = argv[++i];
    if (a == "--target") target = v;
    else if (a == "--fp8-target") fp8_target = v;
    else if (a == "--precision") precision = v;
    else if (a == "--seqlens") seqlens = v;
    else if (a == "--capture") capture = v;
    else DF_FAIL(BadOptions, "unknown option " << a,
                 "bench_fp8_fidelity --target DIR [--fp8-target DIR | --precision fp8|fp8-dynamic] [--seqlens ..] "
                 "[--capture ..]");
  }
  DF_CHECK(!target.empty(), BadOptions, "--target DIR is required");
  const Ctx ctx = make_ctx(cuda_device_count() > 0 ? Device::CUDA : Device::CPU, 0);
  const TargetConfig cfg = load_target_config(target);
  std::vector<int> layers;
  if (capture.empty())
    for (int l = 0; l < cfg.text.num_hidden_layers; ++l) layers.push_back(l);
  else
    for (int64_t l : ints(capture)) layers.push_back(static_cast<int>(l));
  PackedBatch batch;
  batch.cu_seqlens = {0};
  std::mt19937 rng(46);
  for (int64_t len : ints(seqlens)) {
    for (int64_t t = 0; t < len; ++t) batch.tokens.push_back(static_cast<int32_t>(rng() % cfg.text.vocab_size));
    batch.cu_seqlens.push_back(static_cast<int32_t>(batch.tokens.size()));
  }
  batch.loss_mask.assign(batch.tokens.size(), 1);
  const Run ref = run(target, "bf16", ctx, layers, batch);
  const Run fp8 = fp8_target.empty() ? run(target, precision, ctx, layers, batch) : run(fp8_target, "", ctx, layers, batch);
  const int64_t T = batch.num_tokens(), H = cfg.text.hidden_size;
  std::printf("# bench_fp8_fidelity %s vs %s, %lld tokens, %s\n", target.c_str(),
              fp8_target.empty() ? ("--target-precision " + precision).c_str() : fp8_target.c_str(), static_cast<long long>(T),
              device_name(ctx.device));
  std::printf("forward ms: bf16 %.1f  fp8 %.1f  (ratio bf16/fp8 %.3f; tok/s bf16 %.0f fp8 %.0f)\n", ref.ms, fp8.ms,
              ref.ms / fp8.ms, T / ref.ms * 1e3, T / fp8.ms * 1e3);
  for (size_t i = 0; i < layers.size(); ++i) {
    double num = 0, den = 0;
    for (int64_t j = 0; j < T * H; ++j) {
      const double a = fp8.features[i * T * H + j], b = ref.features[i * T * H + j];
      num += (a - b) * (a - b);
      den += b * b;
    }
    std::printf("layer %3d  relative L2 error %.5f\n", layers[i], std::sqrt(num / (den > 0 ? den : 1)));
  }
  return 0;
}
