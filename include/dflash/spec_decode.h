// DFlash speculative decoding, greedy, as the reference inference (z-lab dflash `dflash_generate`) runs
// it: what dflash-eval measures a drafter's acceptance length tau with.
//
// One decode step with the accepted sequence x[0..n] (x[n], the target's latest token, has no features yet):
//   1. draft:  the drafter gets the block [x[n], mask, ..., mask] (V tokens at positions n..n+V-1) and the
//              target's captured features of positions 0..n-1, and guesses d[1..V-1] (argmax of lm_head);
//   2. verify: the target runs over x[0..n] d[1..V-1]; its greedy choice p[j] at position n+j;
//   3. accept: a = the leading run of d[j+1] == p[j]; x gains d[1..a] and p[a] (the target's own token
//              comes free), so a step yields a + 1 tokens: that is the step's acceptance length.
// V = B, except near the token limit, where the official loop shortens the block to the rows left
// (official_verify_rows): the drafter then drafts as one of block size V would (DrafterTrainer::draft_block).
// The output equals the target's plain greedy decoding token for token (generate() vs greedy()).
//
// No KV cache: every step recomputes the target and the drafter over the whole sequence (simple and
// exact; the cost is quadratic in the length). tau does not depend on it; tokens/s is this tool's own speed,
// not a serving engine's.
#pragma once
#include <cstdint>
#include <vector>

#include "dflash/drafter.h"
#include "dflash/rng.h"
#include "dflash/target.h"
#include "dflash/tensor.h"

namespace dflash {

// Leading drafts the target confirms: the largest a <= n with draft[j] == posterior[j] for all j < a.
int accepted_prefix(const int32_t* draft, const int32_t* posterior, int n);

// Sampled decoding (the official dflash_generate at temperature > 0): the target's first and bonus tokens
// are drawn from sampling_probs(logits); drafts from the drafter's own distribution (DFlash: sampling_probs of
// its transformed logits, with the same top-p / top-k; DFlash2: the selector's sampled walk, temperature
// only); drafts are accepted by rejection sampling (accept while u q(d) < p(d); at the first rejection the
// bonus is drawn from max(0, p - q) renormalised, or p where that is all zero). Lossless in distribution.
struct SamplingSpec {
  float temperature = 0.f;  // 0 = greedy (everything above is unused)
  float top_p = 1.f;        // (0, 1]
  int top_k = 0;            // 0 = off
  uint64_t seed = 0;
};
// The official _sampling_probs: softmax(logits / T) over the top_k largest (when 0 < top_k < V), then the
// smallest leading set (by probability, descending) whose mass before each kept entry is < top_p,
// renormalised. probs [V] out.
void sampling_probs(const float* logits, int64_t V, const SamplingSpec& s, std::vector<double>& probs);

// How the official dflash_generate (z-lab dflash, dflash/model.py) counts a verification step, so that a tau
// printed here can be set beside a published one. With the sequence's latest token at index `start` and the
// limit max_length = prompt + max_new_tokens, a step runs while start + 1 < max_length; it verifies
// verify_rows = min(B, max_length - start) rows (the last block is shorter: the drafter drafts its
// verify_rows - 1 tokens as a drafter of that block size would, the target verifies them); of the accepted drafts + 1 it keeps produced = min(that, max_length - start - 1), cut
// after the first stop token among them; that is the step's acceptance length.
int official_verify_rows(int block_size, int64_t start, int64_t max_length);
struct OfficialStep {
  int produced = 0;      // the step's acceptance length (tokens kept)
  bool stopped = false;  // a stop token was among them
};
// kept: the step's accepted drafts then its bonus token (accepted <= verify_rows - 1 of them + 1).
OfficialStep official_step_count(const std::vector<int32_t>& kept, int64_t start, int64_t max_length,
                                 const std::vector<int32_t>& stop);

struct SpecDecodeResult {
  std::vector<int32_t> tokens;   // generated after the prompt; cut after the first stop token
  std::vector<int> acceptance;   // per verification step: tokens kept (official_step_count: 1..B)
  double seconds = 0;            // wall time of prefill + decode
  double tau() const;            // mean of acceptance (0 without a step)
};

class SpecDecoder {
 public:
  // target must capture drafter.config().target_layer_ids (in that order). max_tokens bounds prompt +
  // max_new_tokens + block size; buffers for it are allocated here, once.
  SpecDecoder(TargetModel& target, DrafterTrainer& drafter, const Ctx& ctx, int64_t max_tokens);
  ~SpecDecoder();
  SpecDecoder(const SpecDecoder&) = delete;
  SpecDecoder& operator=(const SpecDecoder&) = delete;

  int block_size() const { return block_; }
  int64_t max_tokens() const { return max_tokens_; }

  // Speculative decoding of up to max_new_tokens after prompt (stops after a token in stop).
  SpecDecodeResult generate(const std::vector<int32_t>& prompt, int max_new_tokens,
                            const std::vector<int32_t>& stop);
  // Sampled decoding for the following generate() calls (temperature 0: greedy again); reseeds the draws.
  void set_sampling(const SamplingSpec& s);
  // The target alone, greedy, one token per forward: what generate() must reproduce.
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int max_new_tokens,
                              const std::vector<int32_t>& stop);

 private:
  // Target forward over seq (one sequence); features and final_norm land in the target buffers.
  void target_forward(const std::vector<int32_t>& seq);
  // Greedy tokens at positions [first, first + count) of the last target_forward.
  void target_argmax(int64_t first, int count, std::vector<int32_t>& out);
  // The drafter's V-1 guesses for the block of V = block_rows rows anchored at x.size()-1, from the target
  // features of the positions before it (of the last target_forward over seq_len tokens).
  void draft(const std::vector<int32_t>& x, int64_t seq_len, int block_rows, std::vector<int32_t>& out);
  // At temperature > 0: the drafter's draws and their draft distributions, q_rows[j] over q_ids[j] (DFlash: the
  // whole vocabulary, q_ids empty; DFlash2: the K candidates).
  void draft_sampled(const std::vector<int32_t>& x, int64_t seq_len, int block_rows, std::vector<int32_t>& out);
  int32_t draw(const std::vector<double>& p);
  // Rows [first, first + count) of the target's logits of the last target_forward into host_logits_.
  void target_logits(int64_t first, int count);

  TargetModel& target_;
  DrafterTrainer& drafter_;
  Ctx ctx_;
  int block_ = 0, k_ = 0;
  int64_t hidden_ = 0, vocab_ = 0, max_tokens_ = 0;
  int32_t mask_token_ = 0;
  Buffer tgt_features_, tgt_final_norm_, drf_features_, logits_;
  std::vector<float> host_logits_;
  PackedBatch batch_;
  SamplingSpec sampling_;
  Rng rng_;
  Buffer draft_logits_;                        // [B-1, V] (DFlash at T > 0)
  std::vector<std::vector<double>> q_rows_;   // per draft row: its draft distribution
  std::vector<int32_t> q_ids_;                // DFlash2: [block_rows - 1, K] the candidates q_rows_ are over
};

}  // namespace dflash
