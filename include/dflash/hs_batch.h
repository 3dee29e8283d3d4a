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

// Sizes of one batch's buffers (the largest batch a target may send) and where its tensors live.
struct SlotShape {
  int64_t max_tokens = 0;
  int64_t num_layers = 0;   // k captured layers
  int64_t hidden = 0;       // H
  bool final_norm = false;  // the KL objective's teacher input [T, H] travels too
  Device device = Device::CPU;  // where features / final_norm live
  DType dtype = DType::F32;     // F32 on the CPU backend, BF16 on CUDA (also the wire format)
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
  Buffer features;    // [k, max_tokens, H] used as [k, T, H]
  Buffer final_norm;  // [max_tokens, H] used as [T, H]; empty unless shape.final_norm

  // Target side: copies the packed batch in and fills the header's sizes.
  void fill_from(const PackedBatch& b);
  // Receiver side: the header arrived with the index arrays; trims them to its sizes.
  void set_filled();
  void clear();

  int64_t num_tokens() const { return header.num_tokens; }
  Tensor features_view() const;    // [k, T, H] of the filled batch
  Tensor final_norm_view() const;  // [T, H], or empty
  size_t feature_bytes() const { return features_view().nbytes(); }
  size_t final_norm_bytes() const { return shape.final_norm ? final_norm_view().nbytes() : 0; }
};

}  // namespace dflash
