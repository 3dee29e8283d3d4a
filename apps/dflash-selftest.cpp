// dflash-selftest CASE_DIR [--backend cpu|cuda]: checks this build against a reference case.
// The work is in src/selftest/ (selftest.h describes the output).
#include "selftest/selftest.h"

int main(int argc, char** argv) { return dflash::selftest_main(argc, argv); }
