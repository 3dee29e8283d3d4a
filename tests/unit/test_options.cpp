// dflash-train's command line: defaults, --config precedence, and the errors (exit 2 / 3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "dflash/backend.h"  // default_backend
#include "dflash/options.h"
#include "runtime/job.h"  // segment_record
#include "runtime/run_plan.h"  // grad_accum_of, grad_accum_line

using namespace dflash;

namespace {

ParseResult parse(std::vector<std::string> args) {
  std::vector<const char*> argv{"dflash-train"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

const std::vector<std::string> kRequired{"--target", "T", "--data", "D.h5", "--out", "O"};

std::vector<std::string> with_required(std::vector<std::string> extra) {
  std::vector<std::string> a = kRequired;
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::string resolved(const Options& o, const std::string& name) {
  for (const auto& [k, v] : o.resolved)
    if (k == name) return v;
  return "<missing>";
}

}  // namespace

TEST(Options, DefaultsAndValues) {
  Options o = parse(with_required({"--topology", "6-2", "--lr", "1e-3", "--loss", "kl", "--dpace", "--hs-queue-depth", "8",
                                   "--long-record", "skip", "--export-dtype", "bf16"}))
                  .options;
  EXPECT_EQ(o.topology.targets_per_node, 6);
  EXPECT_EQ(o.topology.drafters_per_node, 2);
  EXPECT_FLOAT_EQ(o.train.lr, 1e-3f);
  EXPECT_EQ(o.train.loss, LossKind::KL);
  EXPECT_TRUE(o.train.dpace);
  EXPECT_EQ(o.hs_queue_depth, 8);
  EXPECT_EQ(o.long_record, LongRecordPolicy::Skip);
  EXPECT_EQ(o.export_dtype, DType::BF16);
  EXPECT_EQ(o.token_budget, 32768);
  EXPECT_EQ(o.long_record == LongRecordPolicy::Skip, true);
  EXPECT_DOUBLE_EQ(o.peer_timeout_s, 120.0);
  EXPECT_EQ(resolved(o, "topology"), "6-2");
  EXPECT_EQ(resolved(o, "hs-queue-depth"), "8");
  EXPECT_EQ(resolved(o, "dpace"), "true");
  EXPECT_NE(o.to_json().find("\"topology\":\"6-2\""), std::string::npos);
}

// --anchors-per-record: off by default (the per-batch cap alone); given without --max-anchors the cap is the
// reference's density over --token-budget (default_max_anchors), and the resolved options say so.
TEST(Options, AnchorsPerRecordAndTheDefaultCap) {
  Options o = parse(with_required({})).options;
  EXPECT_EQ(o.train.anchors_per_record, 0);
  EXPECT_EQ(o.train.max_anchors, 512);
  o = parse(with_required({"--anchors-per-record", "512"})).options;  // 32768 tokens: 11 sequences of 3072
  EXPECT_EQ(o.train.anchors_per_record, 512);
  EXPECT_EQ(o.train.max_anchors, 512 * 11);
  EXPECT_EQ(resolved(o, "max-anchors"), "5632");
  EXPECT_EQ(resolved(o, "anchors-per-record"), "512");
  o = parse(with_required({"--anchors-per-record", "512", "--token-budget", "16384"})).options;
  EXPECT_EQ(o.train.max_anchors, 3072);
  o = parse(with_required({"--anchors-per-record", "512", "--max-anchors", "1000"})).options;  // given: kept
  EXPECT_EQ(o.train.max_anchors, 1000);
  EXPECT_EQ(resolved(o, "max-anchors"), "1000");
}

// The optimizer follows the reference recipe by default (SpecForge's BF16Optimizer: torch.optim.AdamW's
// betas and eps, no weight decay, cosine to 0; docs/recipe.md), and every setting can be overridden.
TEST(Options, OptimizerDefaultsAreTheReferenceRecipe) {
  const Options d = parse(kRequired).options;
  EXPECT_FLOAT_EQ(d.train.beta1, 0.9f);
  EXPECT_FLOAT_EQ(d.train.beta2, 0.999f);
  EXPECT_FLOAT_EQ(d.train.eps, 1e-8f);
  EXPECT_FLOAT_EQ(d.train.weight_decay, 0.0f);
  EXPECT_FLOAT_EQ(d.train.min_lr_ratio, 0.0f);
  EXPECT_FLOAT_EQ(d.train.clip, 1.0f);
  // The parser's defaults are the library's: a trainer built without the command line trains the same.
  const TrainOptions lib;
  EXPECT_EQ(d.train.beta1, lib.beta1);
  EXPECT_EQ(d.train.beta2, lib.beta2);
  EXPECT_EQ(d.train.eps, lib.eps);
  EXPECT_EQ(d.train.weight_decay, lib.weight_decay);
  EXPECT_EQ(d.train.min_lr_ratio, lib.min_lr_ratio);
  const Options o = parse(with_required({"--adam-beta1", "0.8", "--adam-beta2", "0.95", "--adam-eps", "1e-6",
                                         "--weight-decay", "0.01", "--min-lr-ratio", "0.1"}))
                        .options;
  EXPECT_FLOAT_EQ(o.train.beta1, 0.8f);
  EXPECT_FLOAT_EQ(o.train.beta2, 0.95f);
  EXPECT_FLOAT_EQ(o.train.eps, 1e-6f);
  EXPECT_FLOAT_EQ(o.train.weight_decay, 0.01f);
  EXPECT_FLOAT_EQ(o.train.min_lr_ratio, 0.1f);
  EXPECT_EQ(resolved(o, "adam-beta2"), "0.95");
  EXPECT_EQ(resolved(d, "weight-decay"), "0");
}

// --optimizer-state: fp32 by default (the library's default too), bf16 on request, anything else refused; the
// startup line only in bf16 mode, with the bytes per parameter of the backend.
TEST(Options, OptimizerState) {
  const Options d = parse(kRequired).options;
  EXPECT_EQ(d.train.optimizer_state, OptimizerState::Fp32);
  EXPECT_EQ(d.train.optimizer_state, TrainOptions{}.optimizer_state);
  EXPECT_EQ(resolved(d, "optimizer-state"), "fp32");
  EXPECT_EQ(optimizer_state_line(d), "");
  const Options b = parse(with_required({"--optimizer-state", "bf16", "--backend", "cuda"})).options;
  EXPECT_EQ(b.train.optimizer_state, OptimizerState::Bf16);
  EXPECT_EQ(resolved(b, "optimizer-state"), "bf16");
  EXPECT_NE(optimizer_state_line(b).find("stochastic rounding (10 B/param with the fp32 gradients, 8 B/param less "
                                         "than fp32's 18)"),
            std::string::npos)
      << optimizer_state_line(b);
  const Options c = parse(with_required({"--optimizer-state", "bf16"})).options;
  EXPECT_NE(optimizer_state_line(c).find("fp32 storage holding bf16 values"), std::string::npos);
  EXPECT_EXIT(parse(with_required({"--optimizer-state", "fp16"})), testing::ExitedWithCode(2),
              "bad value fp16 for --optimizer-state");
}

// to_json (metrics.h5's options attribute and its typed /options group) keeps the parser's types.
TEST(Options, ToJsonKeepsTheTypes) {
  const Options o = parse(with_required({"--lr", "1e-3", "--dpace", "--hs-queue-depth", "8", "--max-steps", "50"})).options;
  const std::string j = o.to_json();
  for (const char* want : {"\"hs-queue-depth\":8", "\"max-steps\":50", "\"dpace\":true", "\"export-checkpoints\":false",
                           "\"topology\":\"1-1\"", "\"lr\":0.001"})
    EXPECT_NE(j.find(want), std::string::npos) << want << " in " << j;
  EXPECT_EQ(o.resolved_kind.at("lr"), Options::ValueKind::Real);
  EXPECT_EQ(o.resolved_kind.count("topology"), 0u);  // a text
}

TEST(Options, CommandLineOverridesConfigFile) {
  const std::string path = testing::TempDir() + "/dflash_opts.cfg";
  {
    std::ofstream f(path);
    f << "# a job file\nlr = 0.01\ntopology = 3-1\ntarget = from_file\ndata = D.h5\nout = O\nhs-queue-depth = 2\n";
  }
  Options o = parse({"--config", path, "--lr", "0.002", "--topology", "2-2"}).options;
  EXPECT_FLOAT_EQ(o.train.lr, 0.002f);
  EXPECT_EQ(o.topology.to_string(), "2-2");
  EXPECT_EQ(o.target_dir, "from_file");  // required option given only in the file
  EXPECT_EQ(o.hs_queue_depth, 2);
  std::remove(path.c_str());
}

TEST(Options, Help) {
  ParseResult r = parse({"--help"});
  EXPECT_TRUE(r.help_requested);
  EXPECT_NE(r.help_text.find("--topology"), std::string::npos);
  EXPECT_NE(r.help_text.find("--peer-timeout"), std::string::npos);
}

// The struct's initialisers are the defaults: a job without flags gets what Options{} holds (the command line
// once said bf16 for --export-dtype while the struct said f32).
TEST(Options, DefaultsAreTheStructs) {
  const Options d = parse(kRequired).options, s;
  EXPECT_EQ(d.export_dtype, DType::BF16);
  EXPECT_EQ(d.export_dtype, s.export_dtype);
  EXPECT_EQ(d.token_budget, s.token_budget);
  EXPECT_EQ(d.backend, default_backend().device);  // --backend auto: the struct's cpu only where no GPU is usable
  EXPECT_EQ(d.long_record, s.long_record);
  EXPECT_EQ(d.train.lr, s.train.lr);
  EXPECT_EQ(d.train.seed, s.train.seed);
  EXPECT_EQ(d.eval_max_tokens, s.eval_max_tokens);
  EXPECT_EQ(resolved(d, "export-dtype"), "bf16");
}

TEST(Options, HelpOpensWithAFirstJobAndGroupsDFlash2) {
  const std::string h = parse({"--help"}).help_text;
  const size_t first = h.find("Start here"), dflash2 = h.find("DFlash2 drafters");
  ASSERT_NE(first, std::string::npos) << h;
  ASSERT_NE(dflash2, std::string::npos) << h;
  EXPECT_LT(first, h.find("  --target DIR"));  // (not the usage line above)
  EXPECT_LT(h.find("--resume"), h.find("--draft-layers"));  // the first block comes before the rest
  for (const char* n : {"--conv-kernel-size", "--selector-top-k", "--selector-loss-alpha", "--selector-stop-gradient"})
    EXPECT_GT(h.find(n), dflash2) << n;
  EXPECT_EQ(h.find("help-markdown"), std::string::npos);  // hidden
  const std::string md = parse({"--help-markdown"}).help_text;
  EXPECT_NE(md.find("| `--export-dtype DTYPE` | bf16 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| `--lr LR` | 6e-4 |"), std::string::npos) << md;
}

TEST(Options, HelpShowsPlaceholdersAndReadableDefaultsButNoTestHooks) {
  const std::string h = parse({"--help"}).help_text;
  EXPECT_NE(h.find("--target DIR"), std::string::npos) << h;
  EXPECT_NE(h.find("--max-steps N (=0)"), std::string::npos) << h;
  EXPECT_NE(h.find("--topology T-D (=1-1)"), std::string::npos) << h;
  EXPECT_NE(h.find("--lr LR (=6e-4)"), std::string::npos) << h;  // not 0.000600000028
  EXPECT_EQ(h.find(" arg"), std::string::npos) << h;             // every value has a placeholder
  EXPECT_EQ(h.find("inject-fail"), std::string::npos) << h;      // test hooks only in --help-all
  EXPECT_NE(h.find("--dry-run"), std::string::npos) << h;
  const ParseResult all = parse({"--help-all"});
  EXPECT_TRUE(all.help_requested);
  EXPECT_NE(all.help_text.find("--inject-fail-rank RANK"), std::string::npos) << all.help_text;
  // The hooks still parse without being shown.
  EXPECT_EQ(parse(with_required({"--inject-delay-target-ms", "5"})).options.inject_delay_target_ms, 5);
}

TEST(Options, Version) {
  const ParseResult r = parse({"--version"});
  EXPECT_TRUE(r.help_requested);
  EXPECT_EQ(r.help_text, std::string("dflash-train ") + DFLASH_VERSION + "\n");
}

TEST(Options, RepeatedOptionLastWins) {
  // A job script passes its defaults first and "$@" after them: sbatch train-1node.sbatch --topology 6-1.
  Options o = parse(with_required({"--topology", "7-1", "--lr", "1e-3", "--topology", "6-1", "--lr", "2e-3"})).options;
  EXPECT_EQ(o.topology.to_string(), "6-1");
  EXPECT_FLOAT_EQ(o.train.lr, 2e-3f);
  EXPECT_EQ(resolved(o, "topology"), "6-1");
  // Switches may repeat too; in a --config file the last line wins, and the command line still beats it.
  const std::string path = testing::TempDir() + "/dflash_opts_twice.cfg";
  {
    std::ofstream f(path);
    f << "hs-queue-depth = 2\nhs-queue-depth = 3\nlr = 0.5\n";
  }
  o = parse(with_required({"--dpace", "--dpace", "--config", path, "--lr", "0.25"})).options;
  EXPECT_TRUE(o.train.dpace);
  EXPECT_EQ(o.hs_queue_depth, 3);
  EXPECT_FLOAT_EQ(o.train.lr, 0.25f);
  std::remove(path.c_str());
}

TEST(Options, CommandLineIsKeptShellQuoted) {
  const Options o = parse(with_required({"--out", "my run", "--seed", "7"})).options;  // the later --out wins
  EXPECT_EQ(o.command_line, "dflash-train --target T --data D.h5 --out O --out 'my run' --seed 7");
  EXPECT_EQ(o.out_dir, "my run");
}

TEST(Options, RepeatedDataIsAMixOfWeightedFiles) {
  // --data is not last-wins: every one is kept, each with its weight, and recorded as the list.
  Options o = parse({"--target", "T", "--out", "O", "--data", "a.h5:0.7", "--data", "b.h5:0.3"}).options;
  ASSERT_EQ(o.data.size(), 2u);
  EXPECT_EQ(o.data[0].path, "a.h5");
  EXPECT_DOUBLE_EQ(o.data[0].weight, 0.7);
  EXPECT_EQ(o.data[1].path, "b.h5");
  EXPECT_DOUBLE_EQ(o.data[1].weight, 0.3);
  EXPECT_EQ(resolved(o, "data"), "a.h5:0.7,b.h5:0.3");
  // One file: its path, as checkpoints made before mixes recorded it.
  o = parse(with_required({})).options;
  ASSERT_EQ(o.data.size(), 1u);
  EXPECT_EQ(resolved(o, "data"), "D.h5");
  // In a --config file too; the command line's --data list beats the file's.
  const std::string path = testing::TempDir() + "/dflash_opts_mix.cfg";
  {
    std::ofstream f(path);
    f << "target = T\nout = O\ndata = a.h5:1\ndata = b.h5:3\n";
  }
  o = parse({"--config", path}).options;
  EXPECT_EQ(resolved(o, "data"), "a.h5:1,b.h5:3");
  o = parse({"--config", path, "--data", "c.h5"}).options;
  EXPECT_EQ(resolved(o, "data"), "c.h5");
  std::remove(path.c_str());
}

TEST(OptionsDeath, RepeatedDataWithoutWeightsIsRefused) {
  // It used to keep the last file without a word.
  EXPECT_EXIT(parse(with_required({"--data", "E.h5"})), testing::ExitedWithCode(2),
              "--data is given 2 times, and D.h5, E.h5 without a weight");
  EXPECT_EXIT(parse(with_required({"--data", "E.h5:0.5"})), testing::ExitedWithCode(2), "D.h5 without a weight");
  EXPECT_EXIT(parse({"--target", "T", "--out", "O", "--data", "a.h5:0"}), testing::ExitedWithCode(2),
              "the weight 0 is not a number > 0");
}

TEST(Options, DryRunIsAnOption) {
  EXPECT_FALSE(parse(with_required({})).options.dry_run);
  EXPECT_TRUE(parse(with_required({"--dry-run"})).options.dry_run);
}

TEST(Options, EvalMaxTokensIsAutoOrACount) {
  const Options a = parse(with_required({"--eval-data", "E.h5"})).options;
  EXPECT_EQ(a.eval_max_tokens, 0);  // auto
  EXPECT_EQ(resolved(a, "eval-max-tokens"), "auto");
  const Options n = parse(with_required({"--eval-data", "E.h5", "--eval-max-tokens", "20000"})).options;
  EXPECT_EQ(n.eval_max_tokens, 20000);
  EXPECT_EQ(resolved(n, "eval-max-tokens"), "20000");
}
TEST(OptionsDeath, EvalMaxTokens) {
  EXPECT_EXIT(parse(with_required({"--eval-data", "E.h5", "--eval-max-tokens", "0"})), testing::ExitedWithCode(2),
              "--eval-max-tokens must be auto or a whole number >= 1");
  EXPECT_EXIT(parse(with_required({"--eval-data", "E.h5", "--eval-max-tokens", "lots"})), testing::ExitedWithCode(2),
              "--eval-max-tokens must be auto");
  EXPECT_EXIT(parse(with_required({"--eval-max-tokens", "100"})), testing::ExitedWithCode(2),
              "--eval-max-tokens without --eval-data");
}

TEST(Options, DryRunPlansItsOwnWorld) {
  const Options a = parse(with_required({"--dry-run", "--ranks", "8"})).options;
  EXPECT_EQ(a.plan_ranks, 8);
  EXPECT_EQ(a.plan_nodes, 1);
  EXPECT_EQ(a.plan_ranks_per_node, 8);
  const Options b = parse(with_required({"--dry-run", "--nodes", "2", "--gpus-per-node", "4", "--backend", "cuda", "--gpu", "h200"})).options;
  EXPECT_EQ(b.plan_ranks, 8);
  EXPECT_EQ(b.plan_ranks_per_node, 4);
  EXPECT_EQ(b.plan_gpu, "h200");
  EXPECT_EQ(parse(with_required({"--dry-run", "--ranks", "16", "--nodes", "2"})).options.plan_ranks_per_node, 8);
  EXPECT_EQ(parse(with_required({"--dry-run"})).options.plan_ranks, 0);  // the MPI world
}
TEST(OptionsDeath, DryRunWorldFlags) {
  EXPECT_EXIT(parse(with_required({"--ranks", "8"})), testing::ExitedWithCode(2), "plan a --dry-run's world");
  EXPECT_EXIT(parse(with_required({"--backend", "cuda", "--gpu", "h200"})), testing::ExitedWithCode(2),
              "--gpu names the GPU a --dry-run or --topology plan plans for");
  EXPECT_EXIT(parse(with_required({"--dry-run", "--backend", "cpu", "--gpu", "h200"})), testing::ExitedWithCode(2),
              "--gpu h200 with --backend cpu");
  EXPECT_EXIT(parse(with_required({"--dry-run", "--backend", "cuda", "--gpu", "v100"})), testing::ExitedWithCode(2),
              "unknown --gpu 'v100'");
  EXPECT_EXIT(parse(with_required({"--dry-run", "--nodes", "2"})), testing::ExitedWithCode(2), "--nodes 2 without the ranks on each");
  EXPECT_EXIT(parse(with_required({"--dry-run", "--ranks", "7", "--nodes", "2"})), testing::ExitedWithCode(2),
              "--ranks 7 does not split evenly over --nodes 2");
  EXPECT_EXIT(parse(with_required({"--dry-run", "--ranks", "8", "--nodes", "2", "--gpus-per-node", "3"})),
              testing::ExitedWithCode(2), "--ranks 8 is not --nodes 2 x --gpus-per-node 3");
  EXPECT_EXIT(parse(with_required({"--dry-run", "--ranks", "0"})), testing::ExitedWithCode(2), "--ranks must be in");
}

TEST(OptionsDeath, UnknownFlag) {
  EXPECT_EXIT(parse(with_required({"--no-such-flag", "1"})), testing::ExitedWithCode(2), "no-such-flag");
}
TEST(OptionsDeath, MistypedFlagNamesTheNearestOption) {
  EXPECT_EXIT(parse(with_required({"--topolgy", "1-1"})), testing::ExitedWithCode(2),
              "unrecognised option '--topolgy'; did you mean --topology\\?");
  EXPECT_EXIT(parse(with_required({"--wramup-steps=5"})), testing::ExitedWithCode(2), "did you mean --warmup-steps\\?");
  // Boost no longer takes a prefix for the whole name: --max-anchor was quietly --max-anchors.
  EXPECT_EXIT(parse(with_required({"--max-anchor", "64"})), testing::ExitedWithCode(2),
              "unrecognised option '--max-anchor'; did you mean --max-anchors\\?");
  EXPECT_EXIT(parse(with_required({"--eval-tau-max", "64"})), testing::ExitedWithCode(2),
              "did you mean --eval-tau-max-new-tokens\\?");
  EXPECT_EXIT(parse(with_required({"--eval", "1"})), testing::ExitedWithCode(2), "unrecognised option '--eval'\n");
  // Nothing close: no guess.
  EXPECT_EXIT(parse(with_required({"--frobnicate", "3"})), testing::ExitedWithCode(2),
              "unrecognised option '--frobnicate'\n");
}
TEST(OptionsDeath, StrayPositionalArgument) {
  // Boost drops positional tokens silently: "30 m" was 30 steps, "--dpace yes" a plain --dpace.
  EXPECT_EXIT(parse(with_required({"--checkpoint-every", "30", "m"})), testing::ExitedWithCode(2),
              "unexpected argument 'm'");
  EXPECT_EXIT(parse(with_required({"--dpace", "yes"})), testing::ExitedWithCode(2), "unexpected argument 'yes'");
}
TEST(OptionsDeath, AnchorCountsAreBoundedBeforeAnythingIsSized) {
  EXPECT_EXIT(parse(with_required({"--max-anchors", "2000000000"})), testing::ExitedWithCode(2),
              "--max-anchors must be in \\[1, 1048576\\]");
  EXPECT_EXIT(parse(with_required({"--anchors-per-record", "2000000000"})), testing::ExitedWithCode(2),
              "--anchors-per-record must be in");
}
TEST(OptionsDeath, BadNumber) {
  EXPECT_EXIT(parse(with_required({"--lr", "fast"})), testing::ExitedWithCode(2), "lr");
}
TEST(OptionsDeath, BadTopology) {
  EXPECT_EXIT(parse(with_required({"--topology", "2x1"})), testing::ExitedWithCode(2), "bad --topology '2x1'");
}
TEST(OptionsDeath, BadEnum) {
  EXPECT_EXIT(parse(with_required({"--loss", "mse"})), testing::ExitedWithCode(2), "--loss");
  EXPECT_EXIT(parse(with_required({"--long-record", "truncate"})), testing::ExitedWithCode(2), "--long-record");
}
TEST(OptionsDeath, OutOfRange) {
  EXPECT_EXIT(parse(with_required({"--hs-queue-depth", "0"})), testing::ExitedWithCode(2), "hs-queue-depth");
  EXPECT_EXIT(parse(with_required({"--peer-timeout", "-1"})), testing::ExitedWithCode(2), "peer-timeout");
}
TEST(OptionsDeath, OptimizerOutOfRange) {
  EXPECT_EXIT(parse(with_required({"--adam-beta2", "1"})), testing::ExitedWithCode(2), "adam-beta2");
  EXPECT_EXIT(parse(with_required({"--adam-beta1", "-0.1"})), testing::ExitedWithCode(2), "adam-beta1");
  EXPECT_EXIT(parse(with_required({"--adam-eps", "0"})), testing::ExitedWithCode(2), "adam-eps");
  EXPECT_EXIT(parse(with_required({"--weight-decay", "-1"})), testing::ExitedWithCode(2), "weight-decay");
  EXPECT_EXIT(parse(with_required({"--min-lr-ratio", "1.5"})), testing::ExitedWithCode(2), "min-lr-ratio");
}
TEST(OptionsDeath, MissingRequired) {
  EXPECT_EXIT(parse({"--topology", "1-1"}), testing::ExitedWithCode(2), "--target, --data and --out are required");
}
TEST(OptionsDeath, ForeverNeedsMaxSteps) {
  EXPECT_EXIT(parse(with_required({"--epochs", "0"})), testing::ExitedWithCode(2), "never ends");
}
TEST(OptionsDeath, FailHookNeedsBoth) {
  EXPECT_EXIT(parse(with_required({"--inject-fail-rank", "1"})), testing::ExitedWithCode(2), "go together");
}
TEST(OptionsDeath, UnreadableConfig) {
  EXPECT_EXIT(parse({"--config", "/nonexistent/x.cfg"}), testing::ExitedWithCode(2), "cannot read --config");
}
TEST(OptionsDeath, MissingInputs) {
  Options o = parse(with_required({})).options;
  o.target_dir = "/nonexistent/target";
  EXPECT_EXIT(check_input_paths(o), testing::ExitedWithCode(3), "no config.json there");
}
TEST(Options, DataPlane) {
  EXPECT_EQ(parse(with_required({})).options.data_plane, DataPlaneChoice::Auto);
  const Options o = parse(with_required({"--backend", "cuda", "--data-plane", "cuda-mpi"})).options;
  EXPECT_EQ(o.data_plane, DataPlaneChoice::CudaMpi);
  EXPECT_EQ(resolved(o, "data-plane"), "cuda-mpi");
  EXPECT_EQ(parse(with_required({"--data-plane", "host"})).options.data_plane, DataPlaneChoice::Host);
}
TEST(OptionsDeath, DataPlane) {
  EXPECT_EXIT(parse(with_required({"--data-plane", "rdma"})), testing::ExitedWithCode(2), "--data-plane");
  // The CPU backend's tensors are host memory: a device plane makes no sense there.
  EXPECT_EXIT(parse(with_required({"--backend", "cpu", "--data-plane", "nccl"})), testing::ExitedWithCode(2), "the CPU backend has none");
}
TEST(OptionsDeath, SeedMustBeANonNegativeWholeNumber) {
  // An unsigned parse would wrap "-1" to 2^64-1 and train on a seed nobody asked for.
  EXPECT_EXIT(parse(with_required({"--seed", "-1"})), testing::ExitedWithCode(2), "bad value -1 for --seed");
  EXPECT_EXIT(parse(with_required({"--seed", "1.5"})), testing::ExitedWithCode(2), "--seed");
  EXPECT_EXIT(parse(with_required({"--seed", "9223372036854775808"})), testing::ExitedWithCode(2), "--seed");
  EXPECT_EQ(parse(with_required({"--seed", "9223372036854775807"})).options.train.seed, 9223372036854775807ull);
  EXPECT_EQ(resolved(parse(with_required({"--seed", "42"})).options, "seed"), "42");
}

// --grad-accum / --global-batch-tokens: one of them; K resolved from the drafters and recorded as --grad-accum.
TEST(Options, GlobalBatchTokensResolvesGradAccum) {
  const Options o = parse(with_required({"--token-budget", "32768", "--global-batch-tokens", "98304"})).options;
  EXPECT_EQ(o.grad_accum, 1);  // as typed: the segment resolves K (run_plan.h)
  EXPECT_EQ(grad_accum_of(o, 2), 2);
  const std::string line = grad_accum_line(o, grad_accum_of(o, 2), 2);
  EXPECT_NE(line.find("2 micro-batch(es) per optimizer step x 2 drafter(s) x <= 32768 tokens = <= 131072 tokens"),
            std::string::npos) << line;
  SegmentStart seg;
  seg.split = o.topology;
  const auto record = segment_record(o, seg, grad_accum_of(o, 2));
  const auto k_recorded = std::find_if(record.begin(), record.end(), [](const auto& kv) { return kv.first == "grad-accum"; });
  ASSERT_NE(k_recorded, record.end());
  EXPECT_EQ(k_recorded->second, "2");
  EXPECT_EQ(resolved(o, "grad-accum"), "1");  // Options itself is never written after parsing
  const Options k = parse(with_required({"--grad-accum", "3"})).options;
  EXPECT_EQ(grad_accum_of(k, 4), 3);
  EXPECT_NE(grad_accum_line(k, grad_accum_of(k, 4), 4).find("(--grad-accum 3)"), std::string::npos);
}
TEST(OptionsDeath, GradAccumAndGlobalBatchTokensExclusive) {
  EXPECT_EXIT(parse(with_required({"--grad-accum", "2", "--global-batch-tokens", "1000"})), testing::ExitedWithCode(2),
              "--grad-accum and --global-batch-tokens both set");
  EXPECT_EXIT(parse(with_required({"--grad-accum", "0"})), testing::ExitedWithCode(2), "grad-accum");
  // bounded as the K --global-batch-tokens derives is (issue 48: 2147483647 was accepted)
  EXPECT_EXIT(parse(with_required({"--grad-accum", "2147483647"})), testing::ExitedWithCode(2), "grad-accum.*in \\[1, 1048576\\]");
  EXPECT_EQ(parse(with_required({"--grad-accum", "1048576"})).options.grad_accum, 1048576);
}
