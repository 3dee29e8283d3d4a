// The drafter part of dflash-selftest: losses, metrics, every gradient (CE and KL) and two AdamW steps
// of the DFlash drafter (DrafterTrainer on the selected backend) against golden.safetensors / case.json.
// The target's hidden states and final norm come from golden.safetensors, so this part does not depend
// on the target forward.
#include <filesystem>

#include "selftest/selftest.h"
#include "drafter/drafter_golden.h"

namespace dflash {

int selftest_drafter(const std::string& case_dir, const dflash::Ctx& ctx, SelftestReport& report) {
  if (!std::filesystem::exists(case_dir + "/drafter_init/config.json")) {
    report.note("drafter part: skipped (the case has no drafter_init/)");
    return 0;
  }
  const train::DrafterGoldenReport rep = train::run_drafter_golden(case_dir, ctx);
  if (ctx.device == Device::CPU)
    report.note("drafter: " + case_dir + "/drafter_init, anchors and settings from case.json; scalars to 1e-5, "
                "gradients and weights after two AdamW steps to 1e-4 (relative)");
  else
    report.note("drafter (CUDA, bf16): " + case_dir + "/drafter_init, anchors and settings from case.json; losses "
                "to 1e-2, gradient norms and all gradients to 3e-2, each gradient tensor to 6e-2, acc/agree/streak "
                "to 0.1 (relative; absolute where the reference is 0); weights after the AdamW steps not compared");
  for (const train::GoldenCheck& c : rep.checks) {
    Comparison row;
    row.name = "drafter." + c.name;
    row.shape = c.shape;
    row.max_abs_err = c.max_abs;
    row.rel_err = c.err;
    row.tolerance = c.tol;
    report.add(row);
  }
  return 0;
}

}  // namespace dflash
