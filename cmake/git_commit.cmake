# Writes OUT = '#define DFLASH_GIT_COMMIT "<commit>[-dirty]"' for the source tree SRC (metrics.h5's git_commit
# attribute), run at every build by the dflash_git_commit target. The file is rewritten only when the text
# changes, so a build without a new commit recompiles nothing. Outside a git checkout: "unknown".
execute_process(COMMAND git -C "${SRC}" rev-parse HEAD OUTPUT_VARIABLE commit
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR "${commit}" STREQUAL "")
  set(commit "unknown")
else()
  execute_process(COMMAND git -C "${SRC}" diff --quiet HEAD -- RESULT_VARIABLE dirty ERROR_QUIET OUTPUT_QUIET)
  if(dirty EQUAL 1)
    string(APPEND commit "-dirty")  # built with uncommitted changes
  endif()
endif()
set(text "#define DFLASH_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE "${OUT}" "${text}")
endif()
