// --eval-data: the held-out set, packed once at startup in a fixed order (docs/pipeline.md "Evaluation").
//
// Every rank that needs it (targets and drafters) packs it itself with the same rule, so all of them know
// the same batch list (tokens, cu_seqlens, loss_mask) without a message: records in file order (no
// shuffle), whole records up to --token-budget as the loader packs (src/data/loader.cpp), a record longer
// than the budget cut to it or skipped (--long-record; "error" refuses such a file before anything runs).
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

struct EvalSet {
  std::string path;
  int64_t records = 0;          // in the file
  int64_t records_cut = 0;      // longer than the budget, cut to it
  int64_t records_skipped = 0;  // longer than the budget, left out
  int64_t tokens = 0;           // tokens packed (what is evaluated)
  std::vector<PackedBatch> batches;
  int64_t num_seqs() const;
  std::vector<int64_t> batch_tokens() const;  // tokens of each batch
};

// Reads and packs the whole set (an eval set is small: its features are held on the drafters' hosts).
EvalSet load_eval_set(const TokenDataset& ds, int64_t token_budget, LongRecord policy);

// Eval batch indices of one drafter: batch i belongs to drafter (role index) i % num_drafters. Pure; the
// routes through the targets are Topology::eval_routes.
std::vector<int64_t> eval_share(int64_t num_batches, int num_drafters, int drafter_index);
// The most tokens any drafter's share holds (what its host keeps: tokens x captured layers x hidden x dtype).
int64_t max_share_tokens(const std::vector<int64_t>& batch_tokens, int num_drafters);
// "3 batches, 1.2K tokens per drafter" (or "2-3 batches, <= 1.2K tokens per drafter" when shares differ).
std::string eval_share_summary(const std::vector<int64_t>& batch_tokens, int num_drafters);
// Shares held on a drafter's host are refused above this (exit 2): the eval set is a sample, not a dataset.
constexpr int64_t kEvalShareLimitBytes = int64_t{2} << 30;
// Fatal BadOptions (with a HINT: how many tokens fit) when a drafter's share of `e` would hold more than
// kEvalShareLimitBytes at bytes_per_token (captured layers (+ final norm) x hidden x wire dtype size).
void check_eval_share_fits(const EvalSet& e, int num_drafters, double bytes_per_token);

}  // namespace dflash
