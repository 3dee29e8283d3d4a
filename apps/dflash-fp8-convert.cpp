// dflash-fp8-convert: writes an FP8 copy of a bf16 target checkpoint in the format a serving team would
// download (docs/fp8.md), so CI and the benches run FP8 targets made from dflash-make-tiny / dflash-make-random:
//
//   dflash-fp8-convert SRC DST [--format block|channel] [--ignore PATTERN]...
//   --format block    transformers' fine-grained FP8 (Qwen's -FP8 releases): quant_method "fp8", e4m3 weights
//                     in 128x128 blocks with weight_scale_inv, dynamic activations per token in groups of 128,
//                     modules_to_not_convert = the --ignore patterns (substring, digits as '*').
//   --format channel  llm-compressor's compressed-tensors FP8-Dynamic: per-output-channel weight_scale [out, 1],
//                     dynamic per-token activations, ignore = ["lm_head"] + the --ignore entries (exact names
//                     or "re:" regular expressions).
// Every 2-D "*_proj.weight" of a decoder layer the config does not exclude is quantized (round to nearest
// even, the arithmetic of include/dflash/fp8.h; the writer is src/model/fp8_convert.cpp); every other tensor and
// file is copied as it is.
#include <cstdio>
#include <string>
#include <vector>

#include "dflash/error.h"
#include "dflash/fp8_convert.h"
#include "dflash/tool_args.h"
#include "dflash/version.h"

using namespace dflash;

namespace {

const char* const kUsage =
    "usage: dflash-fp8-convert SRC DST [--format block|channel] [--ignore PATTERN]...\n"
    "       dflash-fp8-convert --help | --version\n";

}  // namespace

int main(int argc, char** argv) {
  if (dflash::print_version_if_asked(argc, argv, "dflash-fp8-convert")) return 0;
  process_identity().role = "tool";
  std::vector<std::string> dirs, ignore;
  bool block = true;
  ToolArgs args(argc, argv, kUsage);
  while (args.next()) {
    if (args.help()) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (args.positional()) {
      dirs.push_back(args.arg());
    } else if (args.is("--format")) {
      const std::string v = args.value();
      DF_CHECK_HINT(v == "block" || v == "channel", BadOptions, "--format must be block or channel, got " << v, kUsage);
      block = v == "block";
    } else if (args.is("--ignore")) {
      ignore.push_back(args.value());
    } else {
      DF_FAIL(BadOptions, "unknown option " << args.arg(), kUsage);
    }
  }
  DF_CHECK_HINT(dirs.size() == 2, BadOptions, "need SRC and DST", kUsage);
  const Fp8ConvertResult r =
      write_fp8_checkpoint(dirs[0], dirs[1], block ? Fp8ConvertFormat::Block : Fp8ConvertFormat::Channel, ignore);
  std::printf("dflash-fp8-convert: %s -> %s (%s, %d linear projections in FP8)\n", dirs[0].c_str(), dirs[1].c_str(),
              checkpoint_fp8_name(r.quant.format), r.converted);
  return 0;
}
