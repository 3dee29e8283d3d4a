// dflash-selftest CASE_DIR [--backend cpu|cuda]: checks this build against a reference case.
// The work is in src/selftest/ (selftest.h describes the output).
#include "dflash/version.h"
#include "selftest/selftest.h"

int main(int argc, char** argv) {
  if (dflash::print_version_if_asked(argc, argv, "dflash-selftest")) return 0;
  return dflash::selftest_main(argc, argv);
}
