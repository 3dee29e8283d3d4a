#include "model/capture_stack.h"

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/ops.h"

namespace dflash {

CapturePlan plan_captures(const std::vector<int>& capture_layers, int num_layers, const std::string& dir) {
  const int L = num_layers;
  CapturePlan plan;
  plan.slot.assign(L, -1);
  plan.repeat_slots.assign(L, {});
  for (size_t i = 0; i < capture_layers.size(); ++i) {
    const int l = capture_layers[i];
    DF_CHECK_HINT(l >= 0 && l < L, BadOptions,
                  "capture layer " << l << " is out of range: the target " << dir << " has " << L
                                   << " decoder layers (ids 0.." << L - 1 << ")",
                  "layer id l is the output of decoder layer l (HF hidden_states[l + 1]); check the drafter's "
                  "target_layer_ids");
    if (plan.slot[l] < 0) {
      plan.slot[l] = static_cast<int>(i);
    } else {  // legal (default ids of a small target can repeat); the layer is written once, then copied
      plan.repeat_slots[l].push_back(static_cast<int>(i));
    }
  }
  return plan;
}

void check_packed_batch(const PackedBatch& batch, int64_t max_tokens, int64_t vocab_size,
                        std::vector<int32_t>& positions) {
  const int64_t T = batch.num_tokens();
  const int nseq = batch.num_seqs();
  DF_CHECK(T > 0 && T <= max_tokens, BadInput,
           "packed batch of " << T << " tokens; the target was built for 1.." << max_tokens);
  DF_CHECK(nseq >= 1 && nseq <= max_tokens && batch.cu_seqlens.front() == 0 && batch.cu_seqlens.back() == T,
           BadInput, "cu_seqlens must run from 0 to " << T << " over 1.." << max_tokens << " sequences");
  for (int s = 0; s < nseq; ++s) {
    const int32_t b = batch.cu_seqlens[s], e = batch.cu_seqlens[s + 1];
    DF_CHECK(b <= e, BadInput, "cu_seqlens decreases at sequence " << s << " (" << b << " > " << e << ")");
    for (int32_t t = b; t < e; ++t) positions[t] = t - b;  // positions restart at 0 per sequence
  }
  for (int64_t t = 0; t < T; ++t)
    DF_CHECK_HINT(batch.tokens[t] >= 0 && batch.tokens[t] < vocab_size, BadInput,
                  "token id " << batch.tokens[t] << " at position " << t << " is outside the target's vocabulary [0, "
                              << vocab_size << ")",
                  "the dataset was tokenized for a different model");
}

DeviceBatch::DeviceBatch(Device device, int64_t max_tokens_)
    : tokens(device, DType::I32, {max_tokens_}),
      pos(device, DType::I32, {max_tokens_}),
      cu_seqlens(device, DType::I32, {max_tokens_ + 1}),
      pos_host(static_cast<size_t>(max_tokens_)),
      max_tokens(max_tokens_) {}

Tensor DeviceBatch::upload(const Ctx& ctx, const PackedBatch& batch, int64_t vocab_size) {
  check_packed_batch(batch, max_tokens, vocab_size, pos_host);
  const int64_t T = batch.num_tokens(), ncu = static_cast<int64_t>(batch.num_seqs()) + 1;
  const Tensor cu = cu_seqlens.t().slice_rows(0, ncu);
  copy_tensor(ctx, tokens.t().slice_rows(0, T), cpu_view(batch.tokens.data(), {T}));
  copy_tensor(ctx, pos.t().slice_rows(0, T), cpu_view(pos_host.data(), {T}));
  copy_tensor(ctx, cu, cpu_view(batch.cu_seqlens.data(), {ncu}));
  return cu;
}

void check_capture_out(const CaptureOut& out, int64_t num_captures, int64_t T, int64_t H, DType act, Device device) {
  const int64_t k = num_captures;
  DF_CHECK(k == 0 || (out.features.ndim == 3 && out.features.shape[0] == k && out.features.shape[1] == T &&
                      out.features.shape[2] == H && out.features.dtype == act && out.features.device == device),
           Internal, "CaptureOut.features is " << out.features.shape_str() << " " << dtype_name(out.features.dtype)
                                               << ", expected [" << k << ", " << T << ", " << H << "] "
                                               << dtype_name(act) << " on " << device_name(device));
  DF_CHECK(out.final_norm.empty() || (out.final_norm.ndim == 2 && out.final_norm.shape[0] == T &&
                                      out.final_norm.shape[1] == H && out.final_norm.dtype == act),
           Internal, "CaptureOut.final_norm is " << out.final_norm.shape_str() << ", expected [" << T << ", " << H
                                                 << "] " << dtype_name(act));
}

void capture_stack_forward(const Ctx& ctx, const CapturePlan& plan, const Buffer (&stream)[2], int64_t T, int64_t H,
                           const CaptureOut& out, const Tensor& final_norm_weight, float eps,
                           const LayerForward& layer_forward) {
  // Without a final norm to produce (a CE job sends none), the layers after the last captured one feed
  // nothing: stop there. Qwen3-8B with the 5-layer default ids runs 34 of its 36 layers, Qwen3.6-27B 62 of 64.
  int L = static_cast<int>(plan.slot.size());
  if (out.final_norm.empty()) {
    int last = -1;
    for (int l = 0; l < L; ++l)
      if (plan.slot[l] >= 0) last = l;
    L = last + 1;
  }
  Tensor in = stream[0].t().slice_rows(0, T);
  for (int l = 0; l < L; ++l) {
    Tensor dst;
    if (plan.slot[l] >= 0) {
      dst = out.features.slice_rows(plan.slot[l], plan.slot[l] + 1).reshape({T, H});
    } else {
      dst = stream[in.data == stream[0].t().data ? 1 : 0].t().slice_rows(0, T);
    }
    layer_forward(l, in, dst);
    for (int slot : plan.repeat_slots[l])
      copy_tensor(ctx, out.features.slice_rows(slot, slot + 1).reshape({T, H}), dst);
    in = dst;
  }
  if (!out.final_norm.empty()) ops::rmsnorm_forward(ctx, out.final_norm, Tensor(), in, final_norm_weight, eps);
}

}  // namespace dflash
