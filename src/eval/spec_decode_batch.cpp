// SpecDecoder's decoding loop, several prompts at a time (include/dflash/spec_decode.h): each step drafts
// every running prompt, packs all their sequences into one target forward, then verifies each.
#include <algorithm>
#include <chrono>
#include <map>
#include <string>

#include "dflash/error.h"
#include "eval/spec_decode_lane.h"

namespace dflash {

namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

int32_t argmax_row(const float* row, int64_t V) {
  return static_cast<int32_t>(std::max_element(row, row + V) - row);  // first of equal maxima
}

}  // namespace

uint64_t prompt_seed(uint64_t seed, uint64_t stream) { return splitmix64(splitmix64(seed) + stream); }

int64_t packed_reservation(size_t prompt_tokens, int max_new_tokens) {
  return static_cast<int64_t>(prompt_tokens) + max_new_tokens;
}

int64_t packed_tokens_for(const std::vector<size_t>& prompt_tokens, int max_new_tokens, int prompt_batch,
                          int64_t limit, const char* what) {
  std::vector<int64_t> need;
  for (size_t m : prompt_tokens) need.push_back(packed_reservation(m, max_new_tokens));
  std::sort(need.begin(), need.end(), std::greater<>());
  DF_CHECK(prompt_batch >= 1, Internal, "packed tokens for a batch of " << prompt_batch);
  if (need.empty()) return 0;
  DF_CHECK_HINT(need[0] <= limit, BadOptions,
                what << " " << limit << " holds no batch: the longest prompt with its new tokens needs " << need[0]
                     << " tokens in one target forward",
                std::string("raise ") + what + ", or lower the new tokens or the longest prompt allowed");
  int64_t sum = 0;
  for (size_t i = 0; i < need.size() && i < static_cast<size_t>(prompt_batch); ++i) sum += need[i];
  return std::min(sum, limit);
}

SpecDecodeResult SpecDecoder::generate(const std::vector<int32_t>& prompt, int max_new_tokens,
                                       const std::vector<int32_t>& stop) {
  return std::move(generate_batch({DecodePrompt{&prompt, 0}}, max_new_tokens, stop)[0]);
}

int SpecDecoder::verify(Lane& lane, int64_t row0, int block_rows, int32_t& bonus) {
  const int V = block_rows;
  const std::vector<int32_t>& d = lane.drafts;
  int a = 0;
  if (sampling_.temperature <= 0.f) {
    // the target's choice row by row up to the first draft it rejects (accepted_prefix over all V rows, without
    // reading the rows after it)
    int32_t posterior = argmax_row(logits_row(row0), vocab_);
    while (a < V - 1 && d[static_cast<size_t>(a)] == posterior) posterior = argmax_row(logits_row(row0 + ++a), vocab_);
    bonus = posterior;
    return a;
  }
  std::vector<double>& p = lane.p_work;
  auto target_probs = [&](int r) { sampling_probs(logits_row(row0 + r), vocab_, sampling_, p); };
  // the draft probability of token t at row j: q over the vocabulary (DFlash) or over the candidates
  auto q_of = [&](int j, int32_t t) {
    if (lane.q_ids.empty()) return lane.q_rows[j][static_cast<size_t>(t)];
    const size_t K = lane.q_rows[j].size();
    double q = 0;
    for (size_t i = 0; i < K; ++i) q += lane.q_ids[j * K + i] == t ? lane.q_rows[j][i] : 0.0;
    return q;
  };
  for (; a < V - 1; ++a) {  // accept while u q(d) < p(d)
    target_probs(a);
    if (!(lane.rng.uniform() * q_of(a, d[a]) < p[static_cast<size_t>(d[a])])) break;
  }
  target_probs(a);  // row a: the bonus's distribution (all accepted: the last verified row, p itself)
  if (a == V - 1) {
    bonus = draw_from(p, lane.rng);
    return a;
  }
  std::vector<double>& r = lane.r_work;  // the residual max(0, p - q), renormalised; p itself where it is all zero
  r = p;
  if (lane.q_ids.empty()) {
    for (size_t v = 0; v < r.size(); ++v) r[v] -= lane.q_rows[a][v];
  } else {
    const size_t K = lane.q_rows[a].size();
    for (size_t i = 0; i < K; ++i) r[static_cast<size_t>(lane.q_ids[a * K + i])] -= lane.q_rows[a][i];
  }
  double total = 0;
  for (double& v : r) total += v = std::max(v, 0.0);
  bonus = draw_from(total > 0 ? r : p, lane.rng);
  return a;
}

std::vector<SpecDecodeResult> SpecDecoder::generate_batch(const std::vector<DecodePrompt>& prompts, int max_new_tokens,
                                                          const std::vector<int32_t>& stop,
                                                          const std::function<void()>& each_step) {
  using clock = std::chrono::steady_clock;
  for (const DecodePrompt& p : prompts) {
    const int64_t m = p.ids ? static_cast<int64_t>(p.ids->size()) : 0;
    DF_CHECK(m >= 1 && max_new_tokens >= 1 && m + max_new_tokens + block_ <= max_tokens_, BadOptions,
             "a prompt of " << m << " tokens + " << max_new_tokens << " new + block " << block_ << " exceeds "
                            << max_tokens_ << " tokens");
  }
  const bool sampled = sampling_.temperature > 0.f;
  std::vector<SpecDecodeResult> results(prompts.size());
  std::vector<Lane> lanes;
  std::vector<std::pair<int64_t, int>> rows;  // per lane: its logits rows in the packed forward
  size_t next = 0;
  int64_t reserved = 0;  // packed tokens the running lanes may reach
  while (next < prompts.size() || !lanes.empty()) {
    // Admit prompts in order while the batch and the packed tokens allow (one alone always fits: the
    // constructor's check); a prompt's prefill rides in this step's forward.
    while (next < prompts.size() && static_cast<int>(lanes.size()) < prompt_batch_) {
      const std::vector<int32_t>& ids = *prompts[next].ids;
      const int64_t need = packed_reservation(ids.size(), max_new_tokens);
      if (reserved + need > packed_tokens_) break;
      Lane lane;
      lane.index = next;
      lane.m = static_cast<int64_t>(ids.size());
      lane.max_length = lane.m + max_new_tokens;  // the official loop's bound (official_step_count)
      lane.x = ids;
      lane.rng = Rng(prompt_seed(sampling_.seed, prompts[next].stream));
      lane.t0 = clock::now();
      lanes.push_back(std::move(lane));
      reserved += need;
      ++next;
    }
    DF_CHECK(!lanes.empty(), Internal, "no prompt fits the packed forward of " << packed_tokens_ << " tokens");
    auto lap = [t = clock::now()](double& into) mutable {
      const clock::time_point now = clock::now();
      into += std::chrono::duration<double>(now - t).count();
      t = now;
    };
    // Draft: every lane past its prefill, a block of V rows anchored at its latest token x[n] (V = B, or
    // near the limit the rows left: the official loop's verify_size).
    // The lanes of one block size draft together, as many per drafter forward as it takes (sampled: each
    // lane then draws from its own generator).
    std::map<int, std::vector<Lane*>> by_rows;
    for (Lane& l : lanes)
      if (l.prefilled) by_rows[official_verify_rows(block_, static_cast<int64_t>(l.x.size()) - 1, l.max_length)].push_back(&l);
    auto draft_part = [&](const std::vector<Lane*>& part, int V) {
      if (sampled) draft_sampled_together(part, V);
      else draft_together(part, V);
    };
    for (const auto& [V, group] : by_rows) {
      std::vector<Lane*> part;
      int64_t tokens = 0;
      for (Lane* l : group) {
        const int64_t need = static_cast<int64_t>(l->x.size()) - 1 + block_;
        if (!part.empty() && (static_cast<int>(part.size()) == draft_anchors_ || tokens + need > draft_tokens_)) {
          draft_part(part, V);
          part.clear();
          tokens = 0;
        }
        part.push_back(l);
        tokens += need;
      }
      if (!part.empty()) draft_part(part, V);
      for (Lane* l : group)
        DF_CHECK(static_cast<int>(l->drafts.size()) == V - 1, Internal, l->drafts.size() << " drafts for a block of " << V);
    }
    lap(times_.draft);
    // One target forward over every lane's sequence: the prompt (prefill) or x[0..n] + its drafts.
    batch_.tokens.clear();
    batch_.cu_seqlens.assign(1, 0);
    rows.clear();
    for (Lane& l : lanes) {
      l.offset = batch_.num_tokens();
      batch_.tokens.insert(batch_.tokens.end(), l.x.begin(), l.x.end());
      if (l.prefilled) batch_.tokens.insert(batch_.tokens.end(), l.drafts.begin(), l.drafts.end());
      l.seq_len = batch_.num_tokens() - l.offset;
      batch_.cu_seqlens.push_back(static_cast<int32_t>(batch_.num_tokens()));
      if (l.prefilled) rows.emplace_back(l.offset + static_cast<int64_t>(l.x.size()) - 1, static_cast<int>(l.drafts.size()) + 1);
      else rows.emplace_back(l.offset + l.m - 1, 1);
    }
    batch_.loss_mask.assign(batch_.tokens.size(), 0);
    target_forward();
    target_logits(rows);
    lap(times_.target);
    // Verify and append, each lane on its own (its logits rows start at row0[i]; host threads share the lanes).
    std::vector<int64_t> row0s(lanes.size());
    for (size_t i = 0, at = 0; i < lanes.size(); at += static_cast<size_t>(rows[i].second), ++i) row0s[i] = static_cast<int64_t>(at);
    parallel_for(lanes.size(), [&](size_t i) {
      Lane& l = lanes[i];
      const int64_t row0 = row0s[i];
      if (!l.prefilled) {  // the target's first token
        int32_t first;
        if (sampled) {
          std::vector<double> p;
          sampling_probs(logits_row(row0), vocab_, sampling_, p);
          first = draw_from(p, l.rng);
        } else {
          first = argmax_row(logits_row(row0), vocab_);
        }
        l.x.push_back(first);
        l.prefilled = true;
        l.done = is_stop(first, stop);
      } else {
        const int64_t n = static_cast<int64_t>(l.x.size()) - 1;
        const int V = rows[i].second;
        int32_t bonus = 0;
        const int a = verify(l, row0, V, bonus);
        std::vector<int32_t> kept(l.drafts.begin(), l.drafts.begin() + a);
        kept.push_back(bonus);
        const OfficialStep step = official_step_count(kept, n, l.max_length, stop);
        l.x.insert(l.x.end(), kept.begin(), kept.begin() + step.produced);
        l.done = step.stopped;
        l.res.acceptance.push_back(step.produced);
      }
      l.done = l.done || static_cast<int64_t>(l.x.size()) >= l.max_length;
    });
    // Finished lanes leave; their results are final.
    for (Lane& l : lanes) {
      if (!l.done) continue;
      const int64_t end = std::min<int64_t>(static_cast<int64_t>(l.x.size()), l.max_length);
      l.res.tokens.assign(l.x.begin() + l.m, l.x.begin() + end);
      for (size_t i = 0; i < l.res.tokens.size(); ++i)
        if (is_stop(l.res.tokens[i], stop)) {
          l.res.tokens.resize(i + 1);
          break;
        }
      l.res.seconds = std::chrono::duration<double>(clock::now() - l.t0).count();
      reserved -= packed_reservation(static_cast<size_t>(l.m), max_new_tokens);
      results[l.index] = std::move(l.res);
    }
    lanes.erase(std::remove_if(lanes.begin(), lanes.end(), [](const Lane& l) { return l.done; }), lanes.end());
    lap(times_.verify);
    ++times_.steps;
    if (each_step) each_step();
  }
  return results;
}

}  // namespace dflash
