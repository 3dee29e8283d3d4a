// A drafter's share of the held-out eval set (--eval-data, docs/pipeline.md "Evaluation"): its features
// arrive once at startup (DrafterEndpoint::receive_eval), stay on the host in the backend's dtype (an fp8 wire's batch
// dequantized first: --hs-dtype), and every
// --eval-every steps (and after the last) go through DrafterTrainer::evaluate on fixed anchors. The sums
// over the drafters make one /eval row.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "dflash/device_async.h"
#include "dflash/drafter.h"
#include "dflash/eval_stats.h"
#include "dflash/hs_wire.h"
#include "dflash/tensor.h"
#include "job.h"

namespace dflash {

class DrafterEval {
 public:
  DrafterEval(const JobContext& job, int block_size);
  DrafterEval(const DrafterEval&) = delete;
  DrafterEval& operator=(const DrafterEval&) = delete;

  // The node target that forwards each batch of the share, in batch order (DrafterEndpoint::receive_eval).
  const std::vector<int>& senders() const { return senders_; }
  // Keeps a received eval batch: checks it is one of this drafter's, with the tokens this rank packed
  // itself, and copies its values (HsCodec::decode of b) to the host.
  void keep(const HsBatch& b, const HsValues& values);
  bool complete() const;
  int64_t num_batches() const { return static_cast<int64_t>(share_.size()); }
  // Evaluates this drafter's share with the trainer's current weights (forward only, fixed anchors).
  EvalSums evaluate(DrafterTrainer& trainer);

  // The fixed anchors of eval batch `index`: drawn once by a generator seeded from the index alone (not
  // --seed), so a row is comparable across steps, runs and topologies; by the training's rule
  // (--max-anchors, --anchors-per-record), so eval numbers mean what the training's do.
  static std::vector<int64_t> fixed_anchors(const PackedBatch& batch, int64_t index, const TrainOptions& opt);

 private:
  struct Kept {
    int64_t index = -1;              // in the packed eval set
    const PackedBatch* batch = nullptr;
    std::vector<int64_t> anchors;
    HostBuffer features, final_norm;  // the backend's dtype, [k, T, H] and [T, H]
    bool received = false;
  };
  Tensor host_view(const Kept& k, const HostBuffer& buf, bool features) const;

  const JobContext& job_;
  int block_size_;
  std::vector<Kept> share_;         // this drafter's batches, by position in its share
  std::vector<int> senders_;        // node target index of each kept batch
  // CUDA: the device buffers a kept batch is uploaded into before evaluate (made on first use, sized for
  // the largest batch of the share). On the CPU the host copy is the trainer's input itself (a view).
  Buffer device_features_, device_final_norm_;
};

}  // namespace dflash
