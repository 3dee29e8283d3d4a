// The target part of dflash-selftest: the frozen target forward on the case's packed tokens, every
// decoder layer's output, the final norm and the logits against golden.safetensors; forward_case also
// runs the FP8 part's forward (fp8_case.cpp).
#include <cstring>
#include <functional>
#include <utility>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/safetensors.h"
#include "dflash/target.h"
#include "dflash/target_quant.h"
#include "selftest/selftest.h"

namespace dflash {

std::vector<int32_t> golden_i32(SafetensorsFile& g, const std::string& name) {
  const TensorInfo& t = g.get(name);  // fatal BadInput naming it when missing
  DF_CHECK(t.dtype == DType::I32 && t.shape.size() == 1, BadInput,
           g.path() << ": " << name << " must be a 1-d I32 tensor, is " << dtype_name(t.dtype) << " "
                    << t.shape_str());
  std::vector<int32_t> v(t.numel());
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

std::vector<float> golden_f32(SafetensorsFile& g, const std::string& name, const std::vector<int64_t>& shape) {
  const TensorInfo& t = g.get(name);
  std::string want = "[";
  for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
  DF_CHECK(t.shape == shape, BadInput,
           g.path() << ": " << name << " has shape " << t.shape_str() << ", but the target produces " << want
                    << "]");
  std::vector<float> v(t.numel());
  to_f32(v.data(), t.data, t.dtype, v.size());
  return v;
}

std::vector<float> download_f32(const Ctx& ctx, const Tensor& t) {
  std::vector<float> host(t.numel());
  Tensor dst = t;
  dst.data = host.data();
  dst.dtype = DType::F32;
  dst.device = Device::CPU;
  copy_tensor(ctx, dst, t);
  return host;
}

CaseForward forward_case(const std::string& case_dir, const Ctx& ctx, const std::string& precision,
                         SelftestReport& report) {
  SafetensorsFile golden(case_dir + "/golden.safetensors");
  PackedBatch batch;
  batch.tokens = golden_i32(golden, "tokens");
  batch.cu_seqlens = golden_i32(golden, "cu_seqlens");
  const int64_t T = batch.num_tokens();
  DF_CHECK(T > 0, BadInput, golden.path() << ": no tokens");

  const std::string target_dir = case_dir + "/target";
  TargetConfig cfg = load_target_config(target_dir);
  resolve_target_precision(cfg.quant, precision);  // "" keeps the checkpoint's own
  std::vector<int> layers(cfg.text.num_hidden_layers);
  for (int l = 0; l < cfg.text.num_hidden_layers; ++l) layers[l] = l;
  const std::unique_ptr<TargetModel> model = make_target_model(cfg, target_dir, ctx, layers, T);
  const Qwen3Config& c = model->config();
  CaseForward f;
  f.L = c.num_hidden_layers, f.T = T, f.H = c.hidden_size, f.V = c.vocab_size;
  if (precision.empty()) {
    report.note("target: " + target_dir + ": " + target_family_name(cfg.family) + ", " + std::to_string(f.L) +
                " layers, hidden " + std::to_string(f.H) + ", heads " + std::to_string(c.num_attention_heads) +
                "/" + std::to_string(c.num_key_value_heads) + " x " + std::to_string(c.head_dim) +
                ", intermediate " + std::to_string(c.intermediate_size) + ", vocab " + std::to_string(f.V));
    report.note("batch: " + std::to_string(T) + " tokens in " + std::to_string(batch.num_seqs()) + " sequences");
  }

  const DType act = model->activation_dtype();
  Buffer features(ctx.device, act, {f.L, T, f.H}), final_norm(ctx.device, act, {T, f.H});
  model->forward(batch, CaptureOut{features.t(), final_norm.t()});
  if (precision.empty()) {
    Buffer logits(ctx.device, act, {T, f.V});
    model->lm_head_forward(logits, final_norm);
    synchronize(ctx);
    f.logits = download_f32(ctx, logits);
  }
  synchronize(ctx);
  f.hidden = download_f32(ctx, features);
  f.final_norm = download_f32(ctx, final_norm);
  return f;
}

void compare_forward(SelftestReport& report, SafetensorsFile& golden, const std::string& prefix, const CaseForward& f,
                     const std::function<double(int64_t)>& tolerance) {
  const int64_t L = f.L, T = f.T, H = f.H;
  const std::vector<float> ref_hidden = golden_f32(golden, prefix + ".hidden", {L, T, H});
  const size_t layer_n = static_cast<size_t>(T * H);
  for (int64_t l = 0; l < L; ++l)
    report.compare(prefix + ".hidden[" + std::to_string(l) + "]", {T, H}, f.hidden.data() + l * layer_n,
                   ref_hidden.data() + l * layer_n, layer_n, tolerance(l + 1));
  report.compare(prefix + ".final_norm", {T, H}, f.final_norm.data(),
                 golden_f32(golden, prefix + ".final_norm", {T, H}).data(), layer_n, tolerance(L + 1));
}

int selftest_target(const std::string& case_dir, const Ctx& ctx, SelftestReport& report, CaseForward* forward_out) {
  CaseForward f = forward_case(case_dir, ctx, "", report);
  SafetensorsFile golden(case_dir + "/golden.safetensors");
  const auto tolerance = [&](int64_t layers_passed) { return forward_tolerance(ctx.device, layers_passed); };
  compare_forward(report, golden, "target", f, tolerance);
  if (golden.has("target.logits")) {  // after the final norm: as many layers passed
    report.compare("target.logits", {f.T, f.V}, f.logits.data(), golden_f32(golden, "target.logits", {f.T, f.V}).data(),
                   static_cast<size_t>(f.T * f.V), tolerance(f.L + 1));
  } else {
    report.note("golden.safetensors has no target.logits: logits not compared");
  }
  if (forward_out) *forward_out = std::move(f);
  return 0;
}

}  // namespace dflash
