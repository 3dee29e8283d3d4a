// The small programs' command line, one parser for all of them (dflash-prep, -eval, -selftest, -make-tiny,
// -make-random, -synth-metrics; dflash-train's many options go through Boost.ProgramOptions in
// src/runtime/options.cpp with the same conventions): "--name value" or "--name=value", a repeated flag
// resolved last-wins (its later value overwrites the earlier), integers and reals range-checked,
// positionals in order, --help/-h, and every mistake a BadOptions error (exit 2) naming the flag with the
// program's usage as the HINT. --version is answered before, by print_version_if_asked (version.h).
//
//   ToolArgs args(argc, argv, kUsage);
//   while (args.next()) {
//     if (args.help()) { std::fputs(kUsage, stdout); return 0; }
//     if (args.positional()) out = args.arg();
//     else if (args.is("--seed")) seed = args.integer(0, 1LL << 62);
//     else if (args.is("--hybrid")) hybrid = true;          // a switch: takes no value
//     else args.unknown();
//   }
#pragma once
#include <cstdlib>
#include <string>

#include "dflash/error.h"

namespace dflash {

class ToolArgs {
 public:
  ToolArgs(int argc, char** argv, const char* usage) : argc_(argc), argv_(argv), usage_(usage) {}

  // Steps to the next argument; false after the last.
  bool next() {
    if (++i_ >= argc_) return false;
    arg_ = argv_[i_];
    inline_value_.clear();
    has_inline_ = false;
    positional_ = arg_.size() < 2 || arg_[0] != '-';
    if (!positional_ && arg_.rfind("--", 0) == 0) {
      const size_t eq = arg_.find('=');
      if (eq != std::string::npos) {
        inline_value_ = arg_.substr(eq + 1);
        arg_.resize(eq);
        has_inline_ = true;
      }
    }
    return true;
  }
  bool help() const { return !positional_ && (arg_ == "--help" || arg_ == "-h"); }
  bool positional() const { return positional_; }
  bool is(const char* flag) const { return !positional_ && arg_ == flag; }
  const std::string& arg() const { return arg_; }

  // The current flag's value: after '=', or the next argument.
  std::string value() {
    if (has_inline_) return inline_value_;
    DF_CHECK_HINT(i_ + 1 < argc_, BadOptions, arg_ << " needs a value", usage_);
    return argv_[++i_];
  }
  long long integer(long long lo, long long hi) {
    const std::string v = value();
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    DF_CHECK_HINT(!v.empty() && end && *end == '\0' && n >= lo && n <= hi, BadOptions,
                  arg_ << ": '" << v << "' is not an integer in [" << lo << ", " << hi << "]", usage_);
    return n;
  }
  double real(double lo, double hi) {
    const std::string v = value();
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    DF_CHECK_HINT(!v.empty() && end && *end == '\0' && x >= lo && x <= hi, BadOptions,
                  arg_ << ": '" << v << "' is not a number in [" << lo << ", " << hi << "]", usage_);
    return x;
  }
  // A flag this program does not have, or a switch given a value.
  [[noreturn]] void unknown() const {
    if (positional_) DF_FAIL(BadOptions, "unexpected argument '" << arg_ << "'", usage_);
    DF_FAIL(BadOptions, "unknown option " << arg_, usage_);
  }
  // For a switch (a flag without a value): "--hybrid=1" is refused rather than read as true.
  void no_value() const {
    DF_CHECK_HINT(!has_inline_, BadOptions, arg_ << " takes no value (got '" << inline_value_ << "')", usage_);
  }
  const char* usage() const { return usage_; }

 private:
  int argc_;
  char** argv_;
  const char* usage_;
  int i_ = 0;
  std::string arg_, inline_value_;
  bool has_inline_ = false, positional_ = false;
};

}  // namespace dflash
