// The training data of a job: one --data file, or several mixed by weight (docs/data.md "Mixing datasets").
//
// `--data a.h5:0.7 --data b.h5:0.3` is one virtual dataset of N "slots", N = the records of all the files
// together (the weights are proportions of an epoch), each slot naming (file, record). File i gets n_i
// slots (mix_slot_counts: its weight's share of N); with n_i = q * R_i + s (R_i its records) that is every
// record q times plus a subset of s of its records, drawn once from (--seed, i). A file weighted above its
// size repeats records, below it trains on a fixed seeded subset (the same every epoch). The table is a
// pure function of the files' record counts, the weights and --seed: the same on every target, every
// run and every resume.
//
// The loader, the packing, the lr plan and the resume's data positions and consumed-record sets work on
// slot ids exactly as on a file's record ids (RecordSource). One --data is the file itself, slot =
// record: a job on one file reads exactly what it read before mixing existed.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dflash/data.h"
#include "dflash/data_source.h"

namespace dflash {

class DatasetMix : public RecordSource {
 public:
  // Opens and validates every file (TokenDataset, against target_vocab_size) and builds the slot table.
  // Fatal BadInput when the files' vocab_size or tokenizer attributes differ or two names are one file;
  // BadOptions (check_data_sources) on the list itself, or when a weight is too small to give its file a
  // slot.
  DatasetMix(const std::vector<DataSource>& sources, uint64_t seed, int target_vocab_size);

  size_t num_records() const override { return num_slots_; }  // slots (one file: its records)
  int64_t record_length(size_t slot) const override;
  void read_record(size_t slot, std::vector<int32_t>& tokens, std::vector<uint8_t>& loss_mask, int64_t max_tokens = -1,
                   bool check_file = true) const override;
  void check_unchanged() const override;  // every file
  const std::string& path() const override { return name_; }  // one file: its path; a mix: "a.h5 + b.h5"

  size_t num_files() const { return files_.size(); }
  bool is_mix() const { return files_.size() > 1; }
  const TokenDataset& file(size_t i) const { return *files_[i]; }
  double share(size_t i) const { return shares_[i]; }  // w_i / sum(w) (1 for one file)
  int64_t file_slots(size_t i) const { return slot_begin_[i + 1] - slot_begin_[i]; }
  std::pair<size_t, int64_t> slot(size_t s) const;  // (file, record) of slot s
  int64_t num_tokens() const { return num_tokens_; }  // tokens of all slots: one epoch
  // The startup line's text: "mix of 2 datasets: a.h5 70% (200 records -> 224 slots), b.h5 30% (...)".
  std::string summary() const;

 private:
  std::vector<std::shared_ptr<const TokenDataset>> files_;
  std::vector<double> shares_;
  std::vector<int64_t> slot_begin_;   // file i's slots are [slot_begin_[i], slot_begin_[i + 1])
  std::vector<int64_t> slot_record_;  // the record of each slot (empty for one file: slot = record)
  size_t num_slots_ = 0;
  int64_t num_tokens_ = 0;
  std::string name_;
};

}  // namespace dflash
