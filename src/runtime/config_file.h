// A --config file read into (option, values, line) entries, in one of three spellings chosen by the file's
// extension: `key = value` (the recipes of jobs/recipes/, any other extension), the flat subset of YAML
// (.yaml, .yml) or of TOML (.toml). Every spelling names the same options as the command line; what the
// parser (src/runtime/options.cpp) does with an entry is the same whichever spelling it came from. A line
// it cannot read is the one fatal BadOptions error "--config FILE:LINE: ..." (exit 2).
//
// The subset (docs/pipeline.md "Config files"): one `key: value` (YAML) or `key = value` (TOML) per line,
// `#` comments (whole-line, or after a space), quoted strings ('...' or "..." with \" \\ \n \t escapes),
// booleans as written (true, false, yes, no: the switch parser reads them), a list for an option that takes
// several values (--data): `[a, b]` on the line, or YAML's `- item` lines below `key:`. In YAML and TOML a
// key's underscores are its hyphens (learning_rate-style keys: `max_steps` is --max-steps). Nested mappings,
// TOML tables and multi-line strings are refused naming the line.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

enum class ConfigFormat : uint8_t { KeyValue, Yaml, Toml };
ConfigFormat config_format_of(const std::string& path);
const char* config_format_name(ConfigFormat f);

struct ConfigEntry {
  std::string key;                  // the option's name, as the command line spells it (without --)
  std::string written;              // the key as the file wrote it (a YAML key's underscores kept)
  std::vector<std::string> values;  // one, or a list's items
  bool list = false;                // written as a list (one item or several)
  int line = 0;                     // 1-based, of the key
};

// The entries of `text` (read from `name`, which the errors name). Fatal BadOptions on a line it cannot read.
std::vector<ConfigEntry> parse_config_text(const std::string& text, ConfigFormat format, const std::string& name);

// The file's entries; fatal BadOptions when it cannot be read.
std::vector<ConfigEntry> read_config_file(const std::string& path);

}  // namespace dflash
