// The small programs' shared command-line parser (include/dflash/tool_args.h): both value forms, positionals
// in order, last-wins, range checks and every mistake an exit 2 naming the flag.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dflash/tool_args.h"

using namespace dflash;

namespace {

struct Parsed {
  std::vector<std::string> positional;
  long long n = -1;
  double x = -1;
  std::string name;
  bool sw = false;
  bool help = false;
};

Parsed parse(std::vector<std::string> words) {
  std::vector<char*> argv{const_cast<char*>("tool")};
  for (std::string& w : words) argv.push_back(w.data());
  Parsed p;
  ToolArgs args(static_cast<int>(argv.size()), argv.data(), "usage: tool [--n N] [--x X] [--name S] [--sw] FILE...");
  while (args.next()) {
    if (args.help()) p.help = true;
    else if (args.positional()) p.positional.push_back(args.arg());
    else if (args.is("--n")) p.n = args.integer(0, 100);
    else if (args.is("--x")) p.x = args.real(0.5, 2.0);
    else if (args.is("--name")) p.name = args.value();
    else if (args.is("--sw")) args.no_value(), p.sw = true;
    else args.unknown();
  }
  return p;
}

}  // namespace

TEST(ToolArgs, BothValueFormsPositionalsAndLastWins) {
  const Parsed p = parse({"a.h5", "--n", "7", "--x=1.5", "b.h5", "--name=q=r", "--sw", "--n=9", "-"});
  EXPECT_EQ(p.positional, (std::vector<std::string>{"a.h5", "b.h5", "-"}));
  EXPECT_EQ(p.n, 9);  // the later --n wins
  EXPECT_DOUBLE_EQ(p.x, 1.5);
  EXPECT_EQ(p.name, "q=r");  // only the first '=' splits
  EXPECT_TRUE(p.sw);
  EXPECT_FALSE(p.help);
  EXPECT_TRUE(parse({"-h"}).help);
  EXPECT_TRUE(parse({"x", "--help"}).help);
}

TEST(ToolArgsDeath, MistakesAreExitTwoNamingTheFlag) {
  EXPECT_EXIT(parse({"--n"}), testing::ExitedWithCode(2), "--n needs a value");
  EXPECT_EXIT(parse({"--n", "101"}), testing::ExitedWithCode(2), "--n: '101' is not an integer in \\[0, 100\\]");
  EXPECT_EXIT(parse({"--n", "7x"}), testing::ExitedWithCode(2), "--n: '7x' is not an integer");
  EXPECT_EXIT(parse({"--x=3"}), testing::ExitedWithCode(2), "--x: '3' is not a number in");
  EXPECT_EXIT(parse({"--sw=1"}), testing::ExitedWithCode(2), "--sw takes no value");
  EXPECT_EXIT(parse({"--bogus", "1"}), testing::ExitedWithCode(2), "unknown option --bogus");
  EXPECT_EXIT(parse({"-q"}), testing::ExitedWithCode(2), "unknown option -q");
}
