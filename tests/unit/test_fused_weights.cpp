// The targets' fused projection weights (src/model/qwen3_weights.cpp, qwen35_weights.cpp): the checkpoint's
// q/k/v_proj rows land in one qkv_proj and gate/up_proj in one gate_up_proj, in that order, and the views
// q_proj ... up_proj are those row ranges, holding exactly the checkpoint's tensors. (The golden forward
// tests check the fused forward end to end; this names the tensor when a row range is off.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dflash/hf_config.h"
#include "dflash/safetensors.h"
#include "model/qwen35_config.h"
#include "model/qwen35_weights.h"
#include "model/qwen3_weights.h"

namespace dflash {
namespace {

const std::string kGolden = std::string(DFLASH_TEST_DATA) + "/golden";

std::vector<float> host(const Tensor& t) {
  EXPECT_EQ(t.device, Device::CPU);
  EXPECT_EQ(t.dtype, DType::F32);
  const float* p = t.ptr<float>();
  return {p, p + t.numel()};
}

std::vector<float> from_checkpoint(Checkpoint& ckpt, const std::string& name) {
  const TensorInfo& t = ckpt.get(name);
  std::vector<float> v(t.numel());
  ckpt.load_f32(name, t.shape, v.data());
  return v;
}

// `view` is rows [row0, row0 + rows) of `fused` and holds the checkpoint tensor `name`.
void expect_part(Checkpoint& ckpt, const std::string& name, const Tensor& view, const Buffer& fused, int64_t row0) {
  SCOPED_TRACE(name);
  ASSERT_EQ(view.ndim, 2);
  EXPECT_EQ(view.data, fused.t().slice_rows(row0, row0 + view.shape[0]).data);
  EXPECT_EQ(view.shape[1], fused.t().shape[1]);
  EXPECT_EQ(host(view), from_checkpoint(ckpt, name));
}

TEST(FusedWeights, Qwen3ProjectionsAreRowSlicesOfTheFusedBuffers) {
  const std::string dir = kGolden + "/qwen3-tiny-a/target";
  const Qwen3Config c = load_qwen3_config(dir + "/config.json");
  Checkpoint ckpt(dir);
  const Qwen3Weights w = load_qwen3_weights(ckpt, c, cpu_ctx(), DType::F32);
  const int64_t q_dim = int64_t(c.num_attention_heads) * c.head_dim, kv_dim = int64_t(c.num_key_value_heads) * c.head_dim;
  const int64_t I = c.intermediate_size;
  ASSERT_EQ(w.layers.size(), size_t(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const Qwen3LayerWeights& L = w.layers[l];
    const std::string p = c.weight_prefix + "layers." + std::to_string(l) + ".";
    EXPECT_EQ(L.qkv_proj.t().shape[0], q_dim + 2 * kv_dim);
    EXPECT_EQ(L.gate_up_proj.t().shape[0], 2 * I);
    expect_part(ckpt, p + "self_attn.q_proj.weight", L.q_proj, L.qkv_proj, 0);
    expect_part(ckpt, p + "self_attn.k_proj.weight", L.k_proj, L.qkv_proj, q_dim);
    expect_part(ckpt, p + "self_attn.v_proj.weight", L.v_proj, L.qkv_proj, q_dim + kv_dim);
    expect_part(ckpt, p + "mlp.gate_proj.weight", L.gate_proj, L.gate_up_proj, 0);
    expect_part(ckpt, p + "mlp.up_proj.weight", L.up_proj, L.gate_up_proj, I);
  }
}

TEST(FusedWeights, Qwen35MlpProjectionsAreRowSlicesOfTheFusedBuffer) {
  const std::string dir = kGolden + "/qwen35-tiny-a/target";
  const Qwen35Config c = load_qwen35_config(dir + "/config.json");
  Checkpoint ckpt(dir);
  const Qwen35Weights w = load_qwen35_weights(ckpt, c, cpu_ctx(), DType::F32);
  const int64_t I = c.text.intermediate_size;
  ASSERT_EQ(w.layers.size(), size_t(c.text.num_hidden_layers));
  for (int l = 0; l < c.text.num_hidden_layers; ++l) {
    const Qwen35LayerWeights& L = w.layers[l];
    const std::string p = c.text.weight_prefix + "layers." + std::to_string(l) + ".";
    EXPECT_EQ(L.gate_up_proj.t().shape[0], 2 * I);
    expect_part(ckpt, p + "mlp.gate_proj.weight", L.gate_proj, L.gate_up_proj, 0);
    expect_part(ckpt, p + "mlp.up_proj.weight", L.up_proj, L.gate_up_proj, I);
  }
}

}  // namespace
}  // namespace dflash
