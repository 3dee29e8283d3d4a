// The hidden-state batch and the small messages that travel with it (docs/pipeline.md "Protocol").
//
// One type on both backends: a header and the host index arrays (tokens, cu_seqlens, loss mask) plus the
// captured tensors, which live where the job's backend computes (host float32 on the CPU backend, device
// bf16 on CUDA). A target's forward writes straight into a send buffer's tensors, a drafter trains
// straight from a slot's; a DataPlane (data_plane.h) moves them, the roles never touch their bytes.
#pragma once
#include <cstdint>
#include <vector>

#include "dflash/data_position.h"
#include "dflash/gpu_reading.h"
#include "dflash/packed_batch.h"
#include "dflash/tensor.h"

namespace dflash {

// ---- wire format ---------------------------------------------------------------------------------
// Small host messages (MPI, always): drafter -> target on kTagToTarget, target -> drafter on kTagToDrafter.
enum class ControlKind : int32_t {
  Credit = 1,     // drafter -> target: slot `slot` is yours to fill
  Stop = 2,       // drafter -> target: the run has its steps; send end-of-data now
  Fin = 3,        // drafter -> target: all your batches arrived; no more messages from me
  EndOfData = 4,  // target -> drafter: `value` = batches I sent you in total
};
struct ControlMsg {
  ControlKind kind = ControlKind::Credit;
  int32_t slot = -1;
  int64_t value = 0;
  int64_t end_index = -1;  // EndOfData: the target's loader batch index after its last batch (--batch-order fixed)
};
// They travel on kTagToTarget / kTagToDrafter (include/dflash/message_tags.h).

// What a target reports about itself, cumulative since its start; carried in every batch header so the
// metrics writer learns about every target without extra messages.
struct TargetReport {
  int32_t rank = -1;
  int32_t q_pre = 0;           // loader queue depth when the batch left
  int64_t batches = 0;         // batches sent
  int64_t tokens = 0;
  double compute_s = 0;        // forward
  double credit_wait_s = 0;    // holding a batch, waiting for a credit (throttled by the drafters)
  double data_wait_s = 0;      // waiting for the loader
  double send_wait_s = 0;      // waiting for a send buffer to drain
  double epoch_progress = 0;   // fractional epochs done by this target's loader
  double time_s = 0;           // since the job started, when the report was made
  GpuReading gpu;              // this target's GPU (NVML, at most 1 s old; valid = 0 without NVML)
};

// What a batch is for. Eval batches (--eval-data) travel once, before training, on the same plane and
// credits; the drafter keeps their features (docs/pipeline.md "Evaluation").
enum class BatchKind : int64_t { Train = 0, Eval = 1 };

// First message of every batch: sizes, so the receiver knows how much of each pre-posted buffer holds data.
struct BatchHeader {
  int64_t num_tokens = 0;      // T
  int64_t num_seqs = 0;
  int64_t num_layers = 0;      // k captured layers
  int64_t hidden = 0;          // H
  int64_t has_final_norm = 0;  // 1 when the final-norm hidden state [T, H] follows
  int64_t batch_index = 0;     // the target's loader batch index (Eval: the index in the packed eval set)
  BatchKind kind = BatchKind::Train;
  DataPosition next_position;  // the target's loader position right after this batch (checkpoints)
  int64_t seq = 0;             // n-th batch (0-based) this target sent to this drafter: the drafter trains
                               // each target's batches in this order even if slots complete out of order
                               // (eval batches count too: they are the first ones)
  TargetReport report;
};

// --hs-dtype: the form hidden states travel in between a target's forward and a drafter's step, on every
// data plane (docs/fp8.md "The FP8 wire").
enum class HsDType : uint8_t {
  Backend,  // "bf16": the backend's activation dtype as the forward wrote it (BF16 on CUDA, F32 on the CPU
            // backend, whose reference arithmetic is float32 throughout)
  Fp8,      // "fp8": e4m3 codes with one float32 scale per token row (amax / 448, speculators' FP8
            // connector); the target quantizes after its forward, the drafter dequantizes before its step
};
const char* hs_dtype_name(HsDType d);  // the option's spelling: "bf16", "fp8"

// Sizes of one batch's buffers (the largest batch a target may send) and where its tensors live.
struct SlotShape {
  int64_t max_tokens = 0;
  int64_t num_layers = 0;   // k captured layers
  int64_t hidden = 0;       // H
  bool final_norm = false;  // the KL objective's teacher input [T, H] travels too
  Device device = Device::CPU;  // where features / final_norm live
  DType dtype = DType::F32;     // the backend's activation dtype: F32 on the CPU backend, BF16 on CUDA (what
                                // the forward writes and the drafter reads)
  HsDType wire = HsDType::Backend;

  int64_t rows(int64_t tokens) const { return tokens * (num_layers + (final_norm ? 1 : 0)); }  // token rows of H
  // Bytes of one batch of `tokens` tokens on the wire and in a slot: every part (hs_batch.cpp lays them out).
  size_t wire_bytes(int64_t tokens) const;
  size_t slot_bytes() const { return wire_bytes(max_tokens); }
  // The same per token, without the alignment padding of an fp8 part: what a rate or a budget is scaled by.
  double wire_bytes_per_token() const;
  // Bytes of `tokens` tokens' values in the backend's dtype (what the forward writes, the drafter reads,
  // an fp8 end's staging holds and a drafter keeps of an eval batch).
  size_t value_bytes(int64_t tokens) const { return static_cast<size_t>(rows(tokens) * hidden) * dtype_size(dtype); }
  const char* wire_name() const;  // "bf16" / "f32" (the backend's dtype, as it travels) or "fp8"
};

// One part of a batch as it travels: `count` elements of `dtype` (F32 or BF16 on the Backend wire; bytes
// (U8) on the fp8 wire: the e4m3 codes [rows, H], padded to 16 bytes, then the float32 scales [rows]).
struct WirePart {
  void* data = nullptr;
  DType dtype = DType::U8;
  size_t count = 0;
  size_t bytes() const { return count * dtype_size(dtype); }
};

// An fp8 part's two tensors: codes [rows, H] (F8E4M3) and scales [rows] (F32).
struct Fp8Rows {
  Tensor codes;
  Tensor scales;
};

// One send buffer or receive slot. Allocated once for max_tokens; a filled batch uses the prefix.
class HsBatch {
 public:
  explicit HsBatch(const SlotShape& s);
  HsBatch(const HsBatch&) = delete;
  HsBatch& operator=(const HsBatch&) = delete;

  const SlotShape shape;
  BatchHeader header;
  // Host index arrays. While empty they have max_tokens (+1) entries (receives land in them);
  // set_filled() trims them to the batch, clear() restores the capacity (no reallocation either way).
  PackedBatch batch;
  // Backend wire: [k, max_tokens, H] used as [k, T, H] and [max_tokens, H] used as [T, H], of shape.dtype.
  // fp8 wire: bytes (U8), an fp8 part of k max_tokens and of max_tokens rows (WirePart).
  Buffer features;
  Buffer final_norm;  // empty unless shape.final_norm

  // Target side: copies the packed batch in and fills the header's sizes.
  void fill_from(const PackedBatch& b);
  // Receiver side: the header arrived with the index arrays; trims them to its sizes.
  void set_filled();
  void clear();

  int64_t num_tokens() const { return header.num_tokens; }
  // The Backend wire only (the fp8 wire's batch holds codes: HsCodec, dflash/hs_wire.h, gives the values).
  Tensor features_view() const;    // [k, T, H] of the filled batch
  Tensor final_norm_view() const;  // [T, H], or empty
  // The fp8 wire only: the codes and scales of the batch of header.num_tokens tokens.
  Fp8Rows feature_rows() const;     // [k T, H], [k T]
  Fp8Rows final_norm_rows() const;  // [T, H], [T]; empty unless shape.final_norm
  // What the planes move, for the batch of header.num_tokens tokens (every wire) ...
  WirePart feature_part() const;
  WirePart final_norm_part() const;  // count 0 unless shape.final_norm
  // ... and the whole buffers a receive is posted into.
  WirePart feature_capacity() const;
  WirePart final_norm_capacity() const;
  size_t feature_bytes() const { return feature_part().bytes(); }
  size_t final_norm_bytes() const { return final_norm_part().bytes(); }
};

}  // namespace dflash
