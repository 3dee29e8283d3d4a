// The target's config read once, and the one place that maps a target family to its implementation
// (docs/architecture.md "Targets"). Everything a family cannot do on a backend is
// refused here, before a weight is read.
#include "dflash/target.h"

#include "dflash/error.h"
#include "model/qwen35_config.h"
#include "model/qwen35_target.h"
#include "ops/gated_delta.h"
#include "model/qwen3_target.h"
#include "model/qwen3_weights.h"
#include "ops/attention_head_dim.h"

namespace dflash {

const char* target_family_name(TargetFamily f) {
  switch (f) {
    case TargetFamily::Qwen3: return "qwen3";
    case TargetFamily::Qwen35Hybrid: return "qwen3.5-hybrid";
  }
  return "?";
}

TargetConfig load_target_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const nlohmann::json j = read_config_json(path);
  check_target_config_supported(j, path, is_qwen35_config(j));  // another family, biases, quantized: refused
  TargetConfig c;
  c.quant = parse_target_quantization(j, path);
  if (is_qwen35_config(j)) {
    auto hybrid = std::make_shared<Qwen35Config>(parse_qwen35_config(j, path));
    c.family = TargetFamily::Qwen35Hybrid;
    c.text = hybrid->text;
    c.qwen35 = std::move(hybrid);
  } else {
    c.family = TargetFamily::Qwen3;
    c.text = parse_qwen3_config(j, path);
    check_qwen3_target_config(c.text, path);  // sizes, full attention: refused now rather than at load
  }
  return c;
}

std::unique_ptr<TargetModel> make_target_model(const TargetConfig& cfg, const std::string& dir, const Ctx& ctx,
                                               std::vector<int> capture_layers, int64_t max_tokens) {
  // The attention kernels of ctx's backend serve only some head dims (256 at most on CUDA): refused here,
  // before any weight is read, rather than as an internal error in the first forward.
  DF_CHECK_HINT(ops::attention_head_dim_supported(ctx.device, cfg.text.head_dim), BadOptions,
                "the target " << dir << " has head_dim " << cfg.text.head_dim << "; attention on the "
                              << device_name(ctx.device) << " backend supports head dims "
                              << ops::attention_head_dims_text(ctx.device),
                ctx.device == Device::CUDA ? "run with --backend cpu" : "check config.json");
  switch (cfg.family) {
    case TargetFamily::Qwen3:
      return make_qwen3_target(cfg.text, cfg.quant, dir, ctx, std::move(capture_layers), max_tokens);
    case TargetFamily::Qwen35Hybrid:
      DF_ASSERT(cfg.qwen35 != nullptr);
      if (ctx.device == Device::CUDA) {
        // The CUDA delta rule's tiles take key/value head dims that are multiples of 8 up to 128 (every
        // released Qwen3.5/3.6 has 128): anything else is refused before a weight is read.
        const ops::GdnHeads gh = cfg.qwen35->gdn_heads();
        auto fits = [](int64_t d) { return d >= 8 && d <= 128 && d % 8 == 0; };
        DF_CHECK_HINT(fits(gh.dk) && fits(gh.dv), BadOptions,
                      "the target " << dir << " has Gated DeltaNet head dims " << gh.dk << " (key) / " << gh.dv
                                    << " (value); the cuda backend's delta rule takes multiples of 8 up to 128",
                      "run with --backend cpu");
      }
      return make_qwen35_target(*cfg.qwen35, cfg.quant, dir, ctx, std::move(capture_layers), max_tokens);
  }
  DF_FAIL(Internal, "unknown target family " << static_cast<int>(cfg.family), "");
}

}  // namespace dflash
