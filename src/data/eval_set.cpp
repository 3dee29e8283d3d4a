// The packed eval set: include/dflash/eval_set.h.
#include "dflash/eval_set.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "dflash/error.h"

namespace dflash {

namespace {

// "812", "51.9 K", "4.6 M": counts as the startup lines print them.
std::string count_text(double n) {
  char b[32];
  if (n < 1e3) std::snprintf(b, sizeof b, "%.0f", n);
  else if (n < 1e6) std::snprintf(b, sizeof b, "%.1f K", n / 1e3);
  else std::snprintf(b, sizeof b, "%.1f M", n / 1e6);
  return b;
}

// "2 GiB", "40 KiB", "1.5 MiB": binary units, no decimals when whole.
std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char b[32];
  if (bytes == static_cast<double>(static_cast<int64_t>(bytes))) std::snprintf(b, sizeof b, "%.0f %s", bytes, units[u]);
  else std::snprintf(b, sizeof b, "%.1f %s", bytes, units[u]);
  return b;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The sample's shuffle: a constant, so every rank, run, split and resume draws the same records.
constexpr uint64_t kEvalSampleSeed = 0xe7a15a3b1e5e7ull;

}  // namespace

int64_t EvalBudget::tokens_per_drafter() const {
  DF_ASSERT(bytes_per_token > 0 && bytes_per_drafter > 0);
  return static_cast<int64_t>(static_cast<double>(bytes_per_drafter) / bytes_per_token);
}

int64_t resolve_eval_max_tokens(int64_t given, const EvalBudget& budget, int num_drafters) {
  const int64_t one = budget.tokens_per_drafter();
  if (given <= 0) return one;  // auto
  const int64_t all = one * std::max(1, num_drafters);
  DF_CHECK_HINT(given <= all, BadOptions,
                "--eval-max-tokens " << given << " is more than the drafters can keep: " << bytes_text(static_cast<double>(budget.bytes_per_drafter))
                                     << " of eval features per drafter at " << bytes_text(budget.bytes_per_token)
                                     << " per token (this drafter's shape) hold " << one << " tokens per drafter, "
                                     << all << " over " << num_drafters << " drafter(s)",
                "give --eval-max-tokens " + std::to_string(all) + " or less, or auto (" + std::to_string(one) +
                    " tokens: one drafter's budget, the same sample on every split)");
  return given;
}

EvalSelection select_eval_records(const std::vector<int64_t>& record_lengths, int64_t token_budget, LongRecord policy,
                                  int64_t max_tokens, const std::string& path) {
  DF_CHECK(token_budget > 0 && max_tokens > 0, Internal, "select_eval_records: budget " << token_budget << ", max " << max_tokens);
  EvalSelection s;
  s.file_records = static_cast<int64_t>(record_lengths.size());
  s.max_tokens = max_tokens;
  // What each record adds when evaluated: its tokens up to the budget; 0 when --long-record skip drops it.
  auto take = [&](int64_t len) -> int64_t {
    if (len <= 0 || (len > token_budget && policy == LongRecord::Skip)) return 0;
    return std::min(len, token_budget);
  };
  int64_t eligible = 0, shortest = 0;
  for (int64_t len : record_lengths) {
    const int64_t t = take(len);
    if (t == 0) continue;
    s.file_tokens += t;
    ++eligible;
    shortest = shortest == 0 ? t : std::min(shortest, t);
  }
  if (s.file_tokens <= max_tokens) {  // the whole file, as before there was a budget
    s.lengths = record_lengths;
    s.records = eligible;
    s.tokens = s.file_tokens;
    return s;
  }
  std::vector<int64_t> order(record_lengths.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  uint64_t state = kEvalSampleSeed;
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[splitmix64(state) % i]);
  s.lengths.assign(record_lengths.size(), 0);
  for (int64_t r : order) {
    const int64_t t = take(record_lengths[static_cast<size_t>(r)]);
    if (t == 0 || s.tokens + t > max_tokens) continue;
    s.lengths[static_cast<size_t>(r)] = record_lengths[static_cast<size_t>(r)];
    s.tokens += t;
    ++s.records;
  }
  s.left_out = eligible - s.records;
  DF_CHECK_HINT(s.records > 0, BadOptions,
                "--eval-max-tokens " << max_tokens << " holds no record of --eval-data " << path << " (its shortest has "
                                     << shortest << " tokens)",
                "raise --eval-max-tokens, or give a held-out file of shorter records");
  return s;
}

std::string eval_sample_line(const EvalSelection& s, const std::string& path, bool automatic, const EvalBudget& budget) {
  if (s.left_out == 0) return "";
  std::string line = "[dflash] eval: " + path + " has " + std::to_string(s.file_records) + " records (" +
                     count_text(static_cast<double>(s.file_tokens)) + " tokens); using " + std::to_string(s.records) +
                     " records (" + count_text(static_cast<double>(s.tokens)) +
                     " tokens), a fixed sample that fits --eval-max-tokens ";
  if (automatic)
    line += "auto (" + count_text(static_cast<double>(s.max_tokens)) + " tokens: " +
            bytes_text(static_cast<double>(budget.bytes_per_drafter)) + " of eval features per drafter at " +
            bytes_text(budget.bytes_per_token) + " per token, this drafter's shape); give --eval-max-tokens to choose";
  else
    line += std::to_string(s.max_tokens);
  return line;
}

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

EvalSet load_eval_set(const TokenDataset& ds, int64_t token_budget, LongRecord policy, EvalSelection selection) {
  EvalSet s;
  s.path = ds.path();
  DF_CHECK(selection.lengths.size() == ds.num_records(), Internal,
           "eval selection of " << selection.lengths.size() << " records for a file of " << ds.num_records());
  s.records = selection.records;
  for (int64_t len : selection.lengths)
    if (len > token_budget) (policy == LongRecord::Skip ? s.records_skipped : s.records_cut)++;
  const std::vector<std::vector<EvalPiece>> batches = plan_eval_batches(selection.lengths, token_budget, policy);
  s.selection = std::move(selection);
  for (const std::vector<EvalPiece>& plan : batches) {
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

void check_eval_share_fits(const std::vector<int64_t>& batch_tokens, int num_drafters, const EvalBudget& budget,
                           const std::string& path) {
  const int64_t tokens = max_share_tokens(batch_tokens, num_drafters);
  if (tokens <= budget.tokens_per_drafter()) return;
  DF_FAIL(BadOptions,
          "--eval-data " << path << ": a drafter's share of the eval batches (" << tokens << " tokens) would hold "
                         << bytes_text(budget.bytes_per_token * static_cast<double>(tokens))
                         << " of target features on its host, more than its "
                         << bytes_text(static_cast<double>(budget.bytes_per_drafter)) << " (" << budget.tokens_per_drafter()
                         << " tokens at " << bytes_text(budget.bytes_per_token) << " per token)",
          "lower --eval-max-tokens (the batches do not split evenly over " + std::to_string(num_drafters) +
              " drafter(s)), or give auto: " + std::to_string(budget.tokens_per_drafter()) +
              " tokens, one drafter's budget, which fits any split");
}

}  // namespace dflash
