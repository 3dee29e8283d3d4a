// One prompt decoding inside SpecDecoder (include/dflash/spec_decode.h): its state between packed steps.
// Internal to src/eval.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "dflash/rng.h"
#include "dflash/spec_decode.h"

namespace dflash {

struct SpecDecoder::Lane {
  size_t index = 0;                  // into generate_batch's prompts and results
  int64_t m = 0, max_length = 0;     // prompt tokens; prompt + max_new_tokens (the official loop's limit)
  std::vector<int32_t> x, drafts;    // the accepted sequence (x[m..] generated); this step's drafts
  int64_t offset = 0, seq_len = 0;   // where its sequence starts in the last target forward, its tokens there
  bool prefilled = false;            // its prefill has run
  bool done = false;
  Rng rng;                           // at T > 0: Rng(prompt_seed(seed, stream))
  // At T > 0: per draft row, its draft distribution. Its rows keep their storage from step to step (resized,
  // not rebuilt), as do p_work and r_work (the target's distribution of a verified row, the residual): a
  // DFlash row is the whole vocabulary in doubles (1.2 MB at Qwen's 151,936), and rebuilding 15 a lane every
  // step page-faulted ~1 GB a step at 64 prompts.
  std::vector<std::vector<double>> q_rows;
  std::vector<int32_t> q_ids;               // DFlash2: [V-1, K] the candidates q_rows are over
  std::vector<double> p_work, r_work;
  std::chrono::steady_clock::time_point t0;
  SpecDecodeResult res;
};

inline bool is_stop(int32_t t, const std::vector<int32_t>& stop) {
  return std::find(stop.begin(), stop.end(), t) != stop.end();
}

// A draw from p (unnormalised) by the inverse CDF in id order (torch.multinomial's law).
int32_t draw_from(const std::vector<double>& p, Rng& rng);

}  // namespace dflash
