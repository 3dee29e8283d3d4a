// The --data option: one token dataset, or several mixed by weight (docs/data.md "Mixing datasets").
// Only the option's text here (options.h keeps a list of these); the mix itself is data_mix.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

// One --data: FILE.h5, or FILE.h5:W with a weight W > 0, the file's share of a mix (relative to the
// others' weights: 0.7 and 0.3, or 7 and 3, are the same mix).
struct DataSource {
  std::string path;
  double weight = 0;  // 0: none given
};

// "FILE" or "FILE:W". The text after the last ':' is a weight when it is a number (digits, '.', 'e', signs);
// otherwise the whole text is the path. A weight that is not a finite number > 0 is a fatal BadOptions.
DataSource parse_data_source(const std::string& text);

// The --data list's rules, fatal BadOptions naming the flag: at least one; several only with a weight on
// each (a repeated --data without weights used to keep the last one silently: now refused, with the
// forms that say what was meant); no path twice.
void check_data_sources(const std::vector<DataSource>& sources);

// The --data list as the startup line, metrics.h5 and checkpoints record it (a resume compares it): one
// file is its path alone (its weight means nothing), a mix "a.h5:0.7,b.h5:0.3" (weights as %g).
std::string data_sources_text(const std::vector<DataSource>& sources);

// Slots per file of a mix: file i gets its weight's share of N = sum(records), n_i = w_i / sum(w) * N,
// rounded by largest remainder (ties to the earlier file) so that the n_i add up to N exactly. A pure
// function of the counts and weights (IEEE double arithmetic: the same on every machine). An n_i may be
// 0 (DatasetMix refuses it).
std::vector<int64_t> mix_slot_counts(const std::vector<int64_t>& records, const std::vector<double>& weights);

}  // namespace dflash
