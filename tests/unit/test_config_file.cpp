// --config in its three spellings (src/runtime/config_file.h): the same options from key = value, YAML and
// TOML; each error names the file and the line; --backend auto and what it says.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "dflash/backend.h"
#include "dflash/options.h"
#include "runtime/config_file.h"

using namespace dflash;

namespace {

ParseResult parse(std::vector<std::string> args) {
  std::vector<const char*> argv{"dflash-train"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

std::string write(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string resolved(const Options& o, const std::string& name) {
  for (const auto& [k, v] : o.resolved)
    if (k == name) return v;
  return "<missing>";
}

}  // namespace

TEST(ConfigFile, ThreeSpellingsGiveTheSameOptions) {
  const std::string cfg = write("same.cfg",
                                "# a job\ntarget = T\nout = O\ndata = a.h5:1\ndata = b.h5:3\nlr = 6e-4\ndpace = true\n"
                                "topology = 3-5\nmax-steps = 20\n");
  const std::string yaml = write("same.yaml",
                                 "---\n# a job\ntarget: T   # the target\nout: 'O'\ndata:\n  - a.h5:1\n  - \"b.h5:3\"\n"
                                 "lr: 6e-4\ndpace: true\ntopology: 3-5\nmax_steps: 20\n");
  const std::string toml = write("same.toml",
                                 "# a job\ntarget = \"T\"\nout = 'O'\ndata = [\n  \"a.h5:1\",  # first\n  \"b.h5:3\",\n]\n"
                                 "lr = 6e-4\ndpace = true\ntopology = \"3-5\"\nmax_steps = 20\n");
  const Options a = parse({"--config", cfg}).options, b = parse({"--config", yaml}).options,
                c = parse({"--config", toml}).options;
  for (const Options* o : {&a, &b, &c}) {
    EXPECT_EQ(o->target_dir, "T");
    EXPECT_EQ(o->out_dir, "O");
    EXPECT_EQ(resolved(*o, "data"), "a.h5:1,b.h5:3");
    EXPECT_FLOAT_EQ(o->train.lr, 6e-4f);
    EXPECT_TRUE(o->train.dpace);
    EXPECT_EQ(o->topology.to_string(), "3-5");
    EXPECT_EQ(o->max_steps, 20);
  }
  // The command line still wins over the file, whatever its spelling.
  EXPECT_EQ(parse({"--config", yaml, "--topology", "2-2"}).options.topology.to_string(), "2-2");
  // A flow list in YAML; `#` inside quotes is no comment.
  const std::string flow = write("flow.yml", "target: \"T#1\"\nout: O\ndata: [a.h5:1, 'b.h5:3']\n");
  const Options f = parse({"--config", flow}).options;
  EXPECT_EQ(f.target_dir, "T#1");
  EXPECT_EQ(resolved(f, "data"), "a.h5:1,b.h5:3");
}

TEST(ConfigFile, ParsesTheFlatSubset) {
  const auto e = parse_config_text("a: \"x \\\"q\\\" y\"\nb: 'it''s'\nc: [1, 2,]\n", ConfigFormat::Yaml, "t.yaml");
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].values[0], "x \"q\" y");
  EXPECT_EQ(e[1].values[0], "it's");
  EXPECT_EQ(e[2].values, (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(e[2].line, 3);
  // key = value keeps what Boost's parser kept: quotes are part of the value, `#` starts a comment anywhere.
  const auto kv = parse_config_text("out = \"my run\"#c\n", ConfigFormat::KeyValue, "t.cfg");
  EXPECT_EQ(kv[0].values[0], "\"my run\"");
  EXPECT_EQ(config_format_of("x.YAML"), ConfigFormat::Yaml);
  EXPECT_EQ(config_format_of("x.toml"), ConfigFormat::Toml);
  EXPECT_EQ(config_format_of("x.cfg"), ConfigFormat::KeyValue);
}

TEST(ConfigFileDeath, ErrorsNameTheFileAndLine) {
  const std::string unknown = write("unknown.yaml", "target: T\n\nmax-anchor: 5\n");
  EXPECT_EXIT(parse({"--config", unknown}), testing::ExitedWithCode(2),
              "--config .*unknown.yaml:3: unknown option 'max-anchor'; did you mean max-anchors\\?");
  const std::string bad_value = write("bad_value.toml", "target = \"T\"\ntoken_budget = \"lots\"\n");
  EXPECT_EXIT(parse({"--config", bad_value}), testing::ExitedWithCode(2),
              "--config .*bad_value.toml:2: bad value 'lots' for token_budget");
  const std::string range = write("range.cfg", "target = T\ndata = D.h5\nout = O\n\nseed = 1\nlr = -1\n");
  EXPECT_EXIT(parse({"--config", range}), testing::ExitedWithCode(2), "bad value -1 for --lr \\(--config .*range.cfg:6\\)");
  const std::string nested = write("nested.yaml", "target: T\ntrain:\n  lr: 1e-3\n");
  EXPECT_EXIT(parse({"--config", nested}), testing::ExitedWithCode(2), "nested.yaml:3: an indented key");
  const std::string table = write("table.toml", "target = \"T\"\n[train]\nlr = 1e-3\n");
  EXPECT_EXIT(parse({"--config", table}), testing::ExitedWithCode(2), "table.toml:2: a TOML table \\[train\\]");
  const std::string syntax = write("syntax.cfg", "target = T\nlr 0.1\n");
  EXPECT_EXIT(parse({"--config", syntax}), testing::ExitedWithCode(2), "syntax.cfg:2: 'lr 0.1' is not key = value");
  const std::string list = write("list.yaml", "lr: [1, 2]\n");
  EXPECT_EXIT(parse({"--config", list}), testing::ExitedWithCode(2), "list.yaml:1: lr takes one value, the list gives 2");
  const std::string empty = write("empty.yaml", "target:\nout: O\n");
  EXPECT_EXIT(parse({"--config", empty}), testing::ExitedWithCode(2), "empty.yaml:1: target: no value");
  const std::string quote = write("quote.toml", "target = \"T\n");
  EXPECT_EXIT(parse({"--config", quote}), testing::ExitedWithCode(2), "quote.toml:1: an unclosed quote");
}

// --backend auto (the default): cuda where the build has CUDA and sees a GPU, else cpu; said at startup.
TEST(Backend, AutoChoosesWhatTheBuildAndMachineHave) {
  const BackendDefault d = default_backend();
  const Options o = parse({"--target", "T", "--data", "D.h5", "--out", "O"}).options;
  EXPECT_EQ(o.backend, d.device);
  EXPECT_EQ(resolved(o, "backend"), device_name(d.device));  // the record holds the backend chosen, never "auto"
  EXPECT_NE(backend_line(o).find("chosen by --backend auto: " + d.why), std::string::npos) << backend_line(o);
  if (cuda_device_count() == 0) {  // CI: no GPU, so the CPU-only tests run cpu
    EXPECT_EQ(d.device, Device::CPU);
    EXPECT_NE(d.why.find(" no "), std::string::npos) << d.why;
  }
  // Given: as given, whatever the machine.
  const Options c = parse({"--target", "T", "--data", "D.h5", "--out", "O", "--backend", "cpu"}).options;
  EXPECT_EQ(c.backend, Device::CPU);
  EXPECT_EQ(backend_line(c), "[dflash] backend: cpu (as given)");
  // A dry run naming the GPU it plans for plans the CUDA job.
  const Options g = parse({"--target", "T", "--data", "D.h5", "--out", "O", "--dry-run", "--gpu", "h100"}).options;
  EXPECT_EQ(g.backend, Device::CUDA);
  EXPECT_NE(backend_line(g).find("--gpu names the GPU this dry run plans for"), std::string::npos);
  EXPECT_EXIT(parse({"--target", "T", "--data", "D.h5", "--out", "O", "--backend", "gpu"}), testing::ExitedWithCode(2),
              "bad value gpu for --backend");
}
