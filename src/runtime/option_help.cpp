// What the option rows (src/runtime/option_table.h) make besides the values: the Boost descriptions behind
// --help / --help-all and the parser, and docs/pipeline.md's options table (--help-markdown).
#include <algorithm>
#include <sstream>

#include "option_table.h"

namespace po = boost::program_options;

namespace dflash {

namespace {

// --help's order of the sections (the test hooks and hidden rows last: --help-all and the parser only).
constexpr OptionSection kHelpOrder[] = {OptionSection::FirstJob, OptionSection::Job,      OptionSection::DFlash2,
                                        OptionSection::Data,     OptionSection::Training, OptionSection::Eval,
                                        OptionSection::Output,   OptionSection::DryRun,   OptionSection::TestHooks,
                                        OptionSection::Hidden};

po::options_description section_description(const std::vector<OptionRow>& rows, OptionSection s) {
  po::options_description d(section_title(s));
  for (const OptionRow& r : rows) {
    if (r.section != s) continue;
    const std::string key = r.name == "help" ? "help,h" : r.name;  // -h too, as before
    if (r.semantic) d.add_options()(key.c_str(), r.semantic(), r.help.c_str());
    else d.add_options()(key.c_str(), r.help.c_str());
  }
  return d;
}

std::string cell(const std::string& text) {  // a Markdown table cell: | inside it escaped
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

const char* section_title(OptionSection s) {
  switch (s) {
    case OptionSection::FirstJob: return "Start here: what a first job sets";
    case OptionSection::Job: return "Job and drafter";
    case OptionSection::DFlash2: return "DFlash2 drafters (--draft-arch dflash2, docs/dflash2.md)";
    case OptionSection::Data: return "Data and flow";
    case OptionSection::Training: return "Training";
    case OptionSection::Eval: return "Evaluation (--eval-data)";
    case OptionSection::Output: return "Output, checkpoints and reports";
    case OptionSection::DryRun: return "Dry run (--dry-run)";
    case OptionSection::TestHooks: return "Test hooks (for the test suite; not for training runs)";
    case OptionSection::Hidden: return "Hidden";
  }
  return "?";
}

OptionDescriptions describe_options(const std::vector<OptionRow>& rows) {
  OptionDescriptions d{
      po::options_description("dflash-train: trains a DFlash drafter; run with mpirun, one rank per GPU.\n"
                              "Usage: mpirun -np N dflash-train --topology T-D --target DIR --data FILE.h5 --out DIR [options]\n"
                              "       dflash-train --version | --help | --help-all (also the test hooks)\n\nOptions"),
      po::options_description(), po::options_description()};
  for (OptionSection s : kHelpOrder)
    if (s != OptionSection::TestHooks && s != OptionSection::Hidden) d.visible.add(section_description(rows, s));
  const po::options_description hooks = section_description(rows, OptionSection::TestHooks);
  d.with_hooks.add(d.visible).add(hooks);
  d.all.add(d.visible).add(hooks).add(section_description(rows, OptionSection::Hidden));
  return d;
}

std::string options_markdown(const std::vector<OptionRow>& rows) {
  std::ostringstream os;
  os << "| option | default | meaning |\n| --- | --- | --- |\n";
  for (OptionSection s : kHelpOrder)
    for (const OptionRow& r : rows) {
      if (r.section != s) continue;
      const std::string flag = "--" + r.name + (r.value_name.empty() ? "" : " " + r.value_name);
      const std::string meaning = r.doc.empty() ? r.help : r.doc;
      os << "| `" << cell(flag) << "` | " << cell(r.default_text ? *r.default_text : r.doc_default) << " | "
         << (s == OptionSection::TestHooks ? "test hook: " : "") << cell(meaning) << " |\n";
    }
  return os.str();
}

}  // namespace dflash
