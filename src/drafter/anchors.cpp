// Anchor sampling (see include/dflash/anchors.h).
#include "dflash/anchors.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "dflash/error.h"

namespace dflash {

int default_max_anchors(int per_record, int64_t token_budget) {
  DF_ASSERT(per_record >= 1 && token_budget >= 1);
  const int64_t sequences = token_budget / kReferenceSequenceTokens + (token_budget % kReferenceSequenceTokens != 0 ? 1 : 0);
  // The bound an explicit --max-anchors has (src/runtime/options.cpp): the drafter's buffers are sized by
  // it, and a derived cap must not plan terabytes and exit 0. Compared by division: --token-budget is not
  // yet bounded here, and the product could overflow.
  constexpr int64_t kMostAnchors = int64_t{1} << 20;
  const bool fits = sequences <= kMostAnchors / per_record;
  DF_CHECK_HINT(fits, BadOptions,
                "--anchors-per-record " << per_record << " with --token-budget " << token_budget
                                        << " gives a --max-anchors of " << per_record << " x " << sequences << " ("
                                        << per_record << " per " << kReferenceSequenceTokens
                                        << " tokens), above the most a batch may hold, 1048576",
                "lower --anchors-per-record (the reference uses 512), or give --max-anchors in [1, 1048576]");
  return static_cast<int>(static_cast<int64_t>(per_record) * sequences);
}

std::string anchor_rule_summary(int max_anchors, int per_record) {
  std::ostringstream os;
  if (per_record > 0)
    os << "up to " << per_record << " per record (--anchors-per-record), at most " << max_anchors
       << " per packed batch (--max-anchors: the drafter's buffers; more draws are subsampled uniformly)";
  else
    os << "up to " << max_anchors << " per packed batch (--max-anchors), uniformly among its valid positions";
  return os.str();
}

namespace {
void check_mask(const PackedBatch& batch) {
  DF_CHECK(batch.loss_mask.size() == batch.tokens.size(), BadInput,
           "loss_mask has " << batch.loss_mask.size() << " entries for " << batch.tokens.size() << " tokens");
}
// The validity rule, in one place: appends record s's valid positions to out.
void append_valid_positions(const PackedBatch& batch, int s, std::vector<int64_t>& out) {
  const int64_t b = batch.cu_seqlens[s], e = batch.cu_seqlens[s + 1];
  for (int64_t p = b; p + 1 < e; ++p)
    if (batch.loss_mask[p] && batch.loss_mask[p + 1]) out.push_back(p);
}
}  // namespace

void valid_anchor_positions(const PackedBatch& batch, std::vector<int64_t>& out) {
  out.clear();
  check_mask(batch);
  for (int s = 0; s < batch.num_seqs(); ++s) append_valid_positions(batch, s, out);
}

void AnchorSampler::take(std::vector<int64_t>& v, size_t k) {
  const size_t n = v.size();
  if (k >= n) return;  // all of them: no draw
  // Partial Fisher-Yates: the first k entries become a uniform sample without replacement.
  for (size_t i = 0; i < k; ++i) {
    const size_t j = i + static_cast<size_t>(rng_.below(n - i));
    std::swap(v[i], v[j]);
  }
}

std::vector<int64_t> AnchorSampler::sample(const PackedBatch& batch, int max_anchors, int per_record) {
  const size_t cap = static_cast<size_t>(std::max(0, max_anchors));
  std::vector<int64_t> anchors;
  if (per_record <= 0) {
    valid_anchor_positions(batch, valid_);
    const size_t k = std::min(valid_.size(), cap);
    take(valid_, k);
    anchors.assign(valid_.begin(), valid_.begin() + static_cast<std::ptrdiff_t>(k));
  } else {
    check_mask(batch);
    for (int s = 0; s < batch.num_seqs(); ++s) {  // record by record, in order
      valid_.clear();
      append_valid_positions(batch, s, valid_);
      const size_t k = std::min(valid_.size(), static_cast<size_t>(per_record));
      take(valid_, k);
      anchors.insert(anchors.end(), valid_.begin(), valid_.begin() + static_cast<std::ptrdiff_t>(k));
    }
    const size_t k = std::min(anchors.size(), cap);
    take(anchors, k);
    anchors.resize(k);
  }
  std::sort(anchors.begin(), anchors.end());
  return anchors;
}

}  // namespace dflash
