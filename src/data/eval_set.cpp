// The packed eval set: include/dflash/eval_set.h.
#include "dflash/eval_set.h"

#include <algorithm>
#include <cstdio>

#include "dflash/error.h"

namespace dflash {

std::vector<std::vector<EvalPiece>> plan_eval_batches(const std::vector<int64_t>& record_lengths, int64_t token_budget,
                                                      LongRecord policy) {
  DF_CHECK(token_budget > 0, BadOptions, "--token-budget must be positive (got " << token_budget << ")");
  std::vector<std::vector<EvalPiece>> batches;
  std::vector<EvalPiece> cur;
  int64_t in_batch = 0;
  for (size_t r = 0; r < record_lengths.size(); ++r) {
    const int64_t len = record_lengths[r];
    if (len <= 0) continue;
    if (len > token_budget && policy == LongRecord::Skip) continue;
    const int64_t take = std::min(len, token_budget);
    if (in_batch + take > token_budget) {  // whole records only: this one starts the next batch
      batches.push_back(std::move(cur));
      cur.clear();
      in_batch = 0;
    }
    cur.push_back(EvalPiece{static_cast<int64_t>(r), take});
    in_batch += take;
  }
  if (!cur.empty()) batches.push_back(std::move(cur));
  return batches;
}

int64_t EvalSet::num_seqs() const {
  int64_t n = 0;
  for (const PackedBatch& b : batches) n += b.num_seqs();
  return n;
}

std::vector<int64_t> EvalSet::batch_tokens() const {
  std::vector<int64_t> t;
  for (const PackedBatch& b : batches) t.push_back(b.num_tokens());
  return t;
}

EvalSet load_eval_set(const TokenDataset& ds, int64_t token_budget, LongRecord policy) {
  EvalSet s;
  s.path = ds.path();
  s.records = static_cast<int64_t>(ds.num_records());
  std::vector<int64_t> lengths(ds.num_records());
  for (size_t r = 0; r < lengths.size(); ++r) {
    lengths[r] = ds.record_length(r);
    if (lengths[r] > token_budget) (policy == LongRecord::Skip ? s.records_skipped : s.records_cut)++;
  }
  for (const std::vector<EvalPiece>& plan : plan_eval_batches(lengths, token_budget, policy)) {
    PackedBatch b;
    b.cu_seqlens.push_back(0);
    for (const EvalPiece& p : plan) {
      ds.read_record(static_cast<size_t>(p.record), b.tokens, b.loss_mask, p.take, /*check_file=*/false);
      b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
    }
    s.tokens += b.num_tokens();
    s.batches.push_back(std::move(b));
  }
  ds.check_unchanged();  // what was read is the file as it was opened and validated
  return s;
}

std::vector<int64_t> eval_share(int64_t num_batches, int num_drafters, int drafter_index) {
  DF_CHECK(num_drafters > 0 && drafter_index >= 0 && drafter_index < num_drafters, Internal,
           "eval_share: drafter " << drafter_index << " of " << num_drafters);
  std::vector<int64_t> mine;
  for (int64_t i = drafter_index; i < num_batches; i += num_drafters) mine.push_back(i);
  return mine;
}

}  // namespace dflash

namespace dflash {

int64_t max_share_tokens(const std::vector<int64_t>& batch_tokens, int num_drafters) {
  int64_t most = 0;
  for (int d = 0; d < num_drafters; ++d) {
    int64_t n = 0;
    for (int64_t i : eval_share(static_cast<int64_t>(batch_tokens.size()), num_drafters, d)) n += batch_tokens[static_cast<size_t>(i)];
    most = std::max(most, n);
  }
  return most;
}

std::string eval_share_summary(const std::vector<int64_t>& batch_tokens, int num_drafters) {
  const int64_t n = static_cast<int64_t>(batch_tokens.size());
  const int64_t fewest = n / num_drafters, most = (n + num_drafters - 1) / num_drafters;
  const int64_t tokens = max_share_tokens(batch_tokens, num_drafters);
  char tok[32];
  if (tokens < 1000) std::snprintf(tok, sizeof(tok), "%lld", static_cast<long long>(tokens));
  else std::snprintf(tok, sizeof(tok), "%.1fK", static_cast<double>(tokens) / 1e3);
  const std::string batches = fewest == most ? std::to_string(most) : std::to_string(fewest) + "-" + std::to_string(most);
  if (num_drafters == 1) return batches + " batch(es), " + tok + " tokens on the drafter";
  return batches + " batch(es) per drafter, at most " + tok + " tokens";
}

void check_eval_share_fits(const EvalSet& e, int num_drafters, double bytes_per_token) {
  const int64_t tokens = max_share_tokens(e.batch_tokens(), num_drafters);
  const double bytes = bytes_per_token * static_cast<double>(tokens);
  if (bytes <= static_cast<double>(kEvalShareLimitBytes)) return;
  const int64_t fit = static_cast<int64_t>(static_cast<double>(kEvalShareLimitBytes) / bytes_per_token) * num_drafters;
  char gib[32];
  std::snprintf(gib, sizeof(gib), "%.1f", bytes / 1073741824.0);
  DF_FAIL(BadOptions,
          "--eval-data " << e.path << " is too large: a drafter's share (" << tokens << " tokens) would hold " << gib
                         << " GiB of target features on its host, more than the " << (kEvalShareLimitBytes >> 30) << " GiB allowed",
          "use fewer records for the held-out set: about " + std::to_string(fit) + " tokens fit over " +
              std::to_string(num_drafters) + " drafter(s) (a few hundred sequences measure the loss well)");
}

}  // namespace dflash
