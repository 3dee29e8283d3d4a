// The parts of a target forward that do not depend on the decoder layer's kind, used by the decoder stack
// both target families build on (src/model/decoder_stack.h) and by the benches that mirror it:
// which CaptureOut.features slot each layer writes, the checks on a packed batch and its upload, the checks
// on CaptureOut, and the layer stack itself.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dflash/target.h"
#include "dflash/tensor.h"

namespace dflash {

// Where each decoder layer's output goes. A captured layer writes straight into its slot of
// CaptureOut.features, so captures cost no copy; a layer listed twice is copied into its later slots.
struct CapturePlan {
  std::vector<int> slot;                       // [L] per layer: index into features, or -1
  std::vector<std::vector<int>> repeat_slots;  // [L] per layer: further slots listing the same layer
};

// Plans capture_layers (ids of the target at dir, which has num_layers decoder layers); an id out of
// range is BadOptions.
CapturePlan plan_captures(const std::vector<int>& capture_layers, int num_layers, const std::string& dir);

// Checks the batch on the host (so every backend reports the same error): 1..max_tokens tokens,
// well-formed cu_seqlens, tokens inside [0, vocab_size) (BadInput otherwise). Writes each token's
// position, restarting at 0 per sequence, into positions[0..T).
void check_packed_batch(const PackedBatch& batch, int64_t max_tokens, int64_t vocab_size,
                        std::vector<int32_t>& positions);  // positions [>= T]

// The packed batch as the embedding and the attention read it on the backend's device, allocated once for
// max_tokens by each target.
struct DeviceBatch {
  Buffer tokens, pos;             // [max_tokens] I32: token ids, positions restarting per sequence
  Buffer cu_seqlens;              // [max_tokens + 1] I32
  std::vector<int32_t> pos_host;  // [max_tokens]
  int64_t max_tokens = 0;

  DeviceBatch() = default;
  DeviceBatch(Device device, int64_t max_tokens);
  // check_packed_batch (BadInput for a bad batch), then tokens, positions and cu_seqlens to the device.
  // Returns the cu_seqlens rows in use, [num_seqs + 1].
  Tensor upload(const Ctx& ctx, const PackedBatch& batch, int64_t vocab_size);
};

// Checks the forward's outputs (Internal: the caller allocates them): features [num_captures, T, H] of
// dtype act on device (unchecked when nothing is captured), final_norm [T, H] of dtype act or empty.
void check_capture_out(const CaptureOut& out, int64_t num_captures, int64_t T, int64_t H, DType act, Device device);

// One decoder layer: dst [T, H] = layer(in [T, H]); in and dst are different buffers.
using LayerForward = std::function<void(int layer, const Tensor& in, const Tensor& dst)>;

// Runs the decoder layers over the embedded tokens in rows [0, T) of stream[0]: captured layers write
// into their features slot, the others alternate between the two stream buffers. Then
// out.final_norm = rmsnorm(last layer's output) * final_norm_weight; when out.final_norm is empty, the
// layers after the last captured one are not run at all (nothing would read them).
void capture_stack_forward(const Ctx& ctx, const CapturePlan& plan,
                           const Buffer (&stream)[2],  // [max_tokens, H] each
                           int64_t T, int64_t H, const CaptureOut& out,
                           const Tensor& final_norm_weight,  // [H]
                           float eps, const LayerForward& layer_forward);

}  // namespace dflash
