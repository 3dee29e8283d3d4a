// The target part of dflash-selftest: the frozen target forward on the case's packed tokens, every
// decoder layer's output, the final norm and the logits against golden.safetensors.
#include <cstring>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/safetensors.h"
#include "dflash/target.h"
#include "selftest/selftest.h"

namespace dflash {
namespace {

std::vector<int32_t> golden_i32(SafetensorsFile& g, const std::string& name) {
  const TensorInfo& t = g.get(name);  // fatal BadInput naming it when missing
  DF_CHECK(t.dtype == DType::I32 && t.shape.size() == 1, BadInput,
           g.path() << ": " << name << " must be a 1-d I32 tensor, is " << dtype_name(t.dtype) << " "
                    << t.shape_str());
  std::vector<int32_t> v(t.numel());
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

// The golden tensor `name` as float32, checked to have `shape`.
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

std::vector<float> download(const Ctx& ctx, const Tensor& t) {
  std::vector<float> host(t.numel());
  Tensor dst = t;
  dst.data = host.data();
  dst.dtype = DType::F32;
  dst.device = Device::CPU;
  copy_tensor(ctx, dst, t);
  return host;
}

}  // namespace

int selftest_target(const std::string& case_dir, const Ctx& ctx, SelftestReport& report) {
  SafetensorsFile golden(case_dir + "/golden.safetensors");
  PackedBatch batch;
  batch.tokens = golden_i32(golden, "tokens");
  batch.cu_seqlens = golden_i32(golden, "cu_seqlens");
  const int64_t T = batch.num_tokens();
  DF_CHECK(T > 0, BadInput, golden.path() << ": no tokens");

  const std::string target_dir = case_dir + "/target";
  const TargetConfig cfg = load_target_config(target_dir);
  std::vector<int> layers(cfg.text.num_hidden_layers);
  for (int l = 0; l < cfg.text.num_hidden_layers; ++l) layers[l] = l;
  const std::unique_ptr<TargetModel> model = make_target_model(cfg, target_dir, ctx, layers, T);
  const Qwen3Config& c = model->config();
  const int64_t L = c.num_hidden_layers, H = c.hidden_size, V = c.vocab_size;
  report.note("target: " + target_dir + ": " + target_family_name(cfg.family) + ", " + std::to_string(L) +
              " layers, hidden " + std::to_string(H) + ", heads " + std::to_string(c.num_attention_heads) + "/" +
              std::to_string(c.num_key_value_heads) + " x " + std::to_string(c.head_dim) + ", intermediate " +
              std::to_string(c.intermediate_size) + ", vocab " + std::to_string(V));
  report.note("batch: " + std::to_string(T) + " tokens in " + std::to_string(batch.num_seqs()) + " sequences");

  const DType act = model->activation_dtype();
  Buffer features(ctx.device, act, {L, T, H}), final_norm(ctx.device, act, {T, H}), logits(ctx.device, act, {T, V});
  model->forward(batch, CaptureOut{features.t(), final_norm.t()});
  model->lm_head_forward(logits, final_norm);
  synchronize(ctx);

  const double tol = forward_tolerance(ctx.device, L + 1);  // the final norm and logits; hidden[l]: l + 1 layers
  const std::vector<float> got_hidden = download(ctx, features);
  const std::vector<float> ref_hidden = golden_f32(golden, "target.hidden", {L, T, H});
  const size_t layer_n = static_cast<size_t>(T * H);
  for (int64_t l = 0; l < L; ++l)
    report.compare("target.hidden[" + std::to_string(l) + "]", {T, H}, got_hidden.data() + l * layer_n,
                   ref_hidden.data() + l * layer_n, layer_n, forward_tolerance(ctx.device, l + 1));
  report.compare("target.final_norm", {T, H}, download(ctx, final_norm).data(),
                 golden_f32(golden, "target.final_norm", {T, H}).data(), layer_n, tol);
  if (golden.has("target.logits")) {
    report.compare("target.logits", {T, V}, download(ctx, logits).data(),
                   golden_f32(golden, "target.logits", {T, V}).data(), static_cast<size_t>(T * V), tol);
  } else {
    report.note("golden.safetensors has no target.logits: logits not compared");
  }
  return 0;
}

}  // namespace dflash
