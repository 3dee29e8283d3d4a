#!/usr/bin/env bash
# ctest entry (label slurm): the Slurm checkpoint/requeue cycle of run_slurm_test.sh against this build.
exec "$(dirname "$0")/run_slurm_test.sh" "${DFLASH_BIN:?set DFLASH_BIN to the build directory}"
