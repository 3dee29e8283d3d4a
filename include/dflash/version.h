// --version on every program: one line, "NAME VERSION" (DFLASH_VERSION, the project's version in
// CMakeLists.txt; dflash-report reads the same number).
#pragma once
#include <cstdio>
#include <cstring>

namespace dflash {

// Prints "NAME VERSION" and returns true when argv holds --version (the program then exits 0).
inline bool print_version_if_asked(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s %s\n", name, DFLASH_VERSION);
      return true;
    }
  }
  return false;
}

}  // namespace dflash
