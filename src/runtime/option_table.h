// dflash-train's options as one table (src/runtime/option_table.cpp): a row per option, from which the
// parser (Boost.ProgramOptions), --help / --help-all, the resolved record (Options::resolved) and the
// docs/pipeline.md "Options" table (--help-markdown; tests/e2e/test_options_table.sh compares them) are
// all made. A row's default is read from the Options struct it is bound to, so the struct's member
// initialiser is the one default.
#pragma once
#include <boost/program_options.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dflash/options.h"

namespace dflash {

// Where --help shows a row. FirstJob is the opening block: what a first job sets. TestHooks only in
// --help-all; Hidden never (it is still parsed, and documented).
enum class OptionSection : uint8_t { FirstJob, Job, DFlash2, Data, Training, Eval, Output, DryRun, TestHooks, Hidden };
const char* section_title(OptionSection s);

// Whether an option goes into Options::resolved (and so into checkpoints' and metrics.h5's records).
// Commands (--help, --version) and --dry-run (it never trains) do not.
enum class Recorded : uint8_t { Yes, No };

struct OptionRow {
  std::string name;        // without "--"
  std::string value_name;  // N, DIR, T-D ... ("" for a switch or a command)
  std::string help;        // --help's text
  OptionSection section = OptionSection::Job;
  // The default in a person's spelling (6e-4, not 0.000600000028), made from the struct's value; unset: the
  // option has none (absent from the resolved record unless given).
  std::optional<std::string> default_text;
  std::string doc_default;  // the docs table's default column for an option without one ("required")
  std::string doc;          // the docs table's meaning, where it says more than help ("" = help)
  Recorded recorded = Recorded::Yes;
  // The Boost value bound to the row's field (null: a command, which takes no value).
  std::function<boost::program_options::value_semantic*()> semantic;
  // After notify, for a row present in the variables map: the per-option range check (fatal BadOptions
  // naming the flag) and the text-to-enum conversion. Rows run in table order.
  std::function<void(const boost::program_options::variable_value&)> check;
  // The resolved record's text where it is not the parsed value (the cap --anchors-per-record implies).
  std::function<std::string()> resolved_text;
};

// The rows, bound to o's fields (o must outlive them); their defaults are o's values when called, so
// call it on a default-constructed Options.
std::vector<OptionRow> option_rows(Options& o);

// The Boost descriptions of the rows: `visible` (--help: every section but the hooks and hidden),
// `with_hooks` (--help-all), `all` (what the parser accepts).
struct OptionDescriptions {
  boost::program_options::options_description visible, with_hooks, all;
};
OptionDescriptions describe_options(const std::vector<OptionRow>& rows);

// docs/pipeline.md's options table: a Markdown row per option (--help-markdown prints it).
std::string options_markdown(const std::vector<OptionRow>& rows);

// A default as a person writes it: the shortest text that reads back as the same value (6e-4, 0.999, 120).
std::string person_number(double v, bool single_precision);

// The one form of a bad value's error: "bad value V for --flag", HINT "--flag must be RULE" (exit 2), with
// "(--config FILE:LINE)" while an OptionOrigin says the value came from there.
void check_range(bool ok, const std::string& flag, const std::string& value, const std::string& rule);

// While alive: where the option being checked was given, when a --config line gave it ("" otherwise), so
// check_range names the line. parse_options holds one around each row's check.
class OptionOrigin {
 public:
  explicit OptionOrigin(const std::string& where);
  ~OptionOrigin();
  OptionOrigin(const OptionOrigin&) = delete;
  OptionOrigin& operator=(const OptionOrigin&) = delete;
};

}  // namespace dflash
