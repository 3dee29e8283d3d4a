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
//
// Several prompts decode together (generate_batch, dflash-eval --prompt-batch): each step drafts every
// running prompt (their blocks in one drafter forward, DrafterTrainer::draft_blocks; at T > 0 each prompt
// then draws from its own generator, its draws the same as decoding alone), then ONE
// target forward packs all their sequences (cu_seqlens: causal attention and
// positions per sequence, as a training batch), then each prompt verifies, appends and, when done, leaves;
// the next prompt takes its place (its prefill rides in the same packed forward). The host's share of a step
// (verification: a target logits row is converted from bf16 when read, greedy reads up to the first rejected
// draft; DFlash's sampled draws) runs on up to 16 threads, one prompt each. A prompt's tokens and
// acceptance lengths are what decoding it alone gives: on the CPU backend bit for bit (every op there is
// row-wise or per sequence, so a row does not see what else is packed: SpecDecodeBatch.* checks it); on
// CUDA within the bf16 GEMMs' dependence on the packed row count (tests/gpu/test_spec_decode_batch_gpu.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
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

// A prompt for generate_batch: its tokens and its stream: at temperature > 0 its draws come from
// Rng(prompt_seed(seed, stream)), so a prompt draws the same numbers whichever prompts decode beside it
// (dflash-eval: the prompt's index in --prompts' usable records).
struct DecodePrompt {
  const std::vector<int32_t>* ids = nullptr;
  uint64_t stream = 0;
};
// The seed of a prompt's generator: a mix of --seed and its stream (splitmix64), so streams do not overlap.
uint64_t prompt_seed(uint64_t seed, uint64_t stream);

// The target tokens one prompt reserves in a packed forward while it decodes: its longest verified
// sequence, prompt + max_new_tokens (the drafter's block after it is the drafter's, not packed).
int64_t packed_reservation(size_t prompt_tokens, int max_new_tokens);
// The packed capacity prompts need to decode prompt_batch at a time: the sum of the prompt_batch largest
// reservations, capped at limit, and never below the largest one (that one prompt must fit alone: fatal
// BadOptions naming `what`, the option that set limit, when it does not). No prompts: 0.
int64_t packed_tokens_for(const std::vector<size_t>& prompt_tokens, int max_new_tokens, int prompt_batch,
                          int64_t limit, const char* what);

struct SpecDecodeResult {
  std::vector<int32_t> tokens;   // generated after the prompt; cut after the first stop token
  std::vector<int> acceptance;   // per verification step: tokens kept (official_step_count: 1..B)
  double seconds = 0;            // wall time of prefill + decode
  double tau() const;            // mean of acceptance (0 without a step)
};

// Where generate_batch's wall time went, summed over its calls (each part ends in a host wait for the device,
// so on CUDA the GPU's work falls in the part that launched it): the target's packed forward and lm_head with
// the logits download; the drafter's forwards with their draws; the host's verification and bookkeeping.
struct DecodeTimes {
  double target = 0, draft = 0, verify = 0;
  int64_t steps = 0;  // packed steps
};

class SpecDecoder {
 public:
  // target must capture drafter.config().target_layer_ids (in that order). max_tokens bounds one prompt:
  // prompt + max_new_tokens + block size (the drafter's buffers). packed_tokens bounds one target forward
  // (0 = max_tokens): the prompts decoding together reserve packed_reservation each, and a prompt waits
  // while the sum would pass it; the target must have been made for that many tokens. prompt_batch: the
  // most prompts decoding together (1: one after another). Buffers for all of it are allocated here, once.
  SpecDecoder(TargetModel& target, DrafterTrainer& drafter, const Ctx& ctx, int64_t max_tokens,
              int64_t packed_tokens = 0, int prompt_batch = 1);
  ~SpecDecoder();
  SpecDecoder(const SpecDecoder&) = delete;
  SpecDecoder& operator=(const SpecDecoder&) = delete;

  int block_size() const { return block_; }
  int64_t max_tokens() const { return max_tokens_; }
  int64_t packed_tokens() const { return packed_tokens_; }
  int prompt_batch() const { return prompt_batch_; }

  // Speculative decoding of up to max_new_tokens after prompt (stops after a token in stop): one prompt,
  // stream 0.
  SpecDecodeResult generate(const std::vector<int32_t>& prompt, int max_new_tokens,
                            const std::vector<int32_t>& stop);
  // The same for each prompt, up to prompt_batch() of them decoding together; results in prompts' order.
  // A result's seconds: from its prefill to its last step (prompts decoding together overlap). each_step
  // runs after every packed step (the caller's messages keep moving).
  std::vector<SpecDecodeResult> generate_batch(const std::vector<DecodePrompt>& prompts, int max_new_tokens,
                                               const std::vector<int32_t>& stop,
                                               const std::function<void()>& each_step = {});
  const DecodeTimes& times() const { return times_; }
  // Sampled decoding for the following generate() calls (temperature 0: greedy again).
  void set_sampling(const SamplingSpec& s);
  // The target alone, greedy, one token per forward: what generate() must reproduce.
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int max_new_tokens,
                              const std::vector<int32_t>& stop);

 private:
  struct Lane;  // one prompt decoding (src/eval/spec_decode_batch.cpp)
  // Target forward over the packed batch_; features and final_norm land in the target buffers.
  void target_forward();
  // Target logits of the final_norm rows [first, first + count) of each (first, count) in rows (of the last
  // target_forward), in that order, into host_logits_ (one lm_head over all of them).
  void target_logits(const std::vector<std::pair<int64_t, int>>& rows);
  // draft_batch_ and drf_features_ for the lanes' drafts: each lane's sequence x[0..n] then its block of B
  // (anchored at x[n]), features of the positions before it (of the last target_forward, where the lane's
  // sequence starts at its offset); anchors out. At most draft_anchors_ lanes and draft_tokens_ tokens.
  FeatureBatch pack_draft(const std::vector<Lane*>& lanes, std::vector<int64_t>& anchors);
  // The drafter's V-1 greedy guesses for each lane's block of V = block_rows rows, in one drafter forward.
  void draft_together(const std::vector<Lane*>& lanes, int block_rows);
  // At temperature > 0, the same forward, then each lane's draws and their draft distributions, lane.q_rows[j]
  // over lane.q_ids[j] (DFlash: the whole vocabulary, q_ids empty; one lm_head over every block, the draws
  // lane by lane in parallel; DFlash2: the K candidates, the selector's walk). Each lane draws from its own
  // generator, as it would decoding alone.
  void draft_sampled_together(const std::vector<Lane*>& lanes, int block_rows);
  // The lane's bonus (and its acceptance) from the target's logits rows of its block (host_logits_ from row
  // `row0`): greedy or rejection sampling.
  int verify(Lane& lane, int64_t row0, int block_rows, int32_t& bonus);
  // Row r of the last target_logits, float32 on the host. On CUDA the step downloads the rows as they are
  // (bf16) and a row is converted when first asked for: verification reads a few rows of each block (greedy:
  // up to the first rejected draft), not all B x vocabulary of them. Rows of different lanes may be asked for
  // from different threads (each row's conversion is its own).
  const float* logits_row(int64_t r);
  bool logits_on_host() const;  // the CPU backend: logits_ is host float32 already (no download)
  // f(i) for i in [0, n) on up to host_threads_ threads (each i once; f must touch only what i owns).
  void parallel_for(size_t n, const std::function<void(size_t)>& f) const;

  TargetModel& target_;
  DrafterTrainer& drafter_;
  Ctx ctx_;
  int block_ = 0, k_ = 0, prompt_batch_ = 1, draft_anchors_ = 1;
  int64_t hidden_ = 0, vocab_ = 0, max_tokens_ = 0, packed_tokens_ = 0, draft_tokens_ = 0;
  int32_t mask_token_ = 0;
  // tgt_*: [k, packed, H], [packed, H]; drf_features_ [k, draft_tokens, H]; fn_rows_ [prompt_batch B, H] the
  // final_norm rows whose logits a step needs, gathered; logits_ [prompt_batch B, V]
  Buffer tgt_features_, tgt_final_norm_, drf_features_, fn_rows_, logits_;
  // host_logits_ [prompt_batch B, V] the rows converted so far (row_ready_); host_raw_ the last download in
  // logits_' dtype (CUDA; on the CPU logits_ itself is read). Allocated once.
  std::vector<float> host_logits_;
  std::vector<uint8_t> row_ready_;
  std::unique_ptr<char[]> host_raw_;
  int host_threads_ = 1;  // threads for the per-lane host work (verification, DFlash's sampled drafts)
  PackedBatch batch_, draft_batch_;
  int64_t packed_now_ = 0;  // tokens of the last target forward
  SamplingSpec sampling_;
  DecodeTimes times_;
  Buffer draft_logits_;  // [draft_anchors B, V] (DFlash at T > 0)
  std::unique_ptr<char[]> draft_raw_;  // its download (host)
};

}  // namespace dflash
