// --config files in three spellings (src/runtime/config_file.h): a small line parser each, no dependency.
// The `key = value` spelling reads as Boost's parse_config_file did before (a `#` anywhere starts a comment,
// values are kept as written, quotes included), so the recipes and the e2e tests' files mean what they meant.
#include "config_file.h"

#include <cctype>
#include <fstream>
#include <sstream>

#include "dflash/error.h"

namespace dflash {

namespace {

constexpr size_t kMostConfigBytes = size_t{1} << 20;  // a job file is a few KiB; a bigger one is no job file
constexpr const char* kSpellings =
    "--config reads key = value lines, flat YAML (.yaml, .yml: key: value) or flat TOML (.toml: key = value): "
    "docs/pipeline.md \"Config files\"";

struct Reader {
  ConfigFormat format;
  const std::string& name;

  [[noreturn]] void fail(int line, const std::string& what) const {
    DF_FAIL(BadOptions, "--config " << name << ":" << line << ": " << what, kSpellings);
  }
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// Where an unquoted `#` starts a comment: YAML needs a space (or the line's start) before it, TOML does not.
std::string strip_comment(const std::string& s, ConfigFormat f) {
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == '\\' && quote == '"') ++i;
      else if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (f == ConfigFormat::Toml || i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t')) {
      return s.substr(0, i);
    }
  }
  return s;
}

// A scalar as written: a quoted one without its quotes (escapes read), else the trimmed text.
std::string scalar(const std::string& raw, const Reader& r, int line) {
  const std::string s = trim(raw);
  if (s.empty() || (s[0] != '"' && s[0] != '\'')) return s;
  if (s.size() >= 3 && (s.compare(0, 3, "\"\"\"") == 0 || s.compare(0, 3, "'''") == 0))
    r.fail(line, "a multi-line string: write the value on one line");
  const char q = s[0];
  std::string out;
  size_t i = 1;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (q == '"' && c == '\\') {
      if (++i == s.size()) break;
      switch (s[i]) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        default: r.fail(line, std::string("unknown escape \\") + s[i] + " in " + s);
      }
    } else if (c == q) {
      // YAML's single-quoted '' is one quote
      if (q == '\'' && r.format == ConfigFormat::Yaml && i + 1 < s.size() && s[i + 1] == '\'') out += '\'', ++i;
      else break;
    } else {
      out += c;
    }
  }
  if (i >= s.size()) r.fail(line, "an unclosed quote in " + s);
  if (i + 1 != s.size()) r.fail(line, "text after the closing quote in " + s);
  return out;
}

// `[a, "b", c]`: the items, split at commas outside quotes (a trailing comma allowed, as TOML does).
std::vector<std::string> flow_list(const std::string& s, const Reader& r, int line) {
  if (s.size() < 2 || s.back() != ']') r.fail(line, "a list without its closing ]: " + s);
  std::vector<std::string> pieces(1);
  char quote = 0;
  for (size_t i = 1; i + 1 < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      pieces.back() += c;
      if (c == '\\' && quote == '"' && i + 2 < s.size()) pieces.back() += s[++i];
      else if (c == quote) quote = 0;
    } else if (c == ',') {
      pieces.emplace_back();
    } else {
      if (c == '"' || c == '\'') quote = c;
      pieces.back() += c;
    }
  }
  if (quote) r.fail(line, "an unclosed quote in " + s);
  if (pieces.size() > 1 && trim(pieces.back()).empty()) pieces.pop_back();
  std::vector<std::string> items;
  for (const std::string& p : pieces) {
    const std::string t = trim(p);
    if (t.empty()) r.fail(line, pieces.size() == 1 ? "an empty list: give the option a value, or leave the line out"
                                                   : "an empty item in the list " + s);
    if (t[0] == '[' || t[0] == '{') r.fail(line, "a nested list or mapping in " + s + ": options take plain values");
    items.push_back(scalar(t, r, line));
  }
  return items;
}

std::string option_key(const std::string& written, const Reader& r, int line) {
  std::string k = scalar(written, r, line);
  if (k.empty()) r.fail(line, "a value without its option name");
  if (r.format != ConfigFormat::KeyValue)
    for (char& c : k)
      if (c == '_') c = '-';
  return k;
}

// A value that is not a list: refused where it is something an option cannot hold.
std::string plain_value(const std::string& v, const Reader& r, int line) {
  if (!v.empty() && v[0] == '{') r.fail(line, "a nested mapping: dflash-train's options are flat, one value each");
  if (r.format == ConfigFormat::Yaml && (v == "|" || v == ">" || v.rfind("|-", 0) == 0 || v.rfind(">-", 0) == 0))
    r.fail(line, "a multi-line string: write the value on one line");
  if (r.format == ConfigFormat::Yaml && (v == "~" || v == "null" || v == "Null" || v == "NULL"))
    r.fail(line, "no value (null): give one, or leave the line out for the default");
  return scalar(v, r, line);
}

void add_value(ConfigEntry& e, const std::string& v, const Reader& r) {
  if (!v.empty() && v[0] == '[') {
    e.values = flow_list(v, r, e.line);
    e.list = true;
  } else {
    e.values = {plain_value(v, r, e.line)};
  }
}

std::vector<ConfigEntry> parse_key_value(const std::vector<std::string>& lines, const Reader& r) {
  std::vector<ConfigEntry> out;
  for (size_t n = 0; n < lines.size(); ++n) {
    const int line = static_cast<int>(n + 1);
    std::string s = lines[n];
    if (const size_t hash = s.find('#'); hash != std::string::npos) s.resize(hash);
    s = trim(s);
    if (s.empty()) continue;
    if (s[0] == '[') r.fail(line, "a [section]: dflash-train's options have none, write key = value lines");
    const size_t eq = s.find('=');
    if (eq == std::string::npos) r.fail(line, "'" + s + "' is not key = value");
    ConfigEntry e;
    e.written = trim(s.substr(0, eq));
    e.key = option_key(e.written, r, line);
    e.values = {trim(s.substr(eq + 1))};
    e.line = line;
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<ConfigEntry> parse_toml(const std::vector<std::string>& lines, const Reader& r) {
  std::vector<ConfigEntry> out;
  for (size_t n = 0; n < lines.size(); ++n) {
    const int line = static_cast<int>(n + 1);
    std::string s = trim(strip_comment(lines[n], r.format));
    if (s.empty()) continue;
    if (s[0] == '[') r.fail(line, "a TOML table " + s + ": dflash-train's options are flat, write key = value at the top level");
    const size_t eq = s.find('=');
    if (eq == std::string::npos) r.fail(line, "'" + s + "' is not key = value");
    ConfigEntry e;
    e.written = trim(s.substr(0, eq));
    e.key = option_key(e.written, r, line);
    e.line = line;
    std::string v = trim(s.substr(eq + 1));
    // An array over several lines: joined until its brackets close.
    auto open = [&] {
      int depth = 0;
      char quote = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        const char c = v[i];
        if (quote) {
          if (c == '\\' && quote == '"') ++i;
          else if (c == quote) quote = 0;
        } else if (c == '"' || c == '\'') quote = c;
        else if (c == '[') ++depth;
        else if (c == ']') --depth;
      }
      return depth > 0;
    };
    while (!v.empty() && v[0] == '[' && open()) {
      if (++n == lines.size()) r.fail(line, "the list " + e.written + " never closes (no ])");
      v += " " + trim(strip_comment(lines[n], r.format));
    }
    if (v.empty()) r.fail(line, e.written + " has no value");
    add_value(e, v, r);
    out.push_back(std::move(e));
  }
  return out;
}

size_t indent_of(const std::string& s) { return s.find_first_not_of(" \t"); }

std::vector<ConfigEntry> parse_yaml(const std::vector<std::string>& lines, const Reader& r) {
  std::vector<ConfigEntry> out;
  bool awaiting_items = false;  // the last key had no value: `- item` lines follow
  auto close_list = [&] {
    if (awaiting_items && out.back().values.empty())
      r.fail(out.back().line, out.back().written + ": no value (give one, or `- item` lines below it)");
    awaiting_items = false;
  };
  for (size_t n = 0; n < lines.size(); ++n) {
    const int line = static_cast<int>(n + 1);
    const std::string raw = strip_comment(lines[n], r.format);
    const std::string s = trim(raw);
    if (s.empty()) continue;
    if (indent_of(raw) == 0 && (s == "---" || s == "...")) continue;  // document markers
    const bool item = s == "-" || s.rfind("- ", 0) == 0;
    if (item) {
      if (!awaiting_items) r.fail(line, "a list item without its key (write `key:` on the line above)");
      const std::string v = trim(s.substr(1));
      if (v.empty()) r.fail(line, "an empty list item");
      if (v[0] == '[' || v[0] == '{' || v.back() == ':') r.fail(line, "a nested list or mapping: options take plain values");
      out.back().values.push_back(plain_value(v, r, line));
      out.back().list = true;
      continue;
    }
    if (indent_of(raw) > 0)
      r.fail(line, "an indented key: dflash-train's options are flat (write `key: value` at the line's start)");
    close_list();
    // key: value — the first `: ` (or a `:` ending the line) outside quotes
    size_t colon = std::string::npos;
    char quote = 0;
    for (size_t i = 0; i < s.size() && colon == std::string::npos; ++i) {
      const char c = s[i];
      if (quote) {
        if (c == quote) quote = 0;
      } else if (c == '"' || c == '\'') quote = c;
      else if (c == ':' && (i + 1 == s.size() || s[i + 1] == ' ' || s[i + 1] == '\t')) colon = i;
    }
    if (colon == std::string::npos) r.fail(line, "'" + s + "' is not key: value");
    ConfigEntry e;
    e.written = trim(s.substr(0, colon));
    e.key = option_key(e.written, r, line);
    e.line = line;
    const std::string v = trim(s.substr(colon + 1));
    if (v.empty()) {
      awaiting_items = true;
    } else {
      add_value(e, v, r);
    }
    out.push_back(std::move(e));
  }
  close_list();
  return out;
}

}  // namespace

ConfigFormat config_format_of(const std::string& path) {
  auto ends = [&](const char* ext) {
    const std::string e = ext;
    if (path.size() < e.size()) return false;
    for (size_t i = 0; i < e.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(path[path.size() - e.size() + i])) != e[i]) return false;
    return true;
  };
  if (ends(".yaml") || ends(".yml")) return ConfigFormat::Yaml;
  if (ends(".toml")) return ConfigFormat::Toml;
  return ConfigFormat::KeyValue;
}

const char* config_format_name(ConfigFormat f) {
  switch (f) {
    case ConfigFormat::Yaml: return "YAML";
    case ConfigFormat::Toml: return "TOML";
    case ConfigFormat::KeyValue: break;
  }
  return "key = value";
}

std::vector<ConfigEntry> parse_config_text(const std::string& text, ConfigFormat format, const std::string& name) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  const Reader r{format, name};
  if (format == ConfigFormat::Yaml) return parse_yaml(lines, r);
  if (format == ConfigFormat::Toml) return parse_toml(lines, r);
  return parse_key_value(lines, r);
}

std::vector<ConfigEntry> read_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DF_CHECK_HINT(in.good(), BadOptions, "cannot read --config " << path,
                "give an existing file: key = value lines, or flat YAML (.yaml, .yml) or TOML (.toml)");
  std::string text(kMostConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  DF_CHECK_HINT(!in.bad(), BadOptions, "cannot read --config " << path, "give a readable file");
  text.resize(static_cast<size_t>(in.gcount()));
  DF_CHECK_HINT(text.size() <= kMostConfigBytes, BadOptions, "--config " << path << " is over 1 MiB: not a job file",
                "give a key = value, YAML or TOML file of dflash-train options");
  return parse_config_text(text, config_format_of(path), path);
}

}  // namespace dflash
