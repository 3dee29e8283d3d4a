// --data's list and the mix of several datasets: include/dflash/data_source.h, include/dflash/data_mix.h,
// docs/data.md "Mixing datasets".
#include "dflash/data_mix.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <sstream>

#include "dflash/error.h"

namespace dflash {

namespace {

std::string weight_text(double w) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", w);
  return buf;
}

const char* kMixHint =
    "give each file its share of the mix: --data a.h5:0.7 --data b.h5:0.3 (equal shares: a weight of 1 on each; "
    "shares by size: each file's record count as its weight); one --data trains on one file (docs/data.md)";

}  // namespace

DataSource parse_data_source(const std::string& text) {
  DataSource s{text, 0};
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return s;
  const std::string w = text.substr(colon + 1);
  // Only a number is a weight: "run:v2.h5" names a file.
  if (w.empty() || w.find_first_not_of("0123456789.eE+-") != std::string::npos ||
      w.find_first_of("0123456789") == std::string::npos)
    return s;
  char* end = nullptr;
  const double v = std::strtod(w.c_str(), &end);
  if (end != w.c_str() + w.size()) return s;  // "x:1-2": part of a name
  DF_CHECK_HINT(std::isfinite(v) && v > 0, BadOptions, "--data " << text << ": the weight " << w << " is not a number > 0",
                kMixHint);
  s.path = text.substr(0, colon);
  s.weight = v;
  return s;
}

void check_data_sources(const std::vector<DataSource>& sources) {
  DF_CHECK_HINT(!sources.empty(), BadOptions, "no --data", "give --data FILE.h5 (docs/data.md)");
  if (sources.size() == 1) return;
  std::string unweighted;
  for (const DataSource& s : sources)
    if (s.weight <= 0) unweighted += (unweighted.empty() ? "" : ", ") + s.path;
  // A repeated --data used to keep the last one without a word; which mix a bare repetition means (equal
  // shares? shares by size?) is the user's to say.
  DF_CHECK_HINT(unweighted.empty(), BadOptions,
                "--data is given " << sources.size() << " times, and " << unweighted
                                   << " without a weight: a mix of datasets needs a weight on each file",
                kMixHint);
  // Each weight is finite, their sum need not be (1e308 + 1e308): every share would be 0 %.
  double sum = 0;
  for (const DataSource& s : sources) sum += s.weight;
  DF_CHECK_HINT(std::isfinite(sum), BadOptions,
                "--data weights sum to " << sum << ": too large to share the mix by (every file would get 0 %)",
                "give weights of a usual size: they are relative (0.7 and 0.3, or 7 and 3)");
  for (size_t i = 0; i < sources.size(); ++i)
    for (size_t j = i + 1; j < sources.size(); ++j)
      DF_CHECK_HINT(sources[i].path != sources[j].path, BadOptions, "--data " << sources[i].path << " is given twice",
                    "give a file once, with the sum of its weights");
}

std::string data_sources_text(const std::vector<DataSource>& sources) {
  if (sources.size() == 1) return sources[0].path;
  std::string text;
  for (const DataSource& s : sources) text += (text.empty() ? "" : ",") + s.path + ":" + weight_text(s.weight);
  return text;
}

std::vector<int64_t> mix_slot_counts(const std::vector<int64_t>& records, const std::vector<double>& weights) {
  DF_CHECK(records.size() == weights.size() && !records.empty(), Internal,
           "mix_slot_counts: " << records.size() << " record counts, " << weights.size() << " weights");
  const int64_t n = std::accumulate(records.begin(), records.end(), int64_t{0});
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int64_t> counts(records.size());
  std::vector<double> rest(records.size());
  int64_t given = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const double exact = weights[i] / sum * static_cast<double>(n);
    counts[i] = static_cast<int64_t>(std::floor(exact));
    rest[i] = exact - static_cast<double>(counts[i]);
    given += counts[i];
  }
  // The slots the floors left, one each to the largest remainders (ties: the earlier file).
  std::vector<size_t> by_rest(records.size());
  std::iota(by_rest.begin(), by_rest.end(), size_t{0});
  std::stable_sort(by_rest.begin(), by_rest.end(), [&](size_t a, size_t b) { return rest[a] > rest[b]; });
  for (size_t k = 0; given < n; k = (k + 1) % by_rest.size(), ++given) counts[by_rest[k]]++;
  return counts;
}

// ---- the mix -----------------------------------------------------------------------------------------

DatasetMix::DatasetMix(const std::vector<DataSource>& sources, uint64_t seed, int target_vocab_size) {
  check_data_sources(sources);
  for (const DataSource& s : sources) files_.push_back(std::make_shared<const TokenDataset>(s.path, target_vocab_size));
  const TokenDataset& first = *files_[0];
  if (files_.size() == 1) {  // the file itself: slot = record
    shares_ = {1.0};
    num_slots_ = first.num_records();
    slot_begin_ = {0, static_cast<int64_t>(num_slots_)};
    num_tokens_ = first.num_tokens();
    name_ = first.path();
    return;
  }
  for (size_t i = 1; i < files_.size(); ++i) {
    const TokenDataset& f = *files_[i];
    DF_CHECK_HINT(f.vocab_size() == first.vocab_size() && f.tokenizer() == first.tokenizer(), BadInput,
                  "--data " << f.path() << " was tokenized for vocab_size " << f.vocab_size() << " by '" << f.tokenizer()
                            << "', " << first.path() << " for vocab_size " << first.vocab_size() << " by '"
                            << first.tokenizer() << "' (their attributes): a mix trains on one tokenizer's ids",
                  "tokenize every file of the mix with the target's tokenizer (dflash-tokenize TARGET_DIR IN.jsonl "
                  "OUT.h5); files of one tokenizer under two names: set the same tokenizer attribute on both");
    for (size_t j = 0; j < i; ++j)
      DF_CHECK_HINT(f.file_device() != files_[j]->file_device() || f.file_inode() != files_[j]->file_inode(), BadInput,
                    "--data " << files_[j]->path() << " and " << f.path() << " are one file",
                    "give a file once, with the sum of its weights");
  }
  std::vector<int64_t> records;
  std::vector<double> weights;
  for (size_t i = 0; i < files_.size(); ++i) {
    records.push_back(static_cast<int64_t>(files_[i]->num_records()));
    weights.push_back(sources[i].weight);
  }
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  const std::vector<int64_t> counts = mix_slot_counts(records, weights);
  const int64_t total = std::accumulate(records.begin(), records.end(), int64_t{0});
  slot_begin_ = {0};
  for (size_t i = 0; i < files_.size(); ++i) {
    shares_.push_back(weights[i] / sum);
    DF_CHECK_HINT(counts[i] > 0, BadOptions,
                  "--data " << sources[i].path << ":" << weight_text(weights[i]) << " gets no record of the mix: its share "
                            << weight_text(100 * shares_[i]) << "% of the mix's " << total << " records rounds to 0",
                  "raise its weight, or leave the file out");
    // Every record q times, then s of them drawn from (--seed, i): the first s of a seeded shuffle, in
    // record order. The slot order does not matter (the loader shuffles every epoch).
    const int64_t r = records[i], q = counts[i] / r, s = counts[i] % r;
    for (int64_t k = 0; k < q; ++k)
      for (int64_t rec = 0; rec < r; ++rec) slot_record_.push_back(rec);
    if (s > 0) {
      const uint64_t subset_seed = seed ^ (0x6A09E667F3BCC909ull * static_cast<uint64_t>(i + 1));
      std::vector<int64_t> pick = Loader::shard_order(static_cast<size_t>(r), subset_seed, 0, 0, 1);
      pick.resize(static_cast<size_t>(s));
      std::sort(pick.begin(), pick.end());
      slot_record_.insert(slot_record_.end(), pick.begin(), pick.end());
    }
    slot_begin_.push_back(static_cast<int64_t>(slot_record_.size()));
    name_ += (i ? " + " : "") + files_[i]->path();
  }
  num_slots_ = slot_record_.size();
  for (size_t s = 0; s < num_slots_; ++s) num_tokens_ += record_length(s);
}

std::pair<size_t, int64_t> DatasetMix::slot(size_t s) const {
  if (slot_record_.empty()) return {0, static_cast<int64_t>(s)};
  const size_t f =
      static_cast<size_t>(std::upper_bound(slot_begin_.begin(), slot_begin_.end(), static_cast<int64_t>(s)) - slot_begin_.begin()) - 1;
  return {f, slot_record_[s]};
}

int64_t DatasetMix::record_length(size_t s) const {
  const auto [f, r] = slot(s);
  return files_[f]->record_length(static_cast<size_t>(r));
}

void DatasetMix::read_record(size_t s, std::vector<int32_t>& tokens, std::vector<uint8_t>& loss_mask, int64_t max_tokens,
                             bool check_file) const {
  const auto [f, r] = slot(s);
  files_[f]->read_record(static_cast<size_t>(r), tokens, loss_mask, max_tokens, check_file);
}

void DatasetMix::check_unchanged() const {
  for (const auto& f : files_) f->check_unchanged();
}

std::string DatasetMix::summary() const {
  std::ostringstream os;
  os << "mix of " << files_.size() << " datasets: ";
  for (size_t i = 0; i < files_.size(); ++i)
    os << (i ? ", " : "") << files_[i]->path() << " " << weight_text(100 * shares_[i]) << "% ("
       << files_[i]->num_records() << " records -> " << file_slots(i) << " slots)";
  os << "; " << num_slots_ << " slots, " << num_tokens_ << " tokens per epoch";
  return os.str();
}

}  // namespace dflash
