// --eval-data: the held-out set, packed once at startup in a fixed order (docs/pipeline.md "Evaluation").
//
// Every rank that needs it (targets and drafters) packs it itself with the same rule, so all of them know
// the same batch list (tokens, cu_seqlens, loss_mask) without a message: records in file order (no
// shuffle), whole records up to --token-budget as the loader packs (src/data/loader.cpp), a record longer
// than the budget cut to it or skipped (--long-record; "error" refuses such a file before anything runs).
// A file whose features would not fit the drafters' hosts is evaluated on a fixed sample of its records
// that does (--eval-max-tokens; select_eval_records), chosen by the same pure rule on every rank.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dflash/data.h"  // TokenDataset, LongRecord
#include "dflash/packed_batch.h"

namespace dflash {

// One record's part of an eval batch: its first `take` tokens.
struct EvalPiece {
  int64_t record = 0;
  int64_t take = 0;
};

// The batches of the eval set from the record lengths alone (no token read: --dry-run uses it too).
// Empty records do not exist in a valid dataset; a record longer than the budget is cut (Cut) or left out
// (Skip). Pure.
std::vector<std::vector<EvalPiece>> plan_eval_batches(const std::vector<int64_t>& record_lengths, int64_t token_budget,
                                                      LongRecord policy);

// ---- which records are evaluated (--eval-max-tokens) -----------------------------------------------
// A drafter keeps its share's features on its host (pageable memory, moved only at an evaluation): at most
// this many bytes of them. --eval-max-tokens auto fills one drafter's budget.
constexpr int64_t kEvalShareLimitBytes = int64_t{2} << 30;

struct EvalBudget {
  int64_t bytes_per_drafter = kEvalShareLimitBytes;  // (the test hook --inject-eval-budget-bytes lowers it)
  double bytes_per_token = 0;  // one token's features: captured layers (+ final norm) x hidden x the backend's dtype
  int64_t tokens_per_drafter() const;  // the tokens one drafter's budget holds
};

// --eval-max-tokens resolved (given 0 = auto). auto = what ONE drafter's budget holds, whatever the split:
// the sample is then the same on every split, so /eval rows compare across a resume on another split and a
// live --rebalance. A given N may use the budgets of all num_drafters; above that it is refused (fatal
// BadOptions, the HINT names the budget).
int64_t resolve_eval_max_tokens(int64_t given, const EvalBudget& budget, int num_drafters);

// Which of the file's records are evaluated.
struct EvalSelection {
  int64_t file_records = 0;      // records in the file
  int64_t file_tokens = 0;       // tokens the whole file would evaluate (each record cut or skipped by --long-record)
  int64_t max_tokens = 0;        // the resolved --eval-max-tokens
  std::vector<int64_t> lengths;  // per file record: its length, 0 where the sample leaves it out
  int64_t records = 0;           // records evaluated (not counting those --long-record skip drops)
  int64_t tokens = 0;            // tokens evaluated
  int64_t left_out = 0;          // records the sample leaves out (0: the whole file is evaluated)
};

// The whole file when its tokens fit max_tokens. Else a fixed sample of whole records: the file's records in
// the order of a shuffle seeded by a constant (not --seed: the same sample on every rank, run, split and
// resume), each taken while the sample stays within max_tokens (one that would pass it is passed over and
// the next one tried); packed in file order like the whole set. Pure but for the refusal of a max_tokens
// that holds no record (fatal BadOptions naming `path`).
EvalSelection select_eval_records(const std::vector<int64_t>& record_lengths, int64_t token_budget, LongRecord policy,
                                  int64_t max_tokens, const std::string& path);
// The startup line of a sample ("[dflash] eval: FILE has 2000 records (4.6 M tokens); using 63 records
// (51.9 K tokens), a fixed sample that fits --eval-max-tokens auto (...)"), "" for the whole file.
std::string eval_sample_line(const EvalSelection& s, const std::string& path, bool automatic, const EvalBudget& budget);

struct EvalSet {
  std::string path;
  EvalSelection selection;      // the records evaluated
  int64_t records = 0;          // evaluated (the file's, or the sample's)
  int64_t records_cut = 0;      // longer than the budget, cut to it
  int64_t records_skipped = 0;  // longer than the budget, left out
  int64_t tokens = 0;           // tokens packed (what is evaluated)
  std::vector<PackedBatch> batches;
  int64_t num_seqs() const;
  std::vector<int64_t> batch_tokens() const;  // tokens of each batch
};

// Reads and packs the selected records (their features are held on the drafters' hosts: a bounded set).
EvalSet load_eval_set(const TokenDataset& ds, int64_t token_budget, LongRecord policy, EvalSelection selection);

// Eval batch indices of one drafter: batch i belongs to drafter (role index) i % num_drafters. Pure; the
// routes through the targets are Topology::eval_routes.
std::vector<int64_t> eval_share(int64_t num_batches, int num_drafters, int drafter_index);
// The most tokens any drafter's share holds (what its host keeps: tokens x captured layers x hidden x dtype).
int64_t max_share_tokens(const std::vector<int64_t>& batch_tokens, int num_drafters);
// "3 batches, 1.2K tokens per drafter" (or "2-3 batches, <= 1.2K tokens per drafter" when shares differ).
std::string eval_share_summary(const std::vector<int64_t>& batch_tokens, int num_drafters);
// Fatal BadOptions (with a HINT: the --eval-max-tokens that fits) when a drafter's share of the batches
// would hold more than its budget. Only a given --eval-max-tokens above one drafter's budget can get
// here (auto's sample fits one drafter whole); the job and --dry-run both check.
void check_eval_share_fits(const std::vector<int64_t>& batch_tokens, int num_drafters, const EvalBudget& budget,
                           const std::string& path);

}  // namespace dflash
