// Anchor sampling for DFlash training (its generator, Rng, is dflash/rng.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dflash/packed_batch.h"
#include "dflash/rng.h"

namespace dflash {

// Draws the anchors of a packed batch among its valid positions p (global token index): loss_mask[p] and
// loss_mask[p + 1], with p + 1 in the same record (sequence). Returned sorted. Two rules:
//   per_record == 0 (per batch): up to max_anchors uniformly without replacement among all valid
//     positions of the batch; every valid position is taken when there are at most max_anchors.
//   per_record  > 0 (per record, the reference trainers' rule): in each record up to per_record
//     uniformly without replacement among that record's valid positions (all of them when it has at
//     most per_record), so every record with a valid position gets anchors; when these draws exceed
//     max_anchors in all (the cap sizes the drafter's buffers), max_anchors of them are kept, uniformly
//     without replacement among the draws (a record's expected share stays proportional to its draws).
// Both consume the generator only where they subsample, so per_record == 0 draws exactly what the
// per-batch sampler always has.
class AnchorSampler {
 public:
  explicit AnchorSampler(uint64_t seed) : rng_(seed) {}
  std::vector<int64_t> sample(const PackedBatch& batch, int max_anchors, int per_record = 0);
  std::string state() const { return rng_.state(); }
  void set_state(const std::string& s) { rng_.set_state(s); }

 private:
  Rng rng_;
  std::vector<int64_t> valid_;  // reused between calls
  // A uniform sample without replacement of k of v's entries, moved to its front (partial Fisher-Yates;
  // no draw when k >= v.size()).
  void take(std::vector<int64_t>& v, size_t k);
};

// The reference trainers' density (SpecForge, speculators, Model-Optimizer, TorchSpec): up to 512 anchors
// per sequence of <= 3072 tokens.
constexpr int64_t kReferenceSequenceTokens = 3072;
// The per-batch cap (--max-anchors) when --anchors-per-record N is given without one: the reference's
// density over the batch, N anchors per kReferenceSequenceTokens of token_budget (rounded up, at least N),
// so a batch of full-length records is not subsampled. A memory bound like any cap: the job and --dry-run
// print it.
int default_max_anchors(int per_record, int64_t token_budget);
// "up to N anchors per record, at most M per batch" / "up to M anchors per packed batch" (startup, --dry-run).
std::string anchor_rule_summary(int max_anchors, int per_record);

// Positions p eligible as anchors (as above), in increasing order.
void valid_anchor_positions(const PackedBatch& batch, std::vector<int64_t>& out);

}  // namespace dflash
